"""Random search over the tuner's moves: the baseline that shows what the bubble-aware order buys.

Same start (the best peer), same moves, same simulator and acceptance rule as ``tune``, but
each step picks a phase at random and one of its moves at random, instead of the phase with
the biggest bubble and its most promising moves first. It runs until the time budget (or
``max_evaluations``) is spent.

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> prof = Profile.from_dict(example_profile_dict())
>>> r = random_search(prof, devices=2, microbatches=4, time_budget_s=0.5, seed=1)
>>> r.fits_memory
True
"""

from __future__ import annotations

import random
import time

from octopipe_core.profile import Profile
from octopipe_core.tuner.evaluate import Evaluator, better
from octopipe_core.tuner.search import (
    ACCEPT_REL,
    PHASES,
    TuneResult,
    _finish,
    peer_candidates,
    phase_proposals,
)


def random_search(
    profile: Profile,
    devices: int,
    microbatches: int,
    memory_gib: float | None = None,
    time_budget_s: float = 10.0,
    seed: int = 0,
    max_evaluations: int | None = None,
) -> TuneResult:
    """Random-move hill climbing from the best peer, for the same budget as ``tune``."""
    cap = float(profile.device.memory_gib if memory_gib is None else memory_gib)
    t0 = time.perf_counter()
    ev = Evaluator(profile, devices, microbatches, cap, deadline=t0 + time_budget_s)
    rng = random.Random(seed)
    baselines, peers = peer_candidates(ev)
    inc = min(peers, key=lambda c: c.key())
    start, start_ms = inc.origin, inc.step_ms
    history = []
    steps, t_best = 0, 0.0
    while not ev.out_of_time():
        if max_evaluations is not None and ev.evaluations >= max_evaluations:
            break
        phases = list(PHASES) + ([] if inc.fits else ["memory"])
        phase = rng.choice(phases)
        props = phase_proposals(ev, phase, inc)
        if not props:
            continue
        steps += 1
        cand = rng.choice(props).build()
        if cand is not None and better(cand, inc, ACCEPT_REL):
            inc = cand
            t_best = time.perf_counter() - t0
            history.append(
                {"iteration": steps, "phase": phase, "move": cand.origin,
                 "step_time_ms": round(cand.step_ms, 6), "elapsed_s": round(t_best, 3)}
            )  # fmt: skip
    elapsed = time.perf_counter() - t0
    return _finish(ev, inc, baselines, history, steps, elapsed, t_best, False, start, start_ms)
