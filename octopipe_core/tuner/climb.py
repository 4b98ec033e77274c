"""The tuner's hill climb: phases, their moves, and the climber that accepts improvements.

One *iteration* tries one phase on the incumbent: the phase with the largest bubble it
targets (``diagnose.bubble_breakdown``) that is not exhausted; the best candidate is accepted
only if the simulator says it fits the cap and is faster (or, while nothing fits, overflows
less). Accepting a new layout reopens every phase; a failure marks the phase exhausted. On
large problems the first climb tries the placement phase before the partition phase when the
fill model says a layout switch gains clearly more than repartitioning (``layout_gains``):
there each partition move costs seconds, and the bubbles alone would spend most of the
budget on them first (nemotron-h-56b, 32 devices, 256 micro-batches: 20 of 30 s).

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> ev = Evaluator(Profile.from_dict(example_profile_dict()), 2, 4, 80.0)
>>> table, cands = peer_candidates(ev)
>>> "1f1b/uniform" in table and len(cands) > 0
True
"""

from __future__ import annotations

import random
import time
from typing import Any

from octopipe_core.fill_partition import fill_objective
from octopipe_core.peers import PeerTable, run_peers
from octopipe_core.plan import Plan
from octopipe_core.simulator import SimResult
from octopipe_core.tuner.diagnose import bubble_breakdown
from octopipe_core.tuner.evaluate import Candidate, Evaluator, Move, Phase, Proposal, better
from octopipe_core.tuner.moves_memory import at_cap, memory_fill_proposals, recompute_proposals
from octopipe_core.tuner.moves_partition import memory_partition_proposals, partition_proposals
from octopipe_core.tuner.moves_placement import placement_proposals, ranked_layouts
from octopipe_core.tuner.moves_schedule import (
    memory_repair_proposals,
    policy_proposals,
    schedule_proposals,
)
from octopipe_core.tuner.result import ProgressFn, TuneProgress

PHASES = (Phase.PARTITION, Phase.PLACEMENT, Phase.SCHEDULE)
ACCEPT_REL = 1e-7
LAYOUT_FIRST = 0.01  # placement before partition when a layout switch gains 1 % more ...
LAYOUT_FIRST_SIZE = 2048  # ... on problems this large (devices x micro-batches), where each
# partition move costs seconds; on small ones the bubbles' order costs little
FIRST_GAIN = 0.0  # > 0: accept the first move that cuts the step by this fraction


def peer_candidates(ev: Evaluator, chunks: int = 2) -> tuple[PeerTable, list[Candidate]]:
    """Every peer schedule with each partition: the peer table (``peers.run_peers``, simulated
    through the evaluator) and the candidates of the peers that could be built."""
    cands: list[Candidate] = []

    def evaluate(key: str, plan: Plan) -> SimResult | None:
        c = ev.from_order(plan.partition, plan.placement, plan.schedule, key)
        if c is None:
            return None
        cands.append(c)
        return c.result

    runs = run_peers(ev.profile, ev.devices, ev.microbatches, chunks, ev.cap_gib, evaluate)
    return PeerTable.of(runs, detail=False), cands


def phase_proposals(ev: Evaluator, phase: Phase, inc: Candidate) -> list[Proposal]:
    """The moves of one phase for the incumbent, most promising first."""
    tight = bool(at_cap(ev, inc))
    if phase is Phase.PARTITION:
        extra = memory_fill_proposals(ev, inc, Phase.PARTITION) if tight else []
        return partition_proposals(ev, inc) + extra
    if phase is Phase.PLACEMENT:
        return placement_proposals(ev, inc)
    if phase is Phase.SCHEDULE:
        return schedule_proposals(ev, inc) + (recompute_proposals(ev, inc) if tight else [])
    return (
        memory_repair_proposals(ev, inc)
        + policy_proposals(ev, inc, Phase.MEMORY)
        + memory_fill_proposals(ev, inc, Phase.MEMORY)
        + memory_partition_proposals(ev, inc)
        + recompute_proposals(ev, inc)
        + [p for p in placement_proposals(ev, inc) if p.move is Move.SWAP]
    )


def layout_gains(ev: Evaluator, inc: Candidate) -> tuple[float, float]:
    """What the fill model says the partition and placement phases can still gain (ms): the
    incumbent's need minus that of the fill-aware partition of its own placement, and minus
    that of the best layout of ``ranked_layouts`` (both 0 or more)."""
    part, place = inc.plan.partition, inc.plan.placement
    need = fill_objective(ev.fill, part, place)
    own = ev.fill_partition(place, start=part).objective_ms
    ranked = ranked_layouts(ev)
    best = ranked[0].objective_ms if ranked else need
    return max(0.0, need - (need if own is None else own)), max(0.0, need - best)


def rank_phases(inc: Candidate, gains: tuple[float, float] | None = None) -> list[Phase]:
    """Phases by the size of the bubble they target (memory first while over the cap). With
    ``gains`` (``layout_gains``), the placement phase goes before the partition phase when
    the fill model says a layout switch gains clearly more (``LAYOUT_FIRST`` of the step)
    than repartitioning."""
    b = bubble_breakdown(inc.result)
    score = {
        Phase.PARTITION: b["imbalance"],
        Phase.PLACEMENT: b["boundary"],
        Phase.SCHEDULE: b["interior"],
    }
    if gains is not None and gains[1] > gains[0] + LAYOUT_FIRST * inc.step_ms:
        score[Phase.PLACEMENT] = max(score[Phase.PLACEMENT], score[Phase.PARTITION] + gains[1])
    ranked = sorted(PHASES, key=lambda ph: (-score[ph], PHASES.index(ph)))
    return ([Phase.MEMORY] if not inc.fits else []) + ranked


class _State:
    """Iteration counter, history, best plan and progress reporting shared by the climbs of
    one tune. ``bound_ms`` is a lower bound on the step time: once the best plan that fits is
    within ``optimal_within`` of it, the plan is proven (near-)optimal and the search stops."""

    def __init__(
        self,
        ev: Evaluator,
        rng: random.Random,
        t0: float,
        progress: ProgressFn | None,
        max_iterations: int | None,
        bound_ms: float = 0.0,
        optimal_within: float = 0.0,
    ) -> None:
        self.ev, self.rng, self.t0 = ev, rng, t0
        self.progress, self.max_iterations = progress, max_iterations
        self.bound_ms, self.optimal_within = bound_ms, optimal_within
        self.it = 0
        self.history: list[dict[str, Any]] = []
        self.t_best = 0.0
        self.last_accept = 0.0
        self.best: Candidate | None = None
        self.climbed: list[Candidate] = []  # where each climb ended (for the runners-up)
        self.stop_requested = False
        self.proven = False

    @property
    def best_ms(self) -> float:
        return self.best.step_ms if self.best is not None else float("inf")

    def stopped(self) -> bool:
        if self.stop_requested or self.proven:
            return True
        return self.max_iterations is not None and self.it >= self.max_iterations

    def report(self, phase: str, cand: Candidate, move: str) -> None:
        if better(cand, self.best, ACCEPT_REL):
            self.best = cand
            self.t_best = time.perf_counter() - self.t0
            lim = self.bound_ms * (1 + self.optimal_within)
            if cand.fits and self.bound_ms > 0 and cand.step_ms <= lim:
                self.proven = True
        if self.progress is not None and self.best is not None:
            b = self.best
            el = time.perf_counter() - self.t0
            ev = TuneProgress(self.it, phase, b.step_ms, el, b.fits, move, b.plan, self.bound_ms)
            if self.progress(ev) is True:
                self.stop_requested = True

    def polish(self, inc: Candidate, patience: int) -> Candidate:
        """Randomized climbing from ``inc``: a random phase, a random move of it, kept if
        better; stops after ``patience`` moves in a row without a gain (or at the budget)."""
        ev, fails = self.ev, 0
        phases = [*PHASES, *([] if inc.fits else [Phase.MEMORY])]
        while fails < patience and not ev.out_of_time() and not self.stopped():
            phase = self.rng.choice(phases)
            props = phase_proposals(ev, phase, inc)
            if not props:
                fails += 1
                continue
            self.it += 1
            ev.bound_ms, ev.bound_fits = inc.step_ms, inc.fits
            cand = self.rng.choice(props).build()
            ev.bound_ms, ev.bound_fits = float("inf"), False
            if cand is not None and better(cand, inc, ACCEPT_REL):
                inc, fails = cand, 0
                self.last_accept = self.t_best = time.perf_counter() - self.t0
                self.history.append(
                    {"iteration": self.it, "phase": "polish", "move": cand.origin,
                     "step_time_ms": round(cand.step_ms, 6), "fits_memory": cand.fits,
                     "elapsed_s": round(self.last_accept, 3)}
                )  # fmt: skip
                self.report("polish", cand, cand.origin)
            else:
                fails += 1
        return inc

    def climb(
        self, inc: Candidate, switch_families: bool = True, first_gain: float | None = None
    ) -> Candidate:
        """Hill-climb from ``inc`` until every phase is exhausted or time runs out; restarts
        (``switch_families=False``) stay near their layout instead of jumping families. With
        ``first_gain`` (a fraction), a phase takes the first move that cuts the step by at
        least that much instead of trying all its moves (cheaper climbs from many starts)."""
        gain = FIRST_GAIN if first_gain is None else first_gain
        ev = self.ev
        exhausted: set[str] = set()
        layout_first = switch_families and ev.devices * ev.microbatches >= LAYOUT_FIRST_SIZE
        while not ev.out_of_time() and not self.stopped():
            gains = layout_gains(ev, inc) if layout_first else None
            todo = [ph for ph in rank_phases(inc, gains) if ph not in exhausted]
            if not todo:
                break
            phase = todo[0]
            self.it += 1
            props = phase_proposals(ev, phase, inc)
            if not switch_families:
                props = [p for p in props if p.move is not Move.SWITCH_FAMILY]
            if len(props) > 4:  # the seed only breaks ties among the less promising moves
                tail = props[4:]
                self.rng.shuffle(tail)
                props = props[:4] + tail
            best: Candidate | None = None
            inc_layout = (inc.plan.partition, inc.plan.placement)
            ev.bound_ms, ev.bound_fits = inc.step_ms, inc.fits
            for prop in props:
                if ev.out_of_time():
                    break
                cand = prop.build()
                if cand is not None and better(cand, inc, ACCEPT_REL) and better(cand, best):
                    best = cand
                    ev.bound_ms = cand.step_ms
                    if gain and inc.fits and best.step_ms < inc.step_ms * (1 - gain):
                        break  # a clear gain: take it now, the rest of the batch waits
            ev.bound_ms, ev.bound_fits = float("inf"), False
            if best is not None:
                inc = best
                # a new layout reopens every phase; a reorder only reopens the orders
                if (
                    phase is Phase.SCHEDULE
                    and best.plan.placement == inc_layout[1]
                    and (best.plan.partition == inc_layout[0])
                ):
                    exhausted.discard(Phase.MEMORY)
                else:
                    exhausted.clear()
                self.last_accept = time.perf_counter() - self.t0
                self.history.append(
                    {
                        "iteration": self.it,
                        "phase": phase,
                        "move": best.origin,
                        "step_time_ms": round(best.step_ms, 6),
                        "fits_memory": best.fits,
                        "elapsed_s": round(self.last_accept, 3),
                    }
                )
                self.report(phase, best, best.origin)
            else:
                exhausted.add(phase)
                self.report(phase, inc, "")
        return inc
