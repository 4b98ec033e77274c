"""Packed layouts for pipelines with a few layers per device: every device starts with one of
the first layers and the later layers are packed, one by one, where they cost least.

When the model has between three and eight layers per device (nemotron-h-56b on 16 or 32
devices), every contiguous layout (the V, the folds and loops) ends up with devices several
layers heavier than others: stage boundaries must fall where the layer costs allow. Here
device ``d`` holds layer ``d`` for ``d < p`` (every device starts within the forwards of the
first ``p`` layers, as in ``matched.py``), and the later layers are placed one at a time,
heaviest first, on the device whose fill-model need (``fill_partition.device_need``) grows
least; a descent then moves or swaps single layers off the neediest device while that lowers
its need below the old one. Each layer is a stage of its own unless its neighbour lands on
the same device, so these layouts have many stages; the list scheduler and the justify move
order them.

On nemotron-h-56b, 32 devices, 256 micro-batches the fill-model need is 6,775 ms (the bound
is 6,736) against 7,300 for the best contiguous layout.

>>> from octopipe_core.bounds import LayerTimes
>>> from octopipe_core.fill_partition import FillModel
>>> t = [1, 1, 2, 2, 1, 3, 1]
>>> lt = LayerTimes(t, t, t)
>>> part, place, need = packed_layout(FillModel.from_times(lt, 8), 2)
>>> sorted(place[:2]), len(part) == len(place)
([0, 1], True)
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from octopipe_core.fill_partition import FillModel, Partition, device_need, device_needs
from octopipe_core.tuner.counted import counted_layout
from octopipe_core.tuner.matched import layout_of_owners, matched_layout

MIN_PER_DEVICE = 3  # more layers per device than this ...
MAX_PER_DEVICE = 8  # ... and at most this many
MAX_ROUNDS = 4000  # descent steps (each one strictly lowers a device's need)


def packed_layout(model: FillModel, devices: int) -> tuple[Partition, list[int], float] | None:
    """The packed layout (module docstring): partition, placement and its fill-model need
    (ms, the largest over devices); None unless ``3 x devices < layers <= 8 x devices``
    or when nothing fits the model's memory budget. With fewer layers per device the V and
    the folds (two stages per device) balance about as well with fewer stages; with more,
    the many stages take too long to schedule."""
    n, p = model.num_layers, devices
    if not MIN_PER_DEVICE * p < n <= MAX_PER_DEVICE * p:
        return None
    held = [[d] for d in range(p)]  # each device's layers, its first one first

    def need(layers: list[int]) -> float:
        return device_need(model, [(i, (i, i + 1)) for i in sorted(layers)], n)

    cur = [need(h) for h in held]
    for j in sorted(range(p, n), key=lambda i: (-model.work_ms[i], i)):
        grown = [need([*held[d], j]) for d in range(p)]
        d = min(range(p), key=lambda d: (grown[d], d))
        held[d].append(j)
        cur[d] = grown[d]
    if max(cur) == float("inf"):
        return None
    for _ in range(MAX_ROUNDS):
        if not _improve(held, cur, need, model.work_ms):
            break
    owner = [0] * n
    for d, layers in enumerate(held):
        for i in layers:
            owner[i] = d
    part, place = layout_of_owners(owner)
    return part, place, max(device_needs(model, part, place))


def _improve(
    held: list[list[int]], cur: list[float], need: Callable[[list[int]], float], work: list[float]
) -> bool:
    """One descent step on the neediest devices: the best single-layer move or swap that
    lowers a device's need (and keeps the other below it); False when there is none."""
    p = len(held)
    for d in sorted(range(p), key=lambda d: -cur[d])[:4]:
        tries: list[tuple[float, int, int, int | None, float, float]] = []
        for x in held[d][1:]:  # the first layer (layer d) stays
            rest = [y for y in held[d] if y != x]
            for e in range(p):
                if e == d:
                    continue
                # move x to e, or swap it with one of e's later layers of another cost
                for back in [None, *(y for y in held[e][1:] if abs(work[y] - work[x]) > 1e-12)]:
                    nd = need(rest if back is None else [*rest, back])
                    ne = need([*(z for z in held[e] if z != back), x])
                    tries.append((max(nd, ne), x, e, back, nd, ne))
        best = min(tries, default=None, key=lambda t: t[0])
        if best is not None and best[0] < cur[d] * (1 - 1e-12):
            _top, x, e, back, nd, ne = best
            held[d].remove(x)
            held[e].append(x)
            if back is not None:
                held[e].remove(back)
                held[d].append(back)
            cur[d], cur[e] = nd, ne
            return True
    return False


Built = tuple[Partition, list[int], float] | None
# (name, builder, offered only if its need is below every earlier layout's, offered only if
# this earlier layout was), in rank order
SPREAD_BUILDERS: tuple[tuple[str, Callable[[FillModel, int], Built], bool, str | None], ...] = (
    ("matched", matched_layout, False, None),
    ("packed", packed_layout, False, None),
    ("counted", counted_layout, False, None),
    ("counted-wave", partial(counted_layout, wave=True), True, None),
    ("counted-rate", partial(counted_layout, wave=True, rate=True), False, "counted-wave"),
)


def spread_layouts(model: FillModel, devices: int) -> list[tuple[str, Partition, list[int], float]]:
    """The layouts where every device starts with one of the first layers, named: ``matched``
    (``matched.py``, up to two layers per device) or ``packed`` (three to eight), and
    ``counted`` (``counted.py``, any number) and ``counted-wave`` (the same with the forward
    wave's constraint, only where its need is below every other's: each layout offered costs
    the tuner a schedule, and where the needs tie, as on nemotron-h-8b at 8 devices and 16
    or 32 micro-batches, offering it cost 0.6 % under an 8 s budget), and ``counted-rate``
    (the wave's constraint with the forwards' delivery rate, wherever ``counted-wave`` is
    offered: its need is a little higher, but where the rate binds its schedule can be
    faster); those that fit the model's memory budget, each layout once."""
    out: list[tuple[str, Partition, list[int], float]] = []
    for name, build, only_if_lower, after in SPREAD_BUILDERS:
        if after is not None and not any(n == after for n, *_ in out):
            continue
        got = build(model, devices)
        if got is None or any(got[:2] == (part, place) for _n, part, place, _t in out):
            continue
        if only_if_lower and any(got[2] >= t * (1 - 1e-9) for *_, t in out):
            continue
        out.append((name, *got))
    return out
