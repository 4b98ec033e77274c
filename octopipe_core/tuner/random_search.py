"""Random-search baselines: what the bubble-aware order of the tuner buys.

* :func:`random_search` (random *moves*): same start (the best peer), same moves, same
  simulator and acceptance rule as ``tune``, but each step picks a phase at random and one of
  its moves at random, instead of the phase with the biggest bubble and its most promising
  moves first;
* :func:`random_plan_search` (random *plans*, a weaker reference): samples whole plans
  independently (a random layout family, hence a stage count, a random contiguous partition
  into that many stages, and the tuner's list scheduler for the schedule) and keeps the best.

Both run until the time budget (or ``max_evaluations``) is spent, report best-so-far through
an optional ``progress`` callback shaped like the tuner's (:class:`TuneProgress`; returning
True stops them), and are deterministic for a seed when stopped by ``max_evaluations``.

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> prof = Profile.from_dict(example_profile_dict())
>>> r = random_search(prof, devices=2, microbatches=4, time_budget_s=0.5, seed=1)
>>> r.fits_memory
True
>>> q = random_plan_search(prof, devices=2, microbatches=4, time_budget_s=5, max_evaluations=60)
>>> q.fits_memory and q.step_time_ms <= q.start_step_time_ms
True
"""

from __future__ import annotations

import random
import time
from itertools import pairwise
from typing import Any

from octopipe_core.profile import Profile
from octopipe_core.tuner.evaluate import Candidate, Evaluator, Phase, better
from octopipe_core.tuner.layouts import FAMILIES, family_placement
from octopipe_core.tuner.list_scheduler import POLICIES
from octopipe_core.tuner.search import (
    ACCEPT_REL,
    PHASES,
    ProgressFn,
    TuneProgress,
    TuneResult,
    _finish,
    peer_candidates,
    phase_proposals,
)


def _notify(
    progress: ProgressFn | None, it: int, phase: str, best: Candidate, t0: float, move: str
) -> bool:
    """Call ``progress`` with the best plan so far; True if it asks to stop."""
    if progress is None:
        return False
    el = time.perf_counter() - t0
    ev = TuneProgress(it, phase, best.step_ms, el, best.fits, move, best.plan)
    return progress(ev) is True


def random_search(
    profile: Profile,
    devices: int,
    microbatches: int,
    memory_gib: float | None = None,
    time_budget_s: float = 10.0,
    seed: int = 0,
    max_evaluations: int | None = None,
    progress: ProgressFn | None = None,
) -> TuneResult:
    """Random-move hill climbing from the best peer, for the same budget as ``tune``.

    ``progress`` receives a :class:`TuneProgress` after the start and after every step (phase
    ``"start"`` then the sampled phase; ``move`` is the accepted move or ''), like ``tune``'s.
    """
    cap = float(profile.device.memory_gib if memory_gib is None else memory_gib)
    t0 = time.perf_counter()
    ev = Evaluator(profile, devices, microbatches, cap, deadline=t0 + time_budget_s)
    rng = random.Random(seed)
    baselines, peers = peer_candidates(ev)
    inc = min(peers, key=lambda c: c.key())
    start, start_ms = inc.origin, inc.step_ms
    history: list[dict[str, Any]] = []
    steps, t_best = 0, 0.0
    stop = _notify(progress, 0, "start", inc, t0, start)
    while not stop and not ev.out_of_time():
        if max_evaluations is not None and ev.evaluations >= max_evaluations:
            break
        phases = list(PHASES) + ([] if inc.fits else [Phase.MEMORY])
        phase = rng.choice(phases)
        props = phase_proposals(ev, phase, inc)
        if not props:
            continue
        steps += 1
        cand = rng.choice(props).build()
        move = ""
        if cand is not None and better(cand, inc, ACCEPT_REL):
            inc, move = cand, cand.origin
            t_best = time.perf_counter() - t0
            history.append(
                {"iteration": steps, "phase": phase, "move": cand.origin,
                 "step_time_ms": round(cand.step_ms, 6), "elapsed_s": round(t_best, 3)}
            )  # fmt: skip
        stop = _notify(progress, steps, phase, inc, t0, move)
    elapsed = time.perf_counter() - t0
    return _finish(ev, inc, baselines, history, steps, elapsed, t_best, False, start, start_ms)


MAX_REPEATS = 1000  # random_plan_search stops after this many already-seen layouts in a row


def random_plan(
    rng: random.Random, num_layers: int, devices: int
) -> tuple[str, list[tuple[int, int]], list[int]]:
    """One random layout: a layout family the model has enough layers for (uniformly), and a
    contiguous partition into that family's number of stages with cut points drawn uniformly
    without replacement. Returns (family, partition, placement).

    >>> fam, part, place = random_plan(random.Random(0), 10, 2)
    >>> len(part) == len(place) and part[0][0] == 0 and part[-1][1] == 10
    True
    """
    fams = [f for f in FAMILIES if len(family_placement(f, devices)) <= num_layers]
    fam = rng.choice(fams)
    place = family_placement(fam, devices)
    cuts = sorted(rng.sample(range(1, num_layers), len(place) - 1))
    bounds = [0, *cuts, num_layers]
    return fam, list(pairwise(bounds)), place


def random_plan_search(
    profile: Profile,
    devices: int,
    microbatches: int,
    memory_gib: float | None = None,
    time_budget_s: float = 10.0,
    seed: int = 0,
    max_evaluations: int | None = None,
    progress: ProgressFn | None = None,
) -> TuneResult:
    """Pure random sampling of whole plans, keeping the best (the weaker, standard reference).

    Starts, like ``tune``, from the best peer plan; then repeatedly draws a layout with
    :func:`random_plan` (random family, hence stage count and placement; random contiguous
    partition) and schedules it with the tuner's list scheduler (the first three ``POLICIES``,
    the fastest schedule that fits the cap; like the tuner, schedules that cannot beat the
    best plan so far are abandoned early). Runs until ``time_budget_s`` or ``max_evaluations``
    (simulator and list-scheduler calls, counted as in ``tune``) is spent, or when
    ``MAX_REPEATS`` draws in a row give layouts already tried (the space is exhausted: small
    models); a repeated layout is skipped at no cost. Deterministic for a
    ``seed`` (the sampled layouts are; the stopping point is when it stops on
    ``max_evaluations``). ``progress`` is called like ``tune``'s: after the start and after
    every sample (phase ``"sample"``; ``move`` is the layout if it became the best, else '').
    """
    cap = float(profile.device.memory_gib if memory_gib is None else memory_gib)
    t0 = time.perf_counter()
    ev = Evaluator(profile, devices, microbatches, cap, deadline=t0 + time_budget_s)
    rng = random.Random(seed)
    baselines, peers = peer_candidates(ev)
    best = min(peers, key=lambda c: c.key())
    start, start_ms = best.origin, best.step_ms
    history: list[dict[str, Any]] = []
    samples, t_best = 0, 0.0
    seen: set[tuple[tuple[tuple[int, int], ...], tuple[int, ...]]] = set()
    repeats = 0
    stop = _notify(progress, 0, "start", best, t0, start)
    while not stop and not ev.out_of_time() and repeats < MAX_REPEATS:
        if max_evaluations is not None and ev.evaluations >= max_evaluations:
            break
        fam, part, place = random_plan(rng, profile.num_layers, devices)
        lay = (tuple(part), tuple(place))
        if lay in seen:  # drawn before: costs nothing, and nothing to learn
            repeats += 1
            continue
        seen.add(lay)
        samples, repeats = samples + 1, 0
        desc = f"random {fam}/{len(part)} {part}"
        ev.bound_ms, ev.bound_fits = best.step_ms, best.fits
        cand = ev.from_policies(part, place, desc, POLICIES[:3])
        ev.bound_ms, ev.bound_fits = float("inf"), False
        move = ""
        if cand is not None and better(cand, best, ACCEPT_REL):
            best, move = cand, desc
            t_best = time.perf_counter() - t0
            history.append(
                {"iteration": samples, "phase": "sample", "move": desc,
                 "step_time_ms": round(cand.step_ms, 6), "elapsed_s": round(t_best, 3)}
            )  # fmt: skip
        stop = _notify(progress, samples, "sample", best, t0, move)
    elapsed = time.perf_counter() - t0
    return _finish(ev, best, baselines, history, samples, elapsed, t_best, False, start, start_ms)
