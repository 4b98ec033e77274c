"""Placement moves: finer units and different stage-to-device maps to cut start-up/drain bubbles.

* **family switch**: re-plan the model as ``seq``, ``v``, ``loop{v}``, ``zigzag{v}`` or
  ``fold{r}`` (stage dispersion into virtual stages, loop, V and partly folded V shapes), with
  the exact fill-aware partition (``fill_partition.py``: the slowest device's earliest start
  plus load is minimal) and, for the regular families, the device-balanced one too; with
  fewer than two layers per device, also the ``matched`` layout (``matched.py``), with three
  to eight the ``packed`` one (``packed.py``), both list-scheduled and then justified;
* **split**: cut one stage in two and put the new half on another device (irregular layouts);
* **merge**: join two adjacent stages that sit on the same device (saves a transfer);
* **swap**: exchange the devices of two stages (e.g. move a memory-hungry block to a device
  with room), then rebalance the partition;
* **trade**: move a layer off the first or last stage even if the device loads get a little
  worse, when the shorter warm-up or drain buys more;
* **reassign**: any layer to any device, by a descent on the fill model from the current
  layout (``assign.py``), with many micro-batches per device.

Every layout is list-scheduled with a few policies.

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> from octopipe_core.tuner.evaluate import Evaluator
>>> prof = Profile.from_dict(example_profile_dict())
>>> ev = Evaluator(prof, devices=2, microbatches=4, cap_gib=80.0)
>>> inc = ev.from_policies([(0, 2), (2, 4)], [0, 1], "start")
>>> "switch to v" in [p.description for p in placement_proposals(ev, inc)
...                   if p.move is Move.SWITCH_FAMILY]
True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from octopipe_core.plan_diff import layer_devices
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
from octopipe_core.tuner.layouts import (
    FAMILIES,
    balance_partition,
    device_loads,
    family_placement,
)
from octopipe_core.tuner.list_scheduler import POLICIES
from octopipe_core.tuner.moves_schedule import JUSTIFY_MOVES, justify_thunk

P = Phase.PLACEMENT
SMALL_LAYOUT = 12  # up to this many stages, try every swap and relocation
FAM_POL = POLICIES[:3]  # policies tried on a new layout family (local moves try two)


def family_of(placement: list[int], devices: int) -> str | None:
    """The layout family a placement belongs to, or None if irregular.

    >>> family_of([0, 1, 1, 0], 2)
    'v'
    """
    for fam in FAMILIES:
        if family_placement(fam, devices) == placement:
            return fam
    r = len(placement) - devices
    if 0 < r < devices and placement == family_placement(f"fold{r}", devices):
        return f"fold{r}"
    return None


def _layout(
    ev: Evaluator, part: Partition, place: list[int], policies: tuple | None = None
) -> Callable[[], Candidate | None]:
    if policies is None:  # small problems afford every policy on every move
        policies = POLICIES if ev.devices * ev.microbatches <= 16 else POLICIES[:2]
    return lambda: ev.from_policies(part, place, "", policies)


def _balanced(ev: Evaluator, part: Partition, place: list[int]) -> Callable[[], Candidate | None]:
    """``_layout`` of ``part`` rebalanced over the devices of ``place``, rebalanced only when
    built (most proposals never are, and the descent is the costly part of making them)."""
    return lambda: _layout(ev, balance_partition(ev.weights, part, place, ev.devices), place)()


def _spread(
    ev: Evaluator, part: Partition, place: list[int], policies: tuple
) -> Callable[[], Candidate | None]:
    """A matched, packed or counted layout, list-scheduled and then justified (4 rounds from
    the list schedule's times): on their many one-layer stages the greedy rules leave 2-6 %
    idle, and a climb that only sees the list schedule spends a whole schedule phase to find
    that."""

    def build() -> Candidate | None:
        c = ev.from_policies(part, place, "", policies)
        if c is None or not c.fits:
            return c
        j = justify_thunk(ev, c, *JUSTIFY_MOVES[0])()
        return j if j is not None and better(j, c) else c

    return build


class RankedLayout(NamedTuple):
    """A layout and its fill-model objective (ms); ``spread``: a matched, packed or counted
    layout (one-layer stages, which the greedy list rules alone order poorly)."""

    objective_ms: float
    name: str
    partition: Partition
    placement: list[int]
    spread: bool = False


def ranked_layouts(ev: Evaluator, current: str | None = None) -> list[RankedLayout]:
    """Layout families that fit the model's layer count with their exact fill-aware
    partitions (fold depths 1, 2, 4, ... and the deepest), and the matched, packed and
    counted layouts, best fill-model objective first; those ranked before the evaluator's
    deadline (each costs a fill-aware partition: past the budget the list is cut short)."""
    n, p = ev.profile.num_layers, ev.devices
    deepest = min(p - 1, n - p)
    folds = sorted({*(2**k for k in range(8) if 2**k <= deepest), max(deepest, 0)} - {0})
    ranked = []
    for fam in (*FAMILIES, *(f"fold{r}" for r in folds)):
        if ev.out_of_time():  # each layout costs a fill-aware partition: not past the budget
            break
        place = family_placement(fam, p)
        if fam == current or len(place) > n:
            continue
        for mem in _memory(ev):
            res = ev.fill_partition(place, memory=mem)
            if res.partition is not None and res.objective_ms is not None:
                name = f"{fam} (memory-aware)" if mem else fam
                ranked.append(RankedLayout(res.objective_ms, name, res.partition, place))
    # the reassign descent searches every layer-to-device map where it runs, counted ones
    # (plain, wave- and rate-aware) included: there the counted layouts only take time from it
    # (jamba-v0.1, 8 devices, 64 micro-batches: 5,570.6 -> 5,585.5 ms with both, tuner_cells)
    skip = {"counted", "counted-wave", "counted-rate"} if reassign_applies(ev) else set()
    for mem in _memory(ev):  # wide pipelines: one early layer per device, the rest spread
        if ev.out_of_time():
            break
        for kind, part, place, need in ev.spread_layouts(mem):
            if kind in skip:
                continue
            name = f"{kind} (memory-aware)" if mem else kind
            ranked.append(RankedLayout(need, name, part, place, spread=True))
    ranked.sort(key=lambda x: x.objective_ms)
    return ranked


def _memory(ev: Evaluator) -> tuple[bool, ...]:
    """Whether to rank layouts without and with the memory budget, or without only."""
    return (False, True) if ev.memory_tight else (False,)


def family_proposals(ev: Evaluator, current: str | None = None, top: int = 6) -> list[Proposal]:
    """The ``top`` best of ``ranked_layouts`` (twice as many when memory is tight), then each
    regular family with its device-balanced partition."""
    n, p = ev.profile.num_layers, ev.devices
    out = []
    for lay in ranked_layouts(ev, current)[: top * len(_memory(ev))]:
        build = _spread if lay.spread else _layout
        thunk = build(ev, lay.partition, lay.placement, FAM_POL)
        out.append(proposal(P, Move.SWITCH_FAMILY, f"switch to {lay.name}", thunk))
    for fam in FAMILIES:
        place = family_placement(fam, p)
        if fam == current or len(place) > n:
            continue
        part = ev.family_partition(fam)
        desc = f"switch to {fam} (device-balanced partition)"
        out.append(proposal(P, Move.SWITCH_FAMILY, desc, _layout(ev, part, place, FAM_POL)))
    return out


REASSIGN_MIN_MB_PER_DEVICE = 8  # reassign only with at least this many micro-batches a device,
REASSIGN_MIN_LAYERS_PER_DEVICE = 3  # ... this many layers a device (fewer: matched layouts)
REASSIGN_MAX_LAYER_DEVICES = 512  # ... and layers x devices at most this (the descent's cost)
REASSIGN_COUNT = 3


def reassign_applies(ev: Evaluator) -> bool:
    """Whether the placement phase offers ``reassign_proposals`` (their docstring)."""
    n, p = ev.profile.num_layers, ev.devices
    return (
        ev.microbatches >= REASSIGN_MIN_MB_PER_DEVICE * p
        and n >= REASSIGN_MIN_LAYERS_PER_DEVICE * p
        and n * p <= REASSIGN_MAX_LAYER_DEVICES
    )


def reassign_proposals(ev: Evaluator, inc: Candidate) -> list[Proposal]:
    """The best layouts of ``assign.reassigned_layouts`` from the incumbent's layout (any
    layer on any device), each list-scheduled and justified. Only with at least
    ``REASSIGN_MIN_MB_PER_DEVICE`` micro-batches per device: with fewer, the fill and drain
    weigh more than the balance, and the schedules realise these layouts 2-5 % above their
    fill-model need (jamba-v0.1 and nemotron-h-8b at 8 devices and 16-32 micro-batches);
    with 64 on 8 devices they come within 1.6 % of it. Only with at least three layers per
    device (with fewer, the matched layouts balance) and at most 512 layers x devices: a
    descent step tries every move and swap (about 2,200 layouts for 52 layers on 16
    devices), and there it cost more of the budget than it returned (nemotron-h-8b, 16
    devices, 128 micro-batches: 8,178 -> 8,202 ms uncapped). The descent runs when the first
    of them is built, once per incumbent layout."""
    n = ev.profile.num_layers
    if not reassign_applies(ev):
        return []
    owner = [d for d in layer_devices(inc.plan, n) if d is not None]  # a full plan: n of them

    def build(k: int) -> Callable[[], Candidate | None]:
        def run() -> Candidate | None:
            got = ev.reassigned(owner)
            if k >= len(got):
                return None
            part, place, _need = got[k]
            return _spread(ev, part, place, FAM_POL)()

        return run

    return [
        proposal(P, Move.REASSIGN, f"reassign layers (fill-model descent, #{k + 1})", build(k))
        for k in range(REASSIGN_COUNT)
    ]


def _split(part: Partition, s: int, weights: list[float]) -> Partition | None:
    a, b = part[s]
    if b - a < 2:
        return None
    tot = sum(weights[a:b])
    acc, cut = 0.0, a + 1
    for i in range(a, b - 1):
        acc += weights[i]
        cut = i + 1
        if acc >= tot / 2:
            break
    return [*part[:s], (a, cut), (cut, b), *part[s + 1 :]]


def placement_proposals(ev: Evaluator, inc: Candidate, limit: int = 24) -> list[Proposal]:
    """Family switches, then splits, merges, swaps and trades around the busiest device."""
    plan = inc.plan
    part, place, D = plan.partition, plan.placement, ev.devices
    S, w = len(part), ev.weights
    fam = family_of(place, D)
    out = family_proposals(ev, fam) + reassign_proposals(ev, inc)
    loads = device_loads(w, part, place, D)
    by_load = sorted(range(D), key=lambda d: loads[d])
    hi, lo = by_load[-1], by_load[0]
    peaks = inc.peak_gib
    mem_hi = max(range(D), key=lambda d: peaks[d])
    mem_lo = min(range(D), key=lambda d: peaks[d])
    local: list[Proposal] = []
    # split a stage of the busiest device (or a boundary stage) and disperse the new half
    split_stages = [s for s in range(S) if place[s] == hi] + [0, S - 1]
    for s in dict.fromkeys(split_stages):
        new = _split(part, s, w)
        if new is None or ev.profile.num_layers < S + 1:
            continue
        targets = dict.fromkeys([lo, *(place[t] for t in (s - 1, s + 1) if 0 <= t < S)])
        for d in targets:
            if d == place[s]:
                continue
            new_place = [*place[: s + 1], d, *place[s + 1 :]]
            desc = f"split s{s} -> new stage on d{d}"
            local.append(proposal(P, Move.SPLIT_STAGE, desc, _balanced(ev, new, new_place)))
    # merge adjacent stages on the same device
    for s in range(S - 1):
        if place[s] == place[s + 1]:
            new = [*part[:s], (part[s][0], part[s + 1][1]), *part[s + 2 :]]
            new_place = place[:s] + place[s + 1 :]
            desc = f"merge s{s}+s{s + 1}"
            local.append(proposal(P, Move.MERGE_STAGES, desc, _layout(ev, new, new_place)))
    # swap the devices of two stages (time-heavy with light, memory-heavy with roomy)
    pairs = [(hi, lo), (mem_hi, mem_lo)]
    for da, db in dict.fromkeys(pairs):
        if da == db:
            continue
        for sa in (s for s in range(S) if place[s] == da):
            for sb in (s for s in range(S) if place[s] == db):
                new_place = list(place)
                new_place[sa], new_place[sb] = db, da
                desc = f"swap s{sa}(d{da}) <-> s{sb}(d{db})"
                local.append(proposal(P, Move.SWAP, desc, _balanced(ev, part, new_place)))
    # small layouts: every pairwise swap and every single-stage relocation
    if S <= SMALL_LAYOUT:
        for sa in range(S):
            for sb in range(sa + 1, S):
                if place[sa] != place[sb]:
                    new_place = list(place)
                    new_place[sa], new_place[sb] = place[sb], place[sa]
                    desc = f"swap s{sa}(d{place[sa]}) <-> s{sb}(d{place[sb]})"
                    local.append(proposal(P, Move.SWAP, desc, _layout(ev, part, new_place)))
            if place.count(place[sa]) > 1:
                for d in range(D):
                    if d != place[sa]:
                        new_place = list(place)
                        new_place[sa] = d
                        desc = f"relocate s{sa} to d{d}"
                        local.append(proposal(P, Move.RELOCATE, desc, _layout(ev, part, new_place)))
    # trade: shorten the first and last stages by one layer
    for s, t in ((0, 1), (S - 1, S - 2)):
        if 0 <= t < S and part[s][1] - part[s][0] >= 2:
            new = list(part)
            if s < t:
                new[s], new[t] = (part[s][0], part[s][1] - 1), (part[t][0] - 1, part[t][1])
            else:
                new[s], new[t] = (part[s][0] + 1, part[s][1]), (part[t][0], part[t][1] + 1)
            local.append(
                proposal(P, Move.TRADE_LAYER, f"trade a layer s{s}->s{t}", _layout(ev, new, place))
            )
    return out + local[: max(limit, len(local) if S <= SMALL_LAYOUT else 0)]
