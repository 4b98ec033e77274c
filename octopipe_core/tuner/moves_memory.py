"""Memory-aware moves, for plans at (or over) the memory cap.

* **memory-aware fill partition**: the exact fill-aware partition of the incumbent's placement
  (``fill_partition.py``) under a per-device memory budget: weights plus the activations of
  the micro-batches a 1F1B-like order keeps in flight on each stage (``k_s``), scaled by a
  factor (1, then 0.5: the list scheduler can hold fewer in flight). Weight and activation
  memory are rebalanced across the devices at the cap while the devices that start early
  keep the heavy compute, instead of pushing layers to late devices whose fill then makes
  them critical;
* **selective recomputation**: on the devices at the cap, one stage recomputes its forward in
  B (``costs.py``: F keeps only the stage input, B runs F again first), so the scheduler can
  keep more micro-batches in flight; and a stage that recomputes stops doing so. Both are
  judged by the simulator like every move: accepted only where the plan gets faster (or, over
  the cap, overflows less).

>>> from octopipe_core.profile import load_sample
>>> from octopipe_core.tuner.evaluate import Evaluator
>>> ev = Evaluator(load_sample("nemotron-h-8b"), 4, 8, 40.0)
>>> inc = ev.from_policies([(0, 14), (14, 28), (28, 41), (41, 54)], [0, 1, 2, 3], "seq")
>>> any(p.move is Move.RECOMPUTE for p in recompute_proposals(ev, inc))
True
"""

from __future__ import annotations

from collections.abc import Callable

from octopipe_core.tuner.evaluate import (
    Candidate,
    Evaluator,
    Move,
    Partition,
    Phase,
    Proposal,
    proposal,
)
from octopipe_core.tuner.list_scheduler import POLICIES

TIGHT = 0.95  # a device whose peak is above this share of the cap is "at the cap"
INFLIGHT = (1.0, 0.5)


def at_cap(ev: Evaluator, inc: Candidate) -> list[int]:
    """Devices whose memory peak is at least ``TIGHT`` x the cap, highest first."""
    peaks = inc.peak_gib
    tight = [d for d in range(ev.devices) if peaks[d] >= TIGHT * ev.cap_gib]
    return sorted(tight, key=lambda d: -peaks[d])


def memory_fill_proposals(ev: Evaluator, inc: Candidate, phase: Phase) -> list[Proposal]:
    """Memory-aware fill-aware partitions of the incumbent's placement (module docstring)."""
    from octopipe_core.tuner.moves_partition import evaluate_partition

    part, place = inc.plan.partition, inc.plan.placement
    out: list[Proposal] = []
    seen = {tuple(part)}
    for f in INFLIGHT:
        res = ev.fill_partition(place, start=part, memory=True, inflight=f)
        new = res.partition
        if new is None or tuple(new) in seen:
            continue
        seen.add(tuple(new))
        desc = f"memory-aware fill partition (x{f:g} activations in flight)"
        thunk = _part(ev, inc, new, evaluate_partition)
        out.append(proposal(phase, Move.FILL_PARTITION, desc, thunk))
    return out


def _part(
    ev: Evaluator, inc: Candidate, part: Partition, fn: Callable[..., Candidate | None]
) -> Callable[[], Candidate | None]:
    return lambda: fn(ev, inc, part)


def recompute_proposals(ev: Evaluator, inc: Candidate, limit: int = 4) -> list[Proposal]:
    """Turn recomputation on for the stages that hold the most activations on the devices at
    the cap, or off for a stage that recomputes (module docstring)."""
    plan = inc.plan
    part, place = plan.partition, plan.placement
    rec = set(plan.recompute)
    full = ev.costs(part)  # activations without recomputation
    phase = Phase.MEMORY if not inc.fits else Phase.SCHEDULE
    out: list[Proposal] = []
    for d in at_cap(ev, inc):
        stages = [s for s in range(len(part)) if place[s] == d and s not in rec]
        stages.sort(key=lambda s: -full.activation_mib[s])
        for s in stages[:limit]:
            new = sorted(rec | {s})
            desc = f"recompute stage {s} (d{d}, {full.activation_mib[s]:.0f} MiB per micro-batch)"
            out.append(proposal(phase, Move.RECOMPUTE, desc, _rec(ev, part, place, new)))
        if len(out) >= limit:
            break
    for s in sorted(rec):
        new = sorted(rec - {s})
        desc = f"stop recomputing stage {s}"
        out.append(proposal(phase, Move.STOP_RECOMPUTE, desc, _rec(ev, part, place, new)))
    return out


def _rec(
    ev: Evaluator, part: Partition, place: list[int], rec: list[int]
) -> Callable[[], Candidate | None]:
    return lambda: ev.from_policies(part, place, "", POLICIES[:3], recompute=rec)
