"""Partition moves: migrate boundary layers from the most loaded device to the least loaded.

Each proposal keeps the placement, changes the partition and is evaluated twice: with the
incumbent's device orders (valid for any partition of the same stage count) and re-planned by
the list scheduler; the faster one is the proposal's candidate. A memory variant migrates
layers off the device with the highest memory peak instead (layer weights + activations).

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> from octopipe_core.tuner.evaluate import Evaluator
>>> prof = Profile.from_dict(example_profile_dict())
>>> ev = Evaluator(prof, devices=2, microbatches=4, cap_gib=80.0)
>>> inc = ev.from_policies([(0, 3), (3, 4)], [0, 1], "start")
>>> [p.description for p in partition_proposals(ev, inc)][:1]
['rebalance device loads']
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
    better,
    proposal,
)
from octopipe_core.tuner.layouts import balance_partition, chain_moves, partition_neighbours
from octopipe_core.tuner.list_scheduler import POLICIES

PARTITION_POLICIES = 2  # list-scheduler policies per partition move (all on small problems)


def evaluate_partition(
    ev: Evaluator, inc: Candidate, part: Partition, keep_order: bool = True
) -> Candidate | None:
    """The better of: the incumbent's orders on ``part``, and a list-scheduled plan."""
    place, rec = inc.plan.placement, inc.plan.recompute
    best = None
    if keep_order:
        best = ev.from_order(part, place, inc.plan.schedule, "", inc.policy, rec)
    pols = [inc.policy] if inc.policy is not None else []
    n = len(POLICIES) if ev.devices * ev.microbatches <= 16 else PARTITION_POLICIES
    pols += [p for p in POLICIES[:n] if p not in pols][: max(1, n - len(pols))]
    ls = ev.from_policies(part, place, "", tuple(pols), recompute=rec)
    if better(ls, best):
        best = ls
    return best


def _bind(ev: Evaluator, inc: Candidate, part: Partition) -> Callable[[], Candidate | None]:
    return lambda: evaluate_partition(ev, inc, part)


def partition_proposals(ev: Evaluator, inc: Candidate, limit: int = 8) -> list[Proposal]:
    """Rebalance by descent, then the best single boundary/chain moves by analytic score."""
    plan = inc.plan
    part, place, D = plan.partition, plan.placement, ev.devices
    out: list[Proposal] = []
    fin_fn = ev.finish_fn(place)
    full = balance_partition(ev.weights, part, place, D)
    fill = ev.fill_partition(place, start=part).partition or full
    seen = {tuple(part)}
    for new, move, desc in (
        (full, Move.REBALANCE, "rebalance device loads"),
        (fill, Move.FILL_PARTITION, "fill-aware partition"),
    ):
        if tuple(new) not in seen:
            seen.add(tuple(new))
            out.append(proposal(Phase.PARTITION, move, desc, _bind(ev, inc, new)))
    moves = partition_neighbours(ev.weights, part, place, D, fin_fn)[: limit // 2]
    moves += partition_neighbours(ev.weights, part, place, D)[:limit]
    for mv in moves:
        if tuple(mv.partition) not in seen and len(out) < limit + 2:
            seen.add(tuple(mv.partition))
            out.append(
                proposal(
                    Phase.PARTITION, Move.MIGRATE, f"migrate {mv}", _bind(ev, inc, mv.partition)
                )
            )
    # every single-layer shift at the boundaries of the device that finishes last
    r = inc.result
    ends = [0.0] * D
    for (dd, _a), e in zip(r.ops, r.end_ms, strict=True):
        ends[dd] = max(ends[dd], e)
    last = max(range(D), key=lambda d: ends[d])
    for s in (s for s in range(len(part)) if place[s] == last):
        for t in (s - 1, s + 1):
            moved = chain_moves(part, s, t) if 0 <= t < len(part) else None
            if moved is not None and tuple(moved) not in seen:
                seen.add(tuple(moved))
                desc = f"migrate layer s{s}->s{t} (d{last}, last to finish)"
                out.append(proposal(Phase.PARTITION, Move.MIGRATE, desc, _bind(ev, inc, moved)))
    return out


def memory_partition_proposals(ev: Evaluator, inc: Candidate, limit: int = 6) -> list[Proposal]:
    """Migrate layers off the device with the highest memory peak (weights + activations)."""
    layers = ev.profile.layer_costs()
    m_eff = min(ev.microbatches, ev.devices)
    mem_w = [lt.weight_mib + m_eff * lt.activation_mib for lt in layers]
    plan = inc.plan
    part, place, D = plan.partition, plan.placement, ev.devices
    peaks = inc.peak_gib
    hi = max(range(D), key=lambda d: peaks[d])
    out: list[Proposal] = []
    full = balance_partition(mem_w, part, place, D)
    if full != part:
        out.append(
            proposal(
                Phase.MEMORY,
                Move.REBALANCE,
                "memory: rebalance weights+activations",
                _bind(ev, inc, full),
            )
        )
    moves = partition_neighbours(mem_w, part, place, D)
    moves = [mv for mv in moves if mv.src_device == hi] or moves
    for mv in moves[:limit]:
        if mv.partition != full:
            desc = f"memory: migrate {mv}"
            out.append(proposal(Phase.MEMORY, Move.MIGRATE, desc, _bind(ev, inc, mv.partition)))
    return out
