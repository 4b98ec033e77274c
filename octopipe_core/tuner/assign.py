"""Reassigned layouts: any layer on any device, by a descent on the fill model.

The layout families keep each device's layers in a few contiguous blocks, and the packed
layout (``packed.py``) fixes layer ``d`` on device ``d``. With a few layers per device and
large micro-batch counts, both can leave one device a layer heavier than the bound allows
(jamba-v0.1, 8 devices, 64 micro-batches: the tuned layout needs 5,608 ms where the bound is
5,473). Here, starting from the current plan's layout, each layer may go to any device:

1. a steepest descent over every single-layer move and every swap of two layers of different
   cost, on the fill model's per-device needs of the resulting layout
   (``fill_partition.device_needs``; each maximal run of layers on one device is a stage),
   minimising the largest need and then the sum of squared needs (so that plateaus of the
   largest still move);
2. from the best layout so far, a few random swaps (a kick) and the descent again,
   ``rounds`` times, with a seeded generator.

The distinct local optima with the smallest largest need come back as layouts (partition,
placement, need), best first; the tuner list-schedules and justifies each, since the fill
model does not say which of them its schedules realise best.

>>> from octopipe_core.bounds import LayerTimes
>>> from octopipe_core.fill_partition import FillModel
>>> t = [1, 3, 1, 3, 2, 2]
>>> model = FillModel.from_times(LayerTimes(t, t, t), 8)
>>> got = reassigned_layouts(model, [0, 0, 0, 1, 1, 1], 2, rounds=4)
>>> got[0][2] < model_need(model, [0, 0, 0, 1, 1, 1], 2)
True
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

from octopipe_core.fill_partition import FillModel, Partition, device_needs
from octopipe_core.tuner.matched import layout_of_owners

MAX_LAYERS = 64  # more layers make every descent step too slow for a placement phase
ROUNDS = 40  # kicks (a few seconds on 34 layers and 8 devices)
KICK_SWAPS = 2

Score = tuple[float, float]


def model_needs(model: FillModel, owner: list[int], devices: int) -> list[float]:
    """Per-device fill-model needs (ms) of the layout the layer-to-device map ``owner``
    gives (each maximal run of layers on one device is a stage)."""
    part, place = layout_of_owners(owner)
    needs = device_needs(model, part, place)
    return needs + [0.0] * (devices - len(needs))


def model_need(model: FillModel, owner: list[int], devices: int) -> float:
    """The largest of :func:`model_needs` (ms)."""
    return max(model_needs(model, owner, devices))


def _score(needs: list[float]) -> Score:
    return (round(max(needs), 6), round(sum(x * x for x in needs), 3))


def _neighbours(owner: list[int], work: list[float], devices: int) -> Iterator[list[int]]:
    """Every map one step from ``owner``: a layer moved to another device (never a device's
    last layer), or two layers of different cost on different devices swapped."""
    count = [owner.count(d) for d in range(devices)]
    for i, d in enumerate(owner):
        if count[d] > 1:
            for e in range(devices):
                if e != d:
                    yield [*owner[:i], e, *owner[i + 1 :]]
        for j in range(i + 1, len(owner)):
            if owner[j] != d and abs(work[i] - work[j]) > 1e-12:
                trial = list(owner)
                trial[i], trial[j] = owner[j], d
                yield trial


def _descend(
    model: FillModel, owner: list[int], devices: int, deadline: float | None = None
) -> Score:
    """Steepest descent in place (module docstring, step 1) until no move improves or
    ``deadline`` (``time.perf_counter()``) passes; returns the final score."""
    cur = _score(model_needs(model, owner, devices))
    while deadline is None or time.perf_counter() < deadline:
        scored = (
            (_score(model_needs(model, t, devices)), t)
            for t in _neighbours(owner, model.work_ms, devices)
        )
        best = min(scored, default=None, key=lambda st: st[0])
        if best is None or best[0] >= cur:
            return cur
        cur, owner[:] = best
    return cur


def reassigned_layouts(
    model: FillModel,
    owner: list[int],
    devices: int,
    count: int = 3,
    rounds: int = ROUNDS,
    seed: int = 0,
    deadline: float | None = None,
) -> list[tuple[Partition, list[int], float]]:
    """Up to ``count`` layouts from the descent with kicks (module docstring), starting from
    the map ``owner`` (layer -> device); each is (partition, placement, largest need in ms),
    best first. Rounds stop at ``deadline`` (``time.perf_counter()``). Empty when the model
    has more than ``MAX_LAYERS`` layers or fewer layers than devices."""
    n, p = model.num_layers, devices
    if n > MAX_LAYERS or n < p or len(owner) != n:
        return []
    rng = random.Random(seed)
    cur = list(owner)
    if len(set(cur)) < p:
        return []
    found: dict[tuple[int, ...], Score] = {}
    best: tuple[Score, list[int]] | None = None
    for k in range(rounds + 1):
        if k > 0 and deadline is not None and time.perf_counter() > deadline:
            break
        s = _descend(model, cur, p, deadline)
        found[tuple(cur)] = s
        if best is None or s < best[0]:
            best = (s, list(cur))
        cur = list(best[1])
        for _k in range(KICK_SWAPS):
            i, j = rng.sample(range(n), 2)
            cur[i], cur[j] = cur[j], cur[i]
    out = []
    for key, s in sorted(found.items(), key=lambda kv: kv[1])[:count]:
        if s[0] == float("inf"):
            break
        part, place = layout_of_owners(list(key))
        out.append((part, place, s[0]))
    return out
