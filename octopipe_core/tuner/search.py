"""The bubble-aware iterative tuner: start from the best peer plan, fix the biggest bubble.

Loop (one *iteration* = one phase tried on the incumbent):

1. simulate the incumbent and split its gap to the lower bound (``diagnose.bubble_breakdown``)
   into imbalance (partition), start-up/drain idle (placement) and interior idle (schedule);
   a plan over the memory cap goes to the memory phase first;
2. try the moves of the phase with the largest bubble that has not been exhausted on this
   incumbent, best analytic candidates first;
3. accept the best candidate only if the simulator says it fits every device's cap and the step
   is faster (or, while nothing fits, if it overflows less); an acceptance that changes the
   layout makes every phase worth trying again (a reorder of the same layout does not reopen
   the partition and placement phases), a failure marks the phase exhausted.

After the climb from the best peer converges, the search restarts from the best other peers
and layout families (with other placements) and keeps the best plan of all climbs (an optional
seeded, randomized polish then tries random moves on it until a run of them brings nothing).
It stops when every climb has converged, at the time budget, or when the progress
callback returns True. For a given seed it is deterministic as long as it converges within the
budget (``max_iterations`` caps it independently of the clock).

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> prof = Profile.from_dict(example_profile_dict())
>>> res = tune(prof, devices=2, microbatches=4, time_budget_s=5)
>>> res.fits_memory and res.step_time_ms <= res.baselines["1f1b/uniform"]["step_time_ms"]
True
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from octopipe_core.bounds import Bounds, plan_bounds
from octopipe_core.errors import OctoPipeError
from octopipe_core.plan import Plan
from octopipe_core.profile import Profile
from octopipe_core.schedules import PARTITIONS, SCHEDULES, build_plan
from octopipe_core.simulator import SimResult
from octopipe_core.tuner.diagnose import bubble_breakdown, explain_gap
from octopipe_core.tuner.evaluate import Candidate, Evaluator, Proposal, better
from octopipe_core.tuner.layouts import FAMILIES, device_loads, family_partition, family_placement
from octopipe_core.tuner.list_scheduler import POLICIES, list_schedule
from octopipe_core.tuner.moves_partition import memory_partition_proposals, partition_proposals
from octopipe_core.tuner.moves_placement import family_of, family_proposals, placement_proposals
from octopipe_core.tuner.moves_schedule import (
    memory_repair_proposals,
    policy_proposals,
    schedule_proposals,
)

PHASES = ("partition", "placement", "schedule")
ACCEPT_REL = 1e-7
FIRST_GAIN = 0.0  # > 0: accept the first move that cuts the step by this fraction


class TuneProgress(NamedTuple):
    """What the progress callback receives after each iteration (``move`` is the accepted
    move, '' if the phase found none; ``plan`` the best plan so far: read it, do not modify
    it). A callback that returns True stops the search, which returns its best plan."""

    iteration: int
    phase: str
    best_step_time_ms: float
    elapsed_s: float
    fits_memory: bool
    move: str
    plan: Plan | None = None


ProgressFn = Callable[[TuneProgress], Any]


@dataclass
class TuneResult:
    """The tuned plan, its simulation, the peers it was compared with and how it was found."""

    plan: Plan
    result: SimResult
    memory_cap_gib: float
    iterations: int
    evaluations: int
    search_time_s: float
    time_to_best_s: float
    converged: bool
    start: str
    start_step_time_ms: float
    baselines: dict[str, dict[str, Any]]
    history: list[dict[str, Any]] = field(default_factory=list)
    shortfall: dict[str, Any] | None = None
    why: str = ""
    balance_ms: float = 0.0
    granularity_ms: float = 0.0
    bounds: Bounds | None = None

    @property
    def step_time_ms(self) -> float:
        return self.result.step_time_ms

    @property
    def lower_bound_ms(self) -> float:
        return self.result.lower_bound_ms

    @property
    def best_bound_ms(self) -> float:
        """The strongest lower bound that holds for every plan (``bounds.py``)."""
        return self.bounds.best_ms if self.bounds is not None else self.lower_bound_ms

    @property
    def gap_to_best_bound_pct(self) -> float:
        """How far the tuned step is above ``best_bound_ms``, in %."""
        b = self.best_bound_ms
        return 100.0 * (self.step_time_ms / b - 1.0) if b > 0 else 0.0

    @property
    def fits_memory(self) -> bool:
        return self.result.fits_memory

    @property
    def peak_memory_gib(self) -> list[float]:
        return self.result.peak_memory_gib

    def best_peer(self, fitting: bool = True) -> tuple[str, float] | None:
        """The fastest peer plan (that fits the cap when ``fitting``), as (key, step ms)."""
        ok = [
            (k, v["step_time_ms"])
            for k, v in self.baselines.items()
            if "error" not in v and (v["fits_memory"] or not fitting)
        ]
        return min(ok, key=lambda kv: kv[1]) if ok else None

    def speedup_over(self, key: str) -> float | None:
        """Peer step time / tuned step time (None if the peer could not be built)."""
        v = self.baselines.get(key, {})
        if "step_time_ms" not in v or self.step_time_ms <= 0:
            return None
        return v["step_time_ms"] / self.step_time_ms

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (the ``octopipe tune --json`` object, minus the plan path)."""
        bp = self.best_peer()
        return {
            "step_time_ms": round(self.step_time_ms, 6),
            "lower_bound_ms": round(self.lower_bound_ms, 6),
            "gap_to_bound": round(self.step_time_ms / self.lower_bound_ms - 1, 6)
            if self.lower_bound_ms > 0
            else None,
            "best_bound_ms": round(self.best_bound_ms, 6),
            "best_bound": self.bounds.best_name if self.bounds is not None else "total",
            "gap_to_best_bound_pct": round(self.gap_to_best_bound_pct, 4),
            "bounds": self.bounds.to_dict() if self.bounds is not None else None,
            "fits_memory": self.fits_memory,
            "memory_cap_gib": self.memory_cap_gib,
            "peak_memory_gib": [round(x, 4) for x in self.peak_memory_gib],
            "shortfall": self.shortfall,
            "search_time_s": round(self.search_time_s, 3),
            "time_to_best_s": round(self.time_to_best_s, 3),
            "iterations": self.iterations,
            "evaluations": self.evaluations,
            "converged": self.converged,
            "start": self.start,
            "start_step_time_ms": round(self.start_step_time_ms, 6),
            "best_peer": bp[0] if bp else None,
            "speedup_vs_1f1b_uniform": _r(self.speedup_over("1f1b/uniform")),
            "speedup_vs_best_peer": _r(bp[1] / self.step_time_ms) if bp else None,
            "why": self.why,
            "balance_found_ms": round(self.balance_ms, 6),
            "granularity_bound_ms": round(self.granularity_ms, 6),
            "stages": self.plan.num_stages,
            "partition": [list(r) for r in self.plan.partition],
            "placement": list(self.plan.placement),
            "history": self.history,
            "baselines": self.baselines,
        }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def peer_candidates(
    ev: Evaluator, chunks: int = 2
) -> tuple[dict[str, dict[str, Any]], list[Candidate]]:
    """Every peer schedule with each partition: the baselines table and their candidates."""
    table: dict[str, dict[str, Any]] = {}
    cands: list[Candidate] = []
    for sched in SCHEDULES:
        for part in PARTITIONS:
            key = f"{sched}/{part}"
            try:
                plan = build_plan(ev.profile, sched, ev.devices, ev.microbatches, chunks, part)
            except OctoPipeError as e:
                table[key] = {"error": str(e)}
                continue
            c = ev.from_order(plan.partition, plan.placement, plan.schedule, key)
            if c is None:
                table[key] = {"error": "deadlocks"}
                continue
            table[key] = {
                "step_time_ms": round(c.step_ms, 6),
                "fits_memory": c.fits,
                "peak_memory_gib": [round(x, 4) for x in c.peak_gib],
            }
            cands.append(c)
    return table, cands


def phase_proposals(ev: Evaluator, phase: str, inc: Candidate) -> list[Proposal]:
    """The moves of one phase for the incumbent, most promising first."""
    if phase == "partition":
        return partition_proposals(ev, inc)
    if phase == "placement":
        return placement_proposals(ev, inc)
    if phase == "schedule":
        return schedule_proposals(ev, inc)
    if phase == "memory":
        return (
            memory_repair_proposals(ev, inc)
            + policy_proposals(ev, inc, "memory")
            + memory_partition_proposals(ev, inc)
            + [p for p in placement_proposals(ev, inc) if "swap" in p.description]
        )
    raise ValueError(f"unknown phase {phase!r}")


def rank_phases(inc: Candidate) -> list[str]:
    """Phases by the size of the bubble they target (memory first while over the cap)."""
    b = bubble_breakdown(inc.result)
    score = {"partition": b["imbalance"], "placement": b["boundary"], "schedule": b["interior"]}
    ranked = sorted(PHASES, key=lambda ph: (-score[ph], PHASES.index(ph)))
    return (["memory"] if not inc.fits else []) + ranked


class _State:
    """Iteration counter, history and progress reporting shared by the climbs of one tune."""

    def __init__(
        self,
        ev: Evaluator,
        rng: random.Random,
        t0: float,
        progress: ProgressFn | None,
        max_iterations: int | None,
    ) -> None:
        self.ev, self.rng, self.t0 = ev, rng, t0
        self.progress, self.max_iterations = progress, max_iterations
        self.it = 0
        self.history: list[dict[str, Any]] = []
        self.t_best = 0.0
        self.last_accept = 0.0
        self.best: Candidate | None = None
        self.stop_requested = False

    @property
    def best_ms(self) -> float:
        return self.best.step_ms if self.best is not None else float("inf")

    def stopped(self) -> bool:
        if self.stop_requested:
            return True
        return self.max_iterations is not None and self.it >= self.max_iterations

    def report(self, phase: str, cand: Candidate, move: str) -> None:
        if better(cand, self.best, ACCEPT_REL):
            self.best = cand
        if self.progress is not None and self.best is not None:
            b = self.best
            el = time.perf_counter() - self.t0
            ev = TuneProgress(self.it, phase, b.step_ms, el, b.fits, move, b.plan)
            if self.progress(ev) is True:
                self.stop_requested = True

    def polish(self, inc: Candidate, patience: int) -> Candidate:
        """Randomized climbing from ``inc``: a random phase, a random move of it, kept if
        better; stops after ``patience`` moves in a row without a gain (or at the budget)."""
        ev, fails = self.ev, 0
        phases = [*PHASES, *([] if inc.fits else ["memory"])]
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

    def climb(self, inc: Candidate, switch_families: bool = True) -> Candidate:
        """Hill-climb from ``inc`` until every phase is exhausted or time runs out; restarts
        (``switch_families=False``) stay near their layout instead of jumping families."""
        ev = self.ev
        exhausted: set[str] = set()
        while not ev.out_of_time() and not self.stopped():
            todo = [ph for ph in rank_phases(inc) if ph not in exhausted]
            if not todo:
                break
            phase = todo[0]
            self.it += 1
            props = phase_proposals(ev, phase, inc)
            if not switch_families:
                props = [p for p in props if not p.description.startswith("switch to")]
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
                    if FIRST_GAIN and inc.fits and best.step_ms < inc.step_ms * (1 - FIRST_GAIN):
                        break  # a clear gain: take it now, the rest of the batch waits
            ev.bound_ms, ev.bound_fits = float("inf"), False
            if best is not None:
                inc = best
                # a new layout reopens every phase; a reorder only reopens the orders
                if (
                    phase == "schedule"
                    and best.plan.placement == inc_layout[1]
                    and (best.plan.partition == inc_layout[0])
                ):
                    exhausted.discard("memory")
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


def tune(
    profile: Profile,
    devices: int,
    microbatches: int,
    memory_gib: float | None = None,
    time_budget_s: float = 30.0,
    seed: int = 0,
    progress: ProgressFn | None = None,
    max_iterations: int | None = None,
    chunks: int = 2,
    restarts: int = 4,
    polish: int = 0,
) -> TuneResult:
    """Tune partition, placement and schedule together; see the module docstring.

    ``memory_gib`` is the per-device cap (default: the profile's device memory). After the
    climb from the best peer converges, up to ``restarts`` more climbs start from other peers
    and from list-scheduled layout families; with ``polish > 0`` a randomized polish then tries
    random moves on the best plan until ``polish`` of them in a row bring nothing (off by
    default: it rarely found more in our benchmarks). The best plan is returned.

    >>> from octopipe_core.profile import Profile, example_profile_dict
    >>> r = tune(Profile.from_dict(example_profile_dict()), 2, 4, time_budget_s=2)
    >>> r.plan.meta["memory_cap_gib"]
    80.0
    """
    if devices < 1 or microbatches < 1:
        raise OctoPipeError("tune: --devices and --microbatches must be >= 1; fix: use 1 or more")
    if profile.num_layers < devices:
        raise OctoPipeError(
            f"tune: {devices} devices but {profile.name} has {profile.num_layers} layers; "
            "fix: use fewer devices"
        )
    cap = float(profile.device.memory_gib if memory_gib is None else memory_gib)
    t0 = time.perf_counter()
    ev = Evaluator(profile, devices, microbatches, cap, deadline=t0 + time_budget_s)
    rng = random.Random(seed)
    baselines, peers = peer_candidates(ev, chunks)
    if not peers:  # e.g. fewer layers than any peer needs: start from a list-scheduled seq
        c = ev.from_policies([(i, i + 1) for i in range(devices)], list(range(devices)), "seq")
        if c is None:
            raise OctoPipeError("tune: no plan could be built; fix: check the profile")
        peers = [c]
    peers.sort(key=lambda c: c.key())
    best = peers[0]
    start, start_ms = best.origin, best.step_ms
    state = _State(ev, rng, t0, progress, max_iterations)
    state.report("start", best, start)
    # climb from the best peer; then restart from the best peers and layout families with
    # other placements (built once the first climb is done)
    best = state.climb(best, switch_families=True)
    state.t_best = state.last_accept
    others = list(peers[1:])
    for prop in family_proposals(ev, None):
        if ev.out_of_time():
            break
        c = prop.build()
        if c is not None:
            others.append(c)
    others.sort(key=lambda c: c.key())
    seen = {tuple(best.plan.placement), tuple(peers[0].plan.placement)}
    starts: list[Candidate] = []
    for c in others:
        if len(starts) >= (3 * restarts if devices * microbatches <= 16 else restarts):
            break  # small problems afford more restarts
        if c.fits >= best.fits and tuple(c.plan.placement) not in seen:
            seen.add(tuple(c.plan.placement))
            starts.append(c)
    for s0 in starts:
        if ev.out_of_time() or state.stopped():
            break
        state.history.append(
            {"iteration": state.it, "phase": "restart", "move": s0.origin,
             "step_time_ms": round(s0.step_ms, 6), "fits_memory": s0.fits,
             "elapsed_s": round(time.perf_counter() - t0, 3)}
        )  # fmt: skip
        state.report("restart", s0, f"restart from {s0.origin}")
        final = state.climb(s0, switch_families=False)
        if better(final, best, ACCEPT_REL):
            best = final
            state.t_best = state.last_accept
    if better(state.best, best, ACCEPT_REL):
        best = state.best
    converged = not ev.out_of_time() and not state.stopped()
    if converged and polish > 0:
        best = state.polish(best, polish)
    inc = best
    it, history, t_best = state.it, state.history, state.t_best
    search_time = time.perf_counter() - t0
    return _finish(ev, inc, baselines, history, it, search_time, t_best, converged, start, start_ms)


def balance_bound(ev: Evaluator, plan: Plan | None = None) -> float:
    """Smallest busiest-device compute (ms) among the device-balanced partitions of every
    layout family (and ``plan``): how close indivisible layers let the load get to the mean."""
    best = float("inf")
    layouts = []
    for fam in FAMILIES:
        place = family_placement(fam, ev.devices)
        if len(place) <= ev.profile.num_layers:
            layouts.append((family_partition(ev.weights, fam, ev.devices), place))
    if plan is not None:
        layouts.append((plan.partition, plan.placement))
    for part, place in layouts:
        best = min(best, max(device_loads(ev.weights, part, place, ev.devices)))
    return best * ev.microbatches


def _finish(
    ev: Evaluator,
    inc: Candidate,
    baselines: dict[str, dict[str, Any]],
    history: list[dict[str, Any]],
    iterations: int,
    search_time: float,
    t_best: float,
    converged: bool,
    start: str,
    start_ms: float,
) -> TuneResult:
    plan = inc.plan.copy()
    plan.name = "octopipe-tuned"
    fam = family_of(plan.placement, ev.devices)
    plan.meta = {
        "memory_cap_gib": ev.cap_gib,
        "tuner": {
            "start": start,
            "layout": fam or "irregular",
            "policy": inc.policy.name if inc.policy else None,
            "iterations": iterations,
        },
    }
    r = inc.result
    r.plan = plan
    shortfall = None
    if not inc.fits:
        d = max(range(ev.devices), key=lambda d: r.peak_memory_gib[d])
        shortfall = {
            "device": d,
            "gib": round(r.peak_memory_gib[d] - ev.cap_gib, 4),
            "message": f"no plan found fits {ev.cap_gib:g} GiB: device {d} needs "
            f"{r.peak_memory_gib[d]:.2f} GiB ({r.peak_memory_gib[d] - ev.cap_gib:.2f} GiB short)",
        }
    balance = balance_bound(ev, plan)
    costs = ev.costs(plan.partition)
    unc = None
    for pol in POLICIES[:3]:
        lr = list_schedule(costs, plan.placement, ev.devices, ev.microbatches, None, pol)
        if lr is not None and (unc is None or lr.makespan_ms < unc):
            unc = lr.makespan_ms
    bounds = plan_bounds(ev.profile, ev.devices, ev.microbatches)
    gran = bounds.granularity_ms
    why = explain_gap(r, balance_ms=balance, granularity_ms=gran, uncapped_step_ms=unc)
    if shortfall:
        why = shortfall["message"] + ("; " + why if why else "")
    return TuneResult(
        plan=plan,
        result=r,
        memory_cap_gib=ev.cap_gib,
        iterations=iterations,
        evaluations=ev.evaluations,
        search_time_s=search_time,
        time_to_best_s=t_best,
        converged=converged,
        start=start,
        start_step_time_ms=start_ms,
        baselines=baselines,
        history=history,
        shortfall=shortfall,
        why=why,
        balance_ms=balance,
        granularity_ms=gran,
        bounds=bounds,
    )
