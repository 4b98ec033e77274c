"""Counted layouts: the exact fill-model packing of a model's repeated layer kinds.

Models repeat a few kinds of block (Mamba, MLP, attention, MoE, ...), so where the packed
layout (``packed.py``) places layers one at a time and descends, a device's load is fixed by
*how many* layers of each kind it holds. Device ``d`` holds layer ``d`` for ``d < p`` (every
device starts within the forwards of the first ``p`` layers, as in ``matched.py``), and a
dynamic programme over the devices, in order, on the counts of each later kind placed so far
(the most frequent kind's count stored as the value, as in ``bounds.fill_packing_bound``)
decides whether every device ``k`` fits

    m x work_k <= T - P_k - k hop    and    m x (F+B)_k <= T - P_k - Q_k - 2 k hop;

bisection on ``T`` finds the smallest such ``T``. It is the ``fill_packing`` bound's
relaxation plus the constraint that device ``k``'s lowest layer is layer ``k``, so it lands a
fraction of a percent above that bound (nemotron-h-56b, 16 devices, 128 micro-batches:
6,468 ms against 6,466; the packed layout's descent stops at 6,570). The counts then become
layers: the later layers are dealt in model order, each to the device owed one of its kind
with the most work still to follow (``_deal``), and runs of consecutive layers on one device
form one stage.

With ``wave``, every device also fits

    m x (work_k - f_k) <= T - P_p - p hop

(``f_k``: its first layer's F): its later layers, and its first layer's B and W, wait for
the forwards to reach layer ``p``. Without it, the device holding a light first layer (an
embedding) is packed as if busy from time 0, and the need lands 0.9-4.1 % above the bound
where few micro-batches meet many devices (nemotron-h-56b, 32 devices, 64 micro-batches:
1,761 ms against 1,700); with it, 0.2-0.8 % (1,706). The tuner ranks both: the
schedules realise the wave-aware layout better on some problems and worse on others
(``tuner_cells``: 3,494 -> 3,464 ms at 32 devices and 128 micro-batches; 1,843 -> 1,870 at
64 micro-batches, where the plain one stays).

With ``rate`` as well, the first layer's F counts as done before the wave only as far as the
forwards can deliver micro-batches to it: layers ``0..k`` sit on devices ``0..k``, so
micro-batch ``j`` leaves layer ``k`` no earlier than ``c_k(j) = max(c_k(j-1), c_{k-1}(j) + hop)
+ f_k`` (a flow shop), and a device whose first layer is light but sits behind heavier ones
(an attention layer behind Mamba layers) gets through only a share of its F before the
wave. Without it, that device is packed as if its first layer's F were all done by then:
on nemotron-h-56b, 32 devices, 64 micro-batches, the middle devices idled about 100 ms
more than the layout's need said (``breakdown.time_breakdown`` of the tuned plan), and with
it the tuned plan runs 1,807 ms instead of 1,843 (``tuner_cells``).

>>> from octopipe_core.bounds import LayerTimes
>>> from octopipe_core.fill_partition import FillModel
>>> t = [1, 1, 2, 2, 1, 3, 1, 2]
>>> part, place, need = counted_layout(FillModel.from_times(LayerTimes(t, t, t), 8), 3)
>>> place[:3], sorted(set(place)), need
([0, 1, 2], [0, 1, 2], 120.0)
"""

from __future__ import annotations

from itertools import product

import numpy as np

from octopipe_core.fill_partition import FillModel, Partition, device_needs
from octopipe_core.tuner.matched import layout_of_owners

MAX_STATES = 200_000  # count vectors of the kinds other than the most frequent one
MAX_CONFIGS = 20_000  # count vectors one device can hold
REL_TOL = 1e-4  # bisection stops when the step time is known to 0.01 %

Kind = tuple[float, float]


def counted_layout(
    model: FillModel, devices: int, wave: bool = False, rate: bool = False
) -> tuple[Partition, list[int], float] | None:
    """The counted layout (module docstring; ``wave``: with the forward wave's constraint,
    ``rate``: the wave's constraint, counting only the first layer's F that the forwards can
    deliver before it; it implies ``wave``): partition, placement and its fill-model need
    (ms, the largest over devices). None with at most two layers per device (the matched
    layout's range, where its exact assignment does as well with fewer stages: at 64
    devices and 128 micro-batches on nemotron-h-56b, tuning with both ended 0.4 % slower),
    when the kinds are too many for the programme (``MAX_STATES``), or when the layout
    overflows the model's memory budget."""
    n, p = model.num_layers, devices
    if n <= 2 * p or p < 1:
        return None
    key = [(round(w, 9), round(fb, 9)) for w, fb in zip(model.work_ms, model.fb_ms, strict=True)]
    total: dict[Kind, int] = {}
    for k in key[p:]:
        total[k] = total.get(k, 0) + 1
    kinds = sorted(total, key=lambda k: (total[k], k))  # the most frequent last
    counts = [total[k] for k in kinds]
    states = 1
    for c in counts[:-1]:  # Python integers: no overflow with a hundred distinct layers
        states *= c + 1
        if states > MAX_STATES:
            return None
    per = _pack(_Programme(model, p, kinds, counts, wave, rate))
    if per is None:
        return None
    owner = _deal(model, per, kinds, key, p)
    part, place = layout_of_owners(owner)
    need = max(device_needs(model, part, place))
    return None if need == float("inf") else (part, place, need)


def first_layer_flow(model: FillModel, p: int, until_ms: float) -> list[float]:
    """For each of layers ``0..p-1``, one to a device in model order: how much of its F work
    can be done before ``until_ms`` (ms per micro-batch, at most its F time), when
    micro-batches flow through those layers as fast as their F times and the hop between
    devices allow (``c_k(j) = max(c_k(j-1), c_{k-1}(j) + hop) + f_k``, micro-batch ``j``'s
    earliest finish at layer ``k``).

    >>> from octopipe_core.bounds import LayerTimes
    >>> m = FillModel.from_times(LayerTimes([1.0, 4.0, 1.0], [0, 0, 0], [0, 0, 0]), 4)
    >>> first_layer_flow(m, 3, until_ms=9.0)  # layer 2 waits on layer 1's pace
    [1.0, 2.0, 0.25]
    """
    m, h, f = model.microbatches, model.hop_ms, model.forward_ms
    out: list[float] = []
    arrive = [0.0] * m  # when micro-batch j can enter the next layer
    for k in range(p):
        done, last = 0.0, 0.0
        for j in range(m):
            last = max(last, arrive[j]) + f[k]
            arrive[j] = last + h
            done += min(f[k], max(0.0, until_ms - (last - f[k])))
        out.append(done / m)
    return out


class _Programme:
    """The feasibility test at a step time ``T`` and the counts that realise it."""

    def __init__(
        self,
        model: FillModel,
        p: int,
        kinds: list[Kind],
        counts: list[int],
        wave: bool,
        rate: bool = False,
    ) -> None:
        m, h = model.microbatches, model.hop_ms
        P, Q = model.fill_ms, model.drain_ms
        self.m, self.p, self.counts = m, p, counts
        self.lo = m * sum(model.work_ms) / p  # no step time below the mean load fits
        # wave: later layers start after the forwards reach layer p, and so do the device's
        # B and W of its first layer; None: that constraint left out
        wave_ms = P[p] + p * h  # when the forwards reach layer p
        self.wave = wave_ms if wave or rate else None
        # the first layer's F done before the wave, per micro-batch: all of it, or (rate) what
        # the forwards deliver in time
        before = first_layer_flow(model, p, wave_ms) if rate else model.forward_ms[:p]
        self.own_bw = [model.work_ms[k] - before[k] for k in range(p)]
        self.start = [P[k] + k * h for k in range(p)]
        self.drain = [Q[k] + k * h for k in range(p)]
        self.own_w = model.work_ms[:p]
        self.own_fb = model.fb_ms[:p]
        self.vw = np.array([k[0] for k in kinds])
        self.vf = np.array([k[1] for k in kinds])
        self.shape = tuple(c + 1 for c in counts[:-1])  # () with one later kind: 0-d
        self._configs: np.ndarray | None = None
        self._top = -1.0

    def caps(self, T: float) -> list[tuple[float, float]]:
        """Per device: room (ms per micro-batch) for later layers' work and F+B."""
        t, m = T * (1 + 1e-12), self.m
        out = []
        for k in range(self.p):
            cw = (t - self.start[k]) / m - self.own_w[k]
            if self.wave is not None:
                cw = min(cw, (t - self.wave) / m - self.own_bw[k])
            out.append((cw, (t - self.start[k] - self.drain[k]) / m - self.own_fb[k]))
        return out

    def configs(self, cw: float, cf: float) -> np.ndarray | None:
        """Every count vector of the kinds other than the last within ``(cw, cf)`` (rows);
        enumerated once for the largest room asked and filtered after. None if too many."""
        if cw > self._top:
            vw, vf, c = self.vw[:-1], self.vf[:-1], self.counts[:-1]
            most = [min(n, int(cw / w) if w > 0 else n) for n, w in zip(c, vw, strict=True)]
            ranges = [range(k + 1) for k in most]
            size = int(np.prod([len(r) for r in ranges]))
            if size > MAX_CONFIGS:
                return None
            made = np.array(list(product(*ranges)), dtype=np.int64).reshape(size, len(c))
            self._configs, self._top = made, cw
        rows = self._configs
        assert rows is not None
        vw, vf = self.vw[:-1], self.vf[:-1]
        ok = (rows @ vw <= cw + 1e-12) & (rows @ vf <= cf + 1e-12)
        return rows[ok]

    def run(self, T: float) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
        """Per device: the value array before it, its configs and the most of the last kind
        each config takes; None when ``T`` is infeasible (or the configs too many)."""
        last_w, last_f, last_n = float(self.vw[-1]), float(self.vf[-1]), self.counts[-1]
        most = np.full(self.shape, -1, dtype=np.int64)
        most[(0,) * len(self.shape)] = 0
        steps = []
        for cw, cf in self.caps(T):
            if cw < -1e-12 or cf < -1e-12:
                return None
            rows = self.configs(cw, cf)
            if rows is None or len(rows) == 0:
                return None
            room = np.full(len(rows), np.inf)  # how many of the last kind still fit
            if last_w > 0:
                room = np.minimum(room, (cw - rows @ self.vw[:-1]) / last_w)
            if last_f > 0:
                room = np.minimum(room, (cf - rows @ self.vf[:-1]) / last_f)
            take = np.minimum(np.floor(room + 1e-9), last_n).astype(np.int64)
            new = np.full_like(most, -1)
            for row, t in zip(rows, take, strict=True):
                src = tuple(slice(0, s - r) for s, r in zip(self.shape, row, strict=True))
                dst = tuple(slice(r, s) for s, r in zip(self.shape, row, strict=True))
                v = most[src]
                new[dst] = np.maximum(new[dst], np.where(v >= 0, np.minimum(v + t, last_n), -1))
            steps.append((most, rows, take))
            most = new
        full = tuple(self.counts[:-1])
        return steps if most[full] >= last_n else None

    def counts_of(self, steps: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> list[list[int]]:
        """Back through the programme: the count of each kind on each device."""
        y = list(self.counts[:-1])
        left = self.counts[-1]
        out: list[list[int]] = [[] for _ in range(self.p)]
        for k in range(self.p - 1, -1, -1):
            before, rows, take = steps[k]
            for row, t in zip(rows, take, strict=True):
                prev = [a - b for a, b in zip(y, row, strict=True)]
                if min(prev, default=0) < 0:
                    continue
                got = int(before[tuple(prev)])
                if got >= 0 and got + int(t) >= left:
                    mine = max(0, left - got)
                    out[k] = [*map(int, row), mine]
                    y, left = prev, left - mine
                    break
            else:  # pragma: no cover - a feasible programme always traces back
                raise AssertionError("counted layout: no configuration traces back")
        return out


def _pack(prog: _Programme) -> list[list[int]] | None:
    """Per device, the count of each later kind at the smallest feasible step time."""
    lo = prog.lo
    hi = lo * (1 + 8 * REL_TOL)
    steps = prog.run(hi)
    while steps is None:
        if hi > 4 * lo:
            return None  # the configurations grew too many before any fit
        lo, hi = hi, hi + 2 * (hi - lo)
        steps = prog.run(hi)
    while hi - lo > REL_TOL * hi:
        mid = 0.5 * (lo + hi)
        got = prog.run(mid)
        if got is None:
            lo = mid
        else:
            hi, steps = mid, got
    return prog.counts_of(steps)


def _deal(
    model: FillModel, per: list[list[int]], kinds: list[Kind], key: list[Kind], p: int
) -> list[int]:
    """The device of every layer: layer ``d`` on device ``d`` for ``d < p``; the later layers,
    in model order, each to the device most in need of its next layer among those owed one
    of its kind: the one with the most work still to follow that layer's start, its F of
    the layers not yet dealt plus all its B and W (ms per micro-batch; the fill model asks
    ``start + m x that <= T`` at each of a device's stages). A device whose first layer is
    light (an embedding) thus gets an early second layer. Against each kind's layers spread
    evenly over the model (nemotron-h-56b, 16 devices, 32 micro-batches): list-scheduled
    1,834 -> 1,792 ms; tuned, 1,729 -> 1,713 ms, and at 64 micro-batches 3,366 -> 3,318 ms
    (``tuner_cells``)."""
    n = len(key)
    f = model.forward_ms
    kf: dict[Kind, list[float]] = {}
    for i in range(p, n):
        kf.setdefault(key[i], []).append(f[i])
    mean_f = [sum(kf[k]) / len(kf[k]) for k in kinds]
    # all of a device's work but its first layer's F: nothing is dealt yet
    ahead = [
        model.work_ms[d] - f[d] + sum(c * k[0] for c, k in zip(per[d], kinds, strict=True))
        for d in range(p)
    ]
    owed = [list(row) for row in per]
    x_of = {k: x for x, k in enumerate(kinds)}
    owner = list(range(p)) + [-1] * (n - p)
    for i in range(p, n):
        x = x_of[key[i]]
        d = max((d for d in range(p) if owed[d][x]), key=lambda d: (ahead[d], -d))
        owner[i] = d
        owed[d][x] -= 1
        ahead[d] -= mean_f[x]
    return owner
