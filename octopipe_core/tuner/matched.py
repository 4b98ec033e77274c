"""Matched layouts for wide pipelines: every device starts with one of the first layers, and
each later layer goes where it costs least (an exact bottleneck assignment).

With fewer than two layers per device (nemotron-h-56b: 120 layers on 64 devices) the V and
the folds give the devices late in the first pass a full load *and* a long start-up fill (the
forwards of every layer before theirs), while the devices at the end of the model idle with
one light layer each. Here device ``d`` holds layer ``d`` for ``d < p``, so every device starts
within the forwards of the first ``p`` layers, and each of the remaining ``n - p`` layers is
paired with its own device by minimising the largest fill-model need (``fill_partition``):
bisection on the need over the candidate pairs, each test a bipartite matching. Among layouts
of this shape (device ``d``: layer ``d`` and at most one later layer) it is optimal for the
fill model. Consecutive layers that land on one device are merged into one stage.

On nemotron-h-56b, 64 devices, 512 micro-batches the fill-model need is 7,327 ms against
7,460 for the best fold, and the list-scheduled plan 7,431 ms against the tuned fold's 7,460.

>>> from octopipe_core.bounds import LayerTimes
>>> from octopipe_core.fill_partition import FillModel
>>> lt = LayerTimes([1, 1, 1, 2, 2], [1, 1, 1, 2, 2], [1, 1, 1, 2, 2])
>>> part, place, need = matched_layout(FillModel.from_times(lt, 8), 3)
>>> part, place
([(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)], [0, 1, 2, 1, 0])
"""

from __future__ import annotations

from octopipe_core.fill_partition import FillModel, Partition, device_need, device_needs

_INF = float("inf")


def _matching(allowed: list[list[int]], devices: int) -> list[int] | None:
    """A device for every late layer (``allowed[j]``: the devices it may go to), no device
    twice (Kuhn's augmenting paths); None if there is none."""
    owner = [-1] * devices  # late layer held by each device

    def augment(j: int, seen: list[bool]) -> bool:
        for d in allowed[j]:
            if not seen[d]:
                seen[d] = True
                if owner[d] < 0 or augment(owner[d], seen):
                    owner[d] = j
                    return True
        return False

    for j in range(len(allowed)):
        if not augment(j, [False] * devices):
            return None
    where = [-1] * len(allowed)
    for d, j in enumerate(owner):
        if j >= 0:
            where[j] = d
    return where


def matched_layout(model: FillModel, devices: int) -> tuple[Partition, list[int], float] | None:
    """The matched layout (module docstring): partition, placement and its fill-model need
    (ms, the largest over devices); None unless ``devices < layers <= 2 x devices`` or when
    nothing fits the model's memory budget."""
    n, p = model.num_layers, devices
    if not p < n <= 2 * p:
        return None
    late = list(range(p, n))
    alone = [device_need(model, [(d, (d, d + 1))], n) for d in range(p)]
    need = [
        [device_need(model, [(d, (d, d + 1)), (j, (j, j + 1))], n) for d in range(p)] for j in late
    ]
    floor = max(alone)
    values = sorted({x for row in need for x in row if floor <= x < _INF})
    if floor == _INF or not values:
        return None

    def assign(limit: float) -> list[int] | None:
        allowed = [sorted((d for d in range(p) if row[d] <= limit), key=row.__getitem__)
                   for row in need]  # fmt: skip
        return _matching(allowed, p)

    lo, hi = 0, len(values) - 1
    best = assign(values[hi])
    if best is None:
        return None
    while lo < hi:  # the smallest need value with a matching
        mid = (lo + hi) // 2
        got = assign(values[mid])
        if got is None:
            lo = mid + 1
        else:
            hi, best = mid, got
    part, place = layout_of_owners(list(range(p)) + best)
    return part, place, max(device_needs(model, part, place))


def layout_of_owners(owner: list[int]) -> tuple[Partition, list[int]]:
    """Stages and their devices from the device of each layer: runs of consecutive layers on
    one device form one stage.

    >>> layout_of_owners([0, 1, 1, 0])
    ([(0, 1), (1, 3), (3, 4)], [0, 1, 0])
    """
    part: Partition = []
    place: list[int] = []
    for i, d in enumerate(owner):
        if place and place[-1] == d:
            part[-1] = (part[-1][0], i + 1)
        else:
            part.append((i, i + 1))
            place.append(d)
    return part, place
