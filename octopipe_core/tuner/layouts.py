"""Stage layouts: placement families and device-load balancing of contiguous partitions.

A *layout* is a partition (contiguous layer ranges, one per stage) plus a placement (a device
per stage). Families the tuner starts from:

* ``seq``: one stage per device (1F1B, ZB-H1/H2);
* ``loop{v}``: ``v`` virtual stages per device, stage ``s`` on device ``s % p`` (interleaved);
* ``v``: two stages per device in a V (``d`` and ``2p-1-d``, ZB-V, DualPipeV);
* ``zigzag{v}``: ``v`` stages per device, the V repeated (down, up, down, ...);
* ``fold{r}``: one stage per device in a row, then ``r`` more back on devices ``r-1 .. 0``
  (a V folded only on its first ``r`` devices: the devices that start early get more work;
  the irregular layouts of large ``p``, where a full V has more stages than layers).

``balance_partition`` moves boundary layers, one at a time or in chains, from the most loaded
device towards the least loaded one until no move lowers the busiest device's load.

>>> family_placement("zigzag3", 2)
[0, 1, 1, 0, 0, 1]
>>> balance_partition([1, 1, 1, 1, 1, 3], [(0, 2), (2, 4), (4, 6)], [0, 1, 0])
[(0, 1), (1, 5), (5, 6)]
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate
from typing import NamedTuple

from octopipe_core.partition import balanced_partition

FAMILIES = ("seq", "v", "loop2", "zigzag3", "loop3", "zigzag4", "loop4")


def family_placement(family: str, devices: int) -> list[int]:
    """The placement of a layout family on ``devices`` devices."""
    p = devices
    if family == "seq":
        return list(range(p))
    if family == "v":
        return family_placement("zigzag2", p)
    if family.startswith("loop"):
        v = int(family[4:])
        return [s % p for s in range(v * p)]
    if family.startswith("zigzag"):
        v = int(family[6:])
        return [s % p if (s // p) % 2 == 0 else p - 1 - s % p for s in range(v * p)]
    if family.startswith("fold"):
        r = int(family[4:])
        if not 0 <= r <= p:
            raise ValueError(f"layout family {family!r}: fold depth must be 0..{p}")
        return [*range(p), *range(r - 1, -1, -1)]
    raise ValueError(f"unknown layout family {family!r}")


def fold_families(devices: int, num_layers: int, count: int = 4) -> list[str]:
    """Up to ``count`` fold depths strictly between ``seq`` and ``v`` that fit the layers,
    spread evenly, the deepest first.

    >>> fold_families(8, 12)
    ['fold4', 'fold3', 'fold2', 'fold1']
    >>> fold_families(64, 120, 3)
    ['fold56', 'fold37', 'fold19']
    """
    top = min(devices - 1, num_layers - devices)
    if top < 1:
        return []
    if top <= count:
        return [f"fold{r}" for r in range(top, 0, -1)]
    step = top / count
    return [f"fold{round(top - k * step)}" for k in range(count)]


def family_stages(family: str, devices: int) -> int:
    """Number of stages of a family on ``devices`` devices."""
    return len(family_placement(family, devices))


def device_loads(
    weights: list[float], partition: list[tuple[int, int]], placement: list[int], devices: int
) -> list[float]:
    """Sum of layer ``weights`` per device.

    >>> device_loads([1, 2, 3], [(0, 1), (1, 2), (2, 3)], [0, 1, 0], 2)
    [4.0, 2.0]
    """
    pre = [0.0, *accumulate(weights)]
    out = [0.0] * devices
    for (a, b), d in zip(partition, placement, strict=True):
        out[d] += pre[b] - pre[a]
    return out


Score = tuple[float, float]
DeviceFn = Callable[[list[tuple[int, int]]], list[float]]


def _score(loads: list[float]) -> Score:
    return (round(max(loads), 9), round(sum(x * x for x in loads), 6))


def load_fn(weights: list[float], placement: list[int], devices: int) -> DeviceFn:
    """Per-device loads of a partition (the default balance objective)."""
    return lambda part: device_loads(weights, part, placement, devices)


def finish_fn(
    weights: list[float],
    fwd_ms: list[float],
    hop_ms: list[float],
    placement: list[int],
    devices: int,
    microbatches: int,
) -> DeviceFn:
    """Per-device estimated finish: the time the first micro-batch reaches it (its
    forwards plus transfers) + ``microbatches`` x its load. Heavier devices then go where the
    pipeline starts early. ``hop_ms[i]`` is the transfer time of layer ``i``'s output.
    """
    fpre = [0.0, *accumulate(fwd_ms)]

    def finish(part: list[tuple[int, int]]) -> list[float]:
        loads = device_loads(weights, part, placement, devices)
        head = [float("inf")] * devices
        comm = 0.0
        for s, (a, _b) in enumerate(part):
            d = placement[s]
            if s > 0 and placement[s - 1] != d:
                comm += hop_ms[a - 1]
            head[d] = min(head[d], fpre[a] + comm)
        return [
            (h if h < float("inf") else 0.0) + microbatches * x
            for h, x in zip(head, loads, strict=True)
        ]

    return finish


def chain_moves(
    partition: list[tuple[int, int]], src: int, dst: int
) -> list[tuple[int, int]] | None:
    """Shift one layer from stage ``src`` towards stage ``dst`` along the chain between them.

    Every boundary between ``src`` and ``dst`` moves by one layer; ``None`` if a stage on the
    way would become empty.

    >>> chain_moves([(0, 2), (2, 4), (4, 6)], 0, 2)
    [(0, 1), (1, 3), (3, 6)]
    """
    if src == dst:
        return None
    part = list(partition)
    if src < dst:
        for s in range(src, dst):
            a, b = part[s]
            part[s] = (a, b - 1)
            na, nb = part[s + 1]
            part[s + 1] = (na - 1, nb)
    else:
        for s in range(src, dst, -1):
            a, b = part[s]
            part[s] = (a + 1, b)
            pa, pb = part[s - 1]
            part[s - 1] = (pa, pb + 1)
    if any(b <= a for a, b in part):
        return None
    return part


class LayerMove(NamedTuple):
    """A boundary or chain move: layers pass from stage ``src_stage`` (on ``src_device``)
    towards stage ``dst_stage`` (on ``dst_device``), giving ``partition``."""

    score: Score
    partition: list[tuple[int, int]]
    src_stage: int
    dst_stage: int
    src_device: int
    dst_device: int

    def __str__(self) -> str:
        return (
            f"layer s{self.src_stage}->s{self.dst_stage} (d{self.src_device}->d{self.dst_device})"
        )


def partition_neighbours(
    weights: list[float],
    partition: list[tuple[int, int]],
    placement: list[int],
    devices: int,
    per_device: DeviceFn | None = None,
    max_chain: int = 64,
) -> list[LayerMove]:
    """Boundary and chain moves off the busiest device, best score first.

    ``per_device`` gives the per-device values to balance (default: loads); a move's score is
    (max value, sum of squared values).
    """
    fn = per_device or load_fn(weights, placement, devices)
    loads = fn(partition)
    hi = max(range(devices), key=lambda d: loads[d])
    order = sorted(range(devices), key=lambda d: loads[d])
    targets = [d for d in order if d != hi][: max(1, min(3, devices - 1))]
    S = len(partition)
    out = []
    seen: set[tuple[tuple[int, int], ...]] = set()
    for s in (s for s in range(S) if placement[s] == hi):
        for t in range(S):
            if t == s or abs(t - s) > max_chain:
                continue
            if placement[t] not in targets and abs(t - s) != 1:
                continue
            part = chain_moves(partition, s, t)
            if part is None:
                continue
            key = tuple(part)
            if key in seen:
                continue
            seen.add(key)
            out.append(LayerMove(_score(fn(part)), part, s, t, hi, placement[t]))
    out.sort(key=lambda x: x[0])
    return out


def balance_partition(
    weights: list[float],
    partition: list[tuple[int, int]],
    placement: list[int],
    devices: int | None = None,
    per_device: DeviceFn | None = None,
    max_steps: int = 10_000,
) -> list[tuple[int, int]]:
    """Descend on (max, sum of squares) of ``per_device`` (default: device loads) with
    boundary and chain moves off the busiest device."""
    D = devices if devices is not None else max(placement) + 1
    fn = per_device or load_fn(weights, placement, D)
    part = list(partition)
    cur = _score(fn(part))
    for _ in range(max_steps):
        nb = partition_neighbours(weights, part, placement, D, fn)
        if not nb or nb[0].score >= cur:
            break
        cur, part = nb[0].score, nb[0].partition
    return part


def family_partition(
    weights: list[float], family: str, devices: int, per_device: DeviceFn | None = None
) -> list[tuple[int, int]]:
    """Stage-balanced partition for a family, then balanced over devices (``per_device``
    values, default loads)."""
    place = family_placement(family, devices)
    part = balanced_partition(weights, len(place))
    return balance_partition(weights, part, place, devices, per_device)
