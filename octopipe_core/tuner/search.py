"""The bubble-aware iterative tuner: climb from the best peer, then search until the budget.

Phases of the climb (``climb.py``; one *iteration* = one phase tried on the incumbent):

1. simulate the incumbent and split its gap to the lower bound (``diagnose.bubble_breakdown``)
   into imbalance (partition), start-up/drain idle (placement) and interior idle (schedule);
   a plan over the memory cap goes to the memory phase first;
2. try the moves of the phase with the largest bubble that has not been exhausted on this
   incumbent (layout families with their exact fill-aware partitions, splits, swaps, schedule
   reorders, ...), best analytic candidates first;
3. accept the best candidate only if the simulator says it fits every device's cap and the step
   is faster (or, while nothing fits, if it overflows less).

After the climb from the best peer converges, the search restarts from the best other peers
and layout families; then, **anytime**, from new starting layouts drawn by a seeded generator
(``anytime.py``: fold depths and families with perturbed fill-aware partitions, shifted
boundaries, swapped, split and merged stages of the best plan, at any ``p``), climbing from
each and keeping the best plan of all. It uses the whole ``time_budget_s`` and stops early
only when

* the best plan is within ``optimal_within`` of the strongest lower bound (``bounds.py``):
  it is then proven (near-)optimal ("converged: within X% of the bound");
* the generator finds no layout it has not tried (small models: "search space exhausted");
* the progress callback returns True, or ``max_iterations`` is reached.

``stop_at_convergence=True`` skips the anytime phase (the tuner then stops when the
deterministic climbs converge, for callers that need speed: cluster planning, the
dashboard's landing page). The search path depends only on the seed, never on the budget, so
a longer budget continues the same path: it can only find a better plan. ``seed_plans`` are
extra starting plans (e.g. the plan tuned under a memory cap, when tuning without it).

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> prof = Profile.from_dict(example_profile_dict())
>>> res = tune(prof, devices=2, microbatches=4, time_budget_s=1)
>>> res.fits_memory and res.step_time_ms <= res.baselines["1f1b/uniform"].step_time_ms
True
"""

from __future__ import annotations

import random
import time
from typing import Any

from octopipe_core.bounds import plan_bounds
from octopipe_core.errors import OctoPipeError
from octopipe_core.plan import Plan
from octopipe_core.profile import Profile
from octopipe_core.tuner.anytime import StartGenerator
from octopipe_core.tuner.climb import (
    ACCEPT_REL,
    PHASES,
    _State,
    peer_candidates,
    phase_proposals,
    rank_phases,
)
from octopipe_core.tuner.evaluate import Candidate, Evaluator, better
from octopipe_core.tuner.list_scheduler import POLICIES
from octopipe_core.tuner.moves_placement import family_proposals
from octopipe_core.tuner.result import ProgressFn, TuneProgress, TuneResult, _finish

__all__ = [
    "ACCEPT_REL",
    "PHASES",
    "ProgressFn",
    "TuneProgress",
    "TuneResult",
    "_finish",
    "peer_candidates",
    "phase_proposals",
    "rank_phases",
    "tune",
]


OPTIMAL_WITHIN = 0.001  # stop when the best plan is within 0.1 % of the best bound
POLISH_EVERY = 4  # anytime: a short randomized polish of the best after this many restarts
CLIMB_WITHIN = 0.05  # anytime: climb only from starts at most 5 % slower than the best
ANYTIME_FIRST_GAIN = 1e-4  # anytime climbs take the first move that gains 0.01 %


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
    stop_at_convergence: bool = False,
    optimal_within: float = OPTIMAL_WITHIN,
    seed_plans: list[Plan] | None = None,
) -> TuneResult:
    """Tune partition, placement and schedule together; see the module docstring.

    ``memory_gib`` is the per-device cap (default: the profile's device memory). After the
    climb from the best peer converges, up to ``restarts`` more climbs start from other peers
    and from the layout families; then the anytime phase runs until the budget is spent
    (unless ``stop_at_convergence``). With ``polish > 0`` a randomized polish tries random
    moves on the best plan at the end until ``polish`` of them in a row bring nothing. The
    best plan is returned; ``stop_reason`` says why the search ended.

    >>> from octopipe_core.profile import Profile, example_profile_dict
    >>> r = tune(Profile.from_dict(example_profile_dict()), 2, 4, time_budget_s=0.5)
    >>> r.plan.meta["memory_cap_gib"], r.stop_reason != ""
    (80.0, True)
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
    bounds = plan_bounds(profile, devices, microbatches)
    rng = random.Random(seed)
    baselines, peers = peer_candidates(ev, chunks)
    for k, sp in enumerate(seed_plans or []):
        c = _seed_candidate(ev, sp, f"seed plan {k}")
        if c is not None:
            peers.append(c)
    if not peers:  # e.g. fewer layers than any peer needs: start from a list-scheduled seq
        c = ev.from_policies([(i, i + 1) for i in range(devices)], list(range(devices)), "seq")
        if c is None:
            raise OctoPipeError("tune: no plan could be built; fix: check the profile")
        peers = [c]
    peers.sort(key=lambda c: c.key())
    best = peers[0]
    start, start_ms = best.origin, best.step_ms
    # the cap binds when a peer does not fit, or the best one is at it
    ev.memory_tight = any(not c.fits for c in peers) or max(best.peak_gib) >= 0.95 * cap
    state = _State(ev, rng, t0, progress, max_iterations, bounds.best_ms, optimal_within)
    state.report("start", best, start)
    # climb from the best peer; then restart from the best peers and layout families with
    # other placements (built once the first climb is done)
    best = state.climb(best, switch_families=True)
    state.climbed.append(best)
    others = list(peers[1:])
    # ranking the layouts behind these proposals takes seconds on wide problems (every
    # family's fill-aware partition, the spread layouts): not once the budget is spent
    props = [] if ev.out_of_time() or state.stopped() else family_proposals(ev, None)
    for prop in props:
        if ev.out_of_time() or state.stopped():
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
        best = _restart(state, s0, best)
    exhausted = False
    if not stop_at_convergence:
        gen = StartGenerator(ev, rng)
        for c in [*peers, *others, best]:
            gen.mark(c.plan.partition, c.plan.placement)
        tried = 0
        skipped: list[Candidate] = []  # starts far behind the best: climbed last
        while not ev.out_of_time() and not state.stopped():
            got = gen.next((best.plan.partition, best.plan.placement))
            if got is None:
                if not skipped:
                    exhausted = True
                    break
                skipped.sort(key=lambda c: c.key())
                c = skipped.pop(0)
            else:
                part, place, desc = got
                c0 = ev.from_policies(part, place, desc, POLICIES[:2], bound_ms=float("inf"))
                if c0 is None or ev.out_of_time():
                    continue
                c = c0
                if not better(c, best, ACCEPT_REL) and not (
                    c.fits >= best.fits and c.step_ms <= best.step_ms * (1 + CLIMB_WITHIN)
                ):
                    skipped.append(c)
                    continue
            tried += 1
            best = _restart(state, c, best, first_gain=ANYTIME_FIRST_GAIN)
            if tried % POLISH_EVERY == 0 and not ev.out_of_time() and not state.stopped():
                best = _keep(best, state.polish(best, patience=6))
    if better(state.best, best, ACCEPT_REL) and state.best is not None:
        best = state.best
    climbs_done = not ev.out_of_time() and not state.stopped()
    if polish > 0 and (climbs_done or state.proven):
        best = state.polish(best, polish)
    reason = _stop_reason(state, ev, best, bounds.best_ms, time_budget_s, exhausted)
    if stop_at_convergence and climbs_done:
        reason = "climbs converged (stop_at_convergence)"
    converged = state.proven or exhausted or (stop_at_convergence and climbs_done)
    search_time = time.perf_counter() - t0
    res = _finish(
        ev, best, baselines, state.history, state.it, search_time, state.t_best, converged,
        start, start_ms, bounds, reason,
    )  # fmt: skip
    res.runners_up = runners_up(best, state.climbed)
    return res


RUNNERS_UP = 3  # the best plans of other layouts a tune keeps, for measuring beside its own


def runners_up(best: Candidate, climbed: list[Candidate], k: int = RUNNERS_UP) -> list[Plan]:
    """The best plan of each other layout (partition and placement) the climbs ended on,
    fastest first, at most ``k``; only plans that fit when the best one does."""
    mine = (tuple(best.plan.partition), tuple(best.plan.placement))
    per: dict[tuple[Any, Any], Candidate] = {}
    for c in climbed:
        key = (tuple(c.plan.partition), tuple(c.plan.placement))
        if key != mine and c.fits >= best.fits and (key not in per or better(c, per[key])):
            per[key] = c
    return [c.plan for c in sorted(per.values(), key=lambda c: c.key())[:k]]


def _keep(best: Candidate, cand: Candidate) -> Candidate:
    return cand if better(cand, best, ACCEPT_REL) else best


def _restart(
    state: _State, s0: Candidate, best: Candidate, first_gain: float | None = None
) -> Candidate:
    """Climb from ``s0`` (without switching layout family); the better of that and ``best``."""
    state.history.append(
        {"iteration": state.it, "phase": "restart", "move": s0.origin,
         "step_time_ms": round(s0.step_ms, 6), "fits_memory": s0.fits,
         "elapsed_s": round(time.perf_counter() - state.t0, 3)}
    )  # fmt: skip
    state.report("restart", s0, f"restart from {s0.origin}")
    got = state.climb(s0, switch_families=False, first_gain=first_gain)
    state.climbed.append(got)
    return _keep(best, got)


def _seed_candidate(ev: Evaluator, plan: Plan, origin: str) -> Candidate | None:
    """A caller's plan as a candidate, if it fits this problem's shape."""
    if plan.num_devices != ev.devices or plan.num_microbatches != ev.microbatches:
        return None
    if not plan.partition or plan.partition[-1][1] != ev.profile.num_layers:
        return None
    return ev.from_order(
        plan.partition, plan.placement, plan.schedule, origin, recompute=plan.recompute
    )


def _stop_reason(
    state: _State,
    ev: Evaluator,
    best: Candidate,
    bound_ms: float,
    budget_s: float,
    exhausted: bool,
) -> str:
    gap = 100.0 * (best.step_ms / bound_ms - 1.0) if bound_ms > 0 else float("nan")
    if state.proven:
        return f"converged: within {gap:.2f}% of the best bound"
    if state.stop_requested:
        return "stopped by the caller"
    if state.max_iterations is not None and state.it >= state.max_iterations:
        return f"iteration limit ({state.max_iterations})"
    if exhausted:
        return "search space exhausted: every layout the generator reaches was tried"
    if ev.out_of_time():
        return f"budget spent ({budget_s:g} s): {gap:.2f}% above the best bound"
    return "climbs converged"
