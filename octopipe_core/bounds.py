"""Lower bounds on the step time of any pipeline plan, shared by the tuner and its reports.

Every bound ignores the memory cap and counts transfers only as the cheapest one
(``min_hop_ms``, the ``hop`` below) per device boundary that a chain must cross (the cap and
the real transfers can only add time), so each holds for every plan of the profile on
``devices`` devices with ``microbatches`` micro-batches. With
``f_i``, ``b_i``, ``w_i`` the F, B and W times of layer ``i`` (ms), ``m`` micro-batches and
``p`` devices:

* **total** (``total_ms``): all compute over the devices, ``m * sum(f + b + w) / p``; this is
  ``lower_bound_ms`` everywhere in OctoPipe;
* **fill and drain, any assignment** (``any_assignment_ms``): a device whose lowest layer is
  ``l`` cannot start before micro-batch 0 has gone through layers ``0..l-1``
  (``P_l = f_0 + ... + f_{l-1}``), and its F and B work must end ``Q_l = b_0 + ... + b_{l-1} +
  w_0`` before the step does (the gradient still has to go down to layer 0, whose W follows).
  Lowest layers are distinct, so the best case puts device ``d``'s lowest layer at ``d``;
  layers ``0..k`` can then only run on devices ``0..k``. The bound is the smallest ``T`` with
  ``m * work(layers 0..k) <= sum_{d <= k} max(0, T - P_d - d hop)`` for every ``k`` (and the
  same for the F+B work with ``T - P_d - Q_d - 2 d hop``: the chains to and from device ``d``
  cross the ``d`` devices with lower layers): layers split fractionally among devices,
  start-up and drain idle counted;
* **layer** (``layer_ms``): one layer's ``m`` F, B and W run on one device, after ``P_i`` and
  (F and B) ``Q_i`` before the end; with ``m = 1`` this is one micro-batch's critical path;
  the heaviest layers also pay the hops on the way to them (``layer_bound``);
* **granularity** (``granularity_ms``): layers are indivisible, so the busiest device holds at
  least the mean, the largest layer, and for each ``k`` ``k + 1`` times the ``(k p + 1)``-th
  largest layer (``k p + 1`` layers that large cannot all sit ``k`` to a device);
* **packing** (``packing_ms``): the same, exactly: the smallest capacity ``C`` such that the
  layers (few distinct costs: the model repeats its blocks) pack into ``p`` bins of size
  ``C``, decided by a breadth-first search over the counts of each layer cost left, times
  ``m``; when that search is too large, the smallest ``C`` that Martello and Toth's L2 bin
  count does not rule out;
* **fill and drain, whole layers** (``fill_packing_ms``): the any-assignment bound with
  indivisible layers and without the nesting: the smallest ``T`` such that the layers pack
  into devices whose ``k``-th (by lowest layer) holds ``m * work <= T - P_k - k hop`` and
  ``m * (f + b) <= T - P_k - Q_k - 2 k hop``, exactly, by the same search over counts
  (``fill_packing_bound``); the largest of the others when it is not larger, 0 when the
  search is too large;
* **contiguous** (``contiguous_ms``): for plans with one contiguous layer range per device
  (1F1B, ZB-H1/H2 and the ``seq`` family only): the exact minimum over such partitions of the
  largest ``start + m * load`` (fill and drain as above, plus one link latency per stage
  boundary crossed). A V or interleaved plan can beat it; it is not part of ``best_ms``.

``best_ms`` is the strongest bound that holds for every plan, and ``best_name`` says which.

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> b = plan_bounds(Profile.from_dict(example_profile_dict()), devices=2, microbatches=4)
>>> b.best_ms >= b.total_ms, b.contiguous_ms >= b.total_ms
(True, True)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import accumulate
from typing import Any

from octopipe_core.profile import Profile


@dataclass(frozen=True)
class LayerTimes:
    """Per-layer F, B and W times (ms) of one micro-batch, in model order."""

    f_ms: list[float]
    b_ms: list[float]
    w_ms: list[float]

    @staticmethod
    def of(profile: Profile) -> LayerTimes:
        """The layer times of ``profile``."""
        lts = profile.layer_costs()
        return LayerTimes(
            [lt.forward_ms for lt in lts],
            [lt.backward_input_ms for lt in lts],
            [lt.backward_weight_ms for lt in lts],
        )

    @property
    def work_ms(self) -> list[float]:
        return [f + b + w for f, b, w in zip(self.f_ms, self.b_ms, self.w_ms, strict=True)]

    @property
    def fb_ms(self) -> list[float]:
        return [f + b for f, b in zip(self.f_ms, self.b_ms, strict=True)]

    def fill_ms(self) -> list[float]:
        """``P_l``: forward time of layers ``0..l-1`` (length ``n + 1``)."""
        return [0.0, *accumulate(self.f_ms)]

    def drain_ms(self) -> list[float]:
        """``Q_l``: backward time of layers ``0..l-1`` plus layer 0's W (0 for ``l = 0``)."""
        q = [0.0, *accumulate(self.b_ms)]
        w0 = self.w_ms[0] if self.w_ms else 0.0
        return [0.0] + [x + w0 for x in q[1:]]


@dataclass(frozen=True)
class Bounds:
    """Lower bounds on the step time (ms); see the module docstring."""

    total_ms: float
    any_assignment_ms: float
    layer_ms: float
    granularity_ms: float
    contiguous_ms: float | None = None
    packing_ms: float = 0.0
    fill_packing_ms: float = 0.0

    @property
    def universal(self) -> dict[str, float]:
        """The bounds valid for every plan, by name."""
        return {
            "total": self.total_ms,
            "any_assignment": self.any_assignment_ms,
            "layer": self.layer_ms,
            "granularity": self.granularity_ms,
            "packing": self.packing_ms,
            "fill_packing": self.fill_packing_ms,
        }

    @property
    def best_ms(self) -> float:
        return max(self.universal.values())

    @property
    def best_name(self) -> str:
        u = self.universal
        return max(u, key=lambda k: (u[k], -list(u).index(k)))

    def gap_pct(self, step_ms: float) -> float:
        """How far ``step_ms`` is above ``best_ms``, in %."""
        return 100.0 * (step_ms / self.best_ms - 1.0) if self.best_ms > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        r = lambda x: None if x is None else round(x, 6)  # noqa: E731
        return {
            "total_ms": r(self.total_ms),
            "any_assignment_ms": r(self.any_assignment_ms),
            "layer_ms": r(self.layer_ms),
            "granularity_ms": r(self.granularity_ms),
            "packing_ms": r(self.packing_ms),
            "fill_packing_ms": r(self.fill_packing_ms),
            "contiguous_ms": r(self.contiguous_ms),
            "best_ms": r(self.best_ms),
            "best": self.best_name,
        }


def total_bound(work_ms: list[float], devices: int, microbatches: int) -> float:
    """All compute over the devices.

    >>> total_bound([1.0, 2.0, 3.0], 2, 4)
    12.0
    """
    return microbatches * sum(work_ms) / max(1, devices)


def _fill_level(offsets: list[float], need: float) -> float:
    """Smallest ``T`` with ``sum(max(0, T - o) for o in offsets) >= need`` (offsets sorted)."""
    acc = 0.0
    for q, o in enumerate(offsets, start=1):
        acc += o
        t = (need + acc) / q
        if q == len(offsets) or t <= offsets[q]:
            return max(t, o)
    return float("inf")  # pragma: no cover - the loop always returns


def nested_fill_bound(work_ms: list[float], offsets: list[float], microbatches: int) -> float:
    """Smallest ``T`` with ``m * sum(work[0..k]) <= sum_{d <= k} max(0, T - offsets[d])`` for
    every ``k``, ``offsets`` (non-decreasing) being the devices' earliest starts plus drains.

    >>> nested_fill_bound([2.0, 2.0], [0.0, 1.0], 1)  # layer 0 alone on device 0: T >= 2
    2.5
    """
    best = 0.0
    acc = 0.0
    p = len(offsets)
    for k, w in enumerate(work_ms):
        acc += microbatches * w
        best = max(best, _fill_level(offsets[: min(k, p - 1) + 1], acc))
    return best


def any_assignment_bound(
    lt: LayerTimes, devices: int, microbatches: int, hop_ms: float = 0.0
) -> float:
    """The fill-and-drain bound for any assignment of layers to devices (module docstring).

    Two equal layers on two devices, F = B = W = 1 ms, 2 micro-batches: device 1 cannot start
    before 1 ms, so ``2 T >= 12 + 1``: 6.5 ms (the F+B work, 8 ms, with device 1's drain of
    ``Q_1 = 2`` ms gives ``2 T >= 8 + 3``, weaker here).

    >>> any_assignment_bound(LayerTimes([1, 1], [1, 1], [1, 1]), 2, 2)
    6.5
    """
    n = len(lt.f_ms)
    p = max(1, min(devices, n))
    P, Q = lt.fill_ms(), lt.drain_ms()
    # the forward chain to device d's lowest layer enters d devices before it (one transfer
    # each), and the gradient chain back to layer 0 leaves them again
    full = nested_fill_bound(lt.work_ms, [P[d] + d * hop_ms for d in range(p)], microbatches)
    off_fb = [P[d] + Q[d] + 2 * d * hop_ms for d in range(p)]
    fb = nested_fill_bound(lt.fb_ms, off_fb, microbatches)
    return max(full, fb)


def layer_bound(
    lt: LayerTimes, microbatches: int, devices: int = 0, hop_ms: float = 0.0, heavy: int = 3
) -> float:
    """Each layer's work on one device, after its fill and (F, B) before its drain.

    With ``devices`` and a transfer time ``hop_ms``, the ``heavy`` layers with the most work
    also pay the transfers on the way: if ``k`` devices hold the layers before layer ``i``,
    the forward chain crosses at least ``k - 1`` device boundaries before it reaches ``i``,
    while those ``k`` devices share the work of layers ``0..i-1`` (fill included, the total
    form of the any-assignment bound); the bound is the best ``k`` for the plan:
    ``min_k max(A_k, P_i + (k - 1) hop + m work_i)``. An LM head heavier than a device's share
    must wait for the forward pass through every device before it.

    >>> layer_bound(LayerTimes([1.0, 1.0], [1.0, 1.0], [1.0, 1.0]), 1)  # F F B B W
    5.0
    >>> lt = LayerTimes([1.0] * 3 + [4.0], [1.0] * 3 + [4.0], [1.0] * 3 + [4.0])
    >>> layer_bound(lt, 4, devices=4, hop_ms=1.0)  # 3 light layers on 1 device, 1 hop, head
    52.0
    """
    P, Q = lt.fill_ms(), lt.drain_ms()
    m = microbatches
    best = 0.0
    work = lt.work_ms
    for i, (f, b, w) in enumerate(zip(lt.f_ms, lt.b_ms, lt.w_ms, strict=True)):
        # after the layer's last B, its W (same device) and the B chain below it (others)
        best = max(best, P[i] + m * (f + b + w), P[i] + m * (f + b) + max(Q[i], w))
    if devices < 2 or hop_ms <= 0:
        return best
    pre = [0.0, *accumulate(work)]
    p = devices
    offsets = [P[d] + d * hop_ms for d in range(min(p, len(work)))]
    for i in sorted(range(1, len(work)), key=lambda i: -work[i])[:heavy]:
        need = m * pre[i]  # the work of layers 0..i-1
        least = m * (work[i] + min(work[:i]))  # layer i's device also holds one before it
        arrive_best = float("inf")
        for k in range(1, min(p, i) + 1):
            a_k = _fill_level(offsets[:k], need)
            # layer i's device holds none of the layers before it (k hops), or some (k - 1)
            if k < p:
                arrive_best = min(arrive_best, max(a_k, P[i] + k * hop_ms + m * work[i]))
            inside = max(a_k, P[i] + (k - 1) * hop_ms + m * work[i], least)
            arrive_best = min(arrive_best, inside)
        best = max(best, arrive_best)
    return best


def granularity_bound(layer_ms: list[float], devices: int, microbatches: int = 1) -> float:
    """A proven lower bound on the busiest device's compute, layers being indivisible.

    >>> granularity_bound([1.0] * 9, 4)  # 9 equal layers on 4 devices: some device gets 3
    3.0
    """
    t = sorted(layer_ms, reverse=True)
    n, D = len(t), max(1, devices)
    lb = max(sum(t) / D, t[0] if t else 0.0)
    k = 1
    while k * D < n:
        lb = max(lb, (k + 1) * t[k * D])
        k += 1
    return lb * microbatches


def _packs(
    values: list[float], counts: list[int], bins: int, cap: float, limit: int
) -> bool | None:
    """Whether items of the given ``values`` (with ``counts``) fit in ``bins`` bins of size
    ``cap``; None when the search would exceed ``limit`` element operations."""
    import numpy as np

    shape = tuple(c + 1 for c in counts)
    size = int(np.prod(shape))
    cfgs: list[tuple[int, ...]] = []

    def gen(t: int, acc: float, cur: list[int]) -> bool:
        if t == len(values):
            if any(cur):
                cfgs.append(tuple(cur))
            return len(cfgs) * size * bins <= limit
        k = 0
        while k <= counts[t] and acc + k * values[t] <= cap * (1 + 1e-12):
            cur.append(k)
            ok = gen(t + 1, acc + k * values[t], cur)
            cur.pop()
            if not ok:
                return False
            k += 1
        return True

    if not gen(0, 0.0, []):
        return None
    reach = np.zeros(shape, dtype=bool)
    reach[(0,) * len(shape)] = True
    full = tuple(counts)
    for _ in range(bins):
        new = reach.copy()
        for c in cfgs:
            dst = tuple(slice(k, None) for k in c)
            src = tuple(slice(0, n - k) for n, k in zip(shape, c, strict=True))
            new[dst] |= reach[src]
        reach = new
        if reach[full]:
            return True
    return False


def packing_bound(
    layer_ms: list[float], devices: int, microbatches: int = 1, limit: int = 30_000_000
) -> float:
    """The exact smallest busiest-device compute over all assignments of indivisible layers
    to ``devices`` devices (bisection on the capacity, relative tolerance 1e-6, the returned
    value being infeasible hence a bound), times ``microbatches``; 0 if too large to decide.

    Sixteen layers of 27 ms, twelve of 15.5, four of 11.1 and one of 14.3 on 16 devices: each
    device holds one 27 ms layer, so one of them also gets two others (at least 22.2 ms):

    >>> round(packing_bound([27.0] * 16 + [15.5] * 12 + [11.1] * 4 + [14.3], 16), 2)
    49.2
    """
    vals: dict[float, int] = {}
    for x in layer_ms:
        k = round(x, 9)
        vals[k] = vals.get(k, 0) + 1
    values = sorted(vals, reverse=True)
    counts = [vals[v] for v in values]
    p = max(1, devices)
    g = granularity_bound(layer_ms, p)  # nothing packs below it
    lo = g * (1 + 1e-6)
    ok = _packs(values, counts, p, lo, limit)
    if ok is None:  # too large to decide exactly: Martello and Toth's L2 bin count instead
        return _l2_bound(sorted(layer_ms, reverse=True), p, g) * microbatches
    if ok:
        return g * microbatches
    # a feasible capacity: longest-processing-time greedy
    loads = [0.0] * p
    for x in sorted(layer_ms, reverse=True):
        i = loads.index(min(loads))
        loads[i] += x
    hi = max(loads)
    while hi - lo > 1e-6 * hi:
        mid = 0.5 * (lo + hi)
        ok = _packs(values, counts, p, mid, limit)
        if ok is None:
            break
        if ok:
            hi = mid
        else:
            lo = mid
    return lo * microbatches


def l2_bins(items: list[float], cap: float) -> int:
    """Martello and Toth's L2 lower bound on the number of bins of size ``cap`` that hold
    ``items`` (sorted, largest first): for each ``a <= cap / 2``, the items above ``cap - a``
    and those above ``cap / 2`` each need a bin, and the items in ``[a, cap / 2]`` fill the room
    left in the second kind before needing more.

    >>> l2_bins([8.0] * 3 + [6.0] * 4, 13.0)  # a 6 never fits next to an 8: 3 + 2 bins
    5
    """
    eps = 1e-9 * max(1.0, cap)
    half = cap / 2
    alphas = sorted({0.0, *(x for x in items if x <= half + eps)})
    best = 0
    for a in alphas:
        j1 = [x for x in items if x > cap - a + eps]
        j2 = [x for x in items if half + eps < x <= cap - a + eps]
        j3 = [x for x in items if a - eps <= x <= half + eps]
        room = len(j2) * cap - sum(j2)
        extra = max(0.0, sum(j3) - room)
        need = len(j1) + len(j2) + (int(-(-extra // cap)) if extra > eps else 0)
        best = max(best, need)
    return best


def _l2_bound(items: list[float], devices: int, lo: float) -> float:
    """Smallest capacity (bisection, 1e-6) that the L2 bin count does not rule out."""
    if l2_bins(items, lo * (1 + 1e-6)) <= devices:
        return lo
    hi = sum(items)
    lo = lo * (1 + 1e-6)
    while hi - lo > 1e-6 * hi:
        mid = 0.5 * (lo + hi)
        if l2_bins(items, mid) > devices:
            lo = mid
        else:
            hi = mid
    return lo


def _configs(
    values: list[tuple[float, float]], counts: list[int], cap_w: float, cap_fb: float, limit: int
) -> Any:
    """Every count vector ``c <= counts`` of the layer kinds ``values`` (work, F+B) whose sums
    fit ``(cap_w, cap_fb)``, as an array with its two sums; None past ``limit`` vectors."""
    import numpy as np

    rows: list[tuple[int, ...]] = []

    def gen(t: int, sw: float, sf: float, cur: list[int]) -> bool:
        if t == len(values):
            rows.append(tuple(cur))
            return len(rows) <= limit
        k = 0
        vw, vf = values[t]
        while k <= counts[t] and sw + k * vw <= cap_w and sf + k * vf <= cap_fb:
            cur.append(k)
            ok = gen(t + 1, sw + k * vw, sf + k * vf, cur)
            cur.pop()
            if not ok:
                return False
            k += 1
        return True

    if not gen(0, 0.0, 0.0, []):
        return None
    c = np.array(rows, dtype=np.int64).reshape(len(rows), len(values))
    vw = np.array([v[0] for v in values])
    vf = np.array([v[1] for v in values])
    return c, c @ vw, c @ vf


def fill_packing_bound(
    lt: LayerTimes,
    devices: int,
    microbatches: int,
    hop_ms: float = 0.0,
    floor_ms: float = 0.0,
    limit: int = 400_000_000,
    rel_tol: float = 1e-5,
) -> float:
    """The any-assignment bound with indivisible layers: the smallest ``T`` (bisection, the
    returned value infeasible hence a bound) such that the layers pack into ``p`` devices,
    the ``k``-th (by lowest layer) holding ``m x work <= T - P_k - k hop`` and
    ``m x (F+B) <= T - P_k - Q_k - 2 k hop``; ``floor_ms`` (a bound already known) when
    that is feasible, and 0 when the search would exceed ``limit`` element operations.

    Why it holds: in a plan of step ``T``, a device whose lowest layer is ``l`` does all its
    work after ``P_l`` (module docstring) and its F and B work ``Q_l`` before the end, and the
    chains to and from layer ``l`` cross every device holding a lower layer. Lowest layers are
    distinct, so the device with the ``k``-th lowest one has ``l >= k``, and ``P``, ``Q`` do not
    decrease: its loads meet the ``k``-th capacities, and the plan's layer assignment is such a
    packing. The test is exact on this relaxation: a breadth-first search over the counts of
    each layer kind placed (the model repeats its blocks), one device at a time, each taking
    a maximal set of layers that fits it; the reachable counts are closed downwards, so they
    are kept as the largest count of one kind per counts of the others.

    Two layers of 3 ms (F = B = W = 1), 4 micro-batches, 2 devices: the second device starts
    at 1 ms, so ``T = 12 + 1`` (a fractional split would give 12.5 ms):

    >>> round(fill_packing_bound(LayerTimes([1, 1], [1, 1], [1, 1]), 2, 4), 3)
    13.0
    """
    import numpy as np

    n = len(lt.f_ms)
    p = max(1, min(devices, n))
    m = microbatches
    kinds: dict[tuple[float, float], int] = {}
    for w, fb in zip(lt.work_ms, lt.fb_ms, strict=True):
        key = (round(w, 9), round(fb, 9))
        kinds[key] = kinds.get(key, 0) + 1
    # the most frequent kind last: its count is the value stored per counts of the others
    values = sorted(kinds, key=lambda v: (kinds[v], v))
    counts = [kinds[v] for v in values]
    shape = (1, *(c + 1 for c in counts[:-1]))  # a leading axis keeps the array >= 1-D
    size = int(np.prod(shape))
    P, Q = lt.fill_ms(), lt.drain_ms()
    start = [P[k] + k * hop_ms for k in range(p)]
    drain = [Q[k] + k * hop_ms for k in range(p)]
    full, last = (0, *counts[:-1]), counts[-1]
    vw = np.array([v[0] for v in values])
    vf = np.array([v[1] for v in values])
    cnt = np.array(counts)
    budget = [limit]
    table: list[Any] = []  # the configurations that fit the first device at the top T

    def caps(T: float) -> list[tuple[float, float]]:
        t = T * (1 + 1e-12)
        return [((t - start[k]) / m, (t - start[k] - drain[k]) / m) for k in range(p)]

    def feasible(T: float) -> bool | None:
        # most[x] = the largest count of the last kind placed with counts x of the others
        most = np.full(shape, -1, dtype=np.int64)
        most[(0,) * len(shape)] = 0
        c, sw, sf = table[0]
        for cw, cfb in caps(T):
            ok = (sw <= cw) & (sf <= cfb)
            room = (c < cnt) & ((sw[:, None] + vw <= cw) & (sf[:, None] + vf <= cfb))
            maximal = c[ok & ~room.any(axis=1)]
            budget[0] -= (len(maximal) + 1) * size
            if budget[0] < 0:
                return None
            if len(maximal) == 0:
                break  # later devices have even less room
            # counts y are reachable when y - row (floored at 0) was: a shifted view of
            # ``most`` padded with its first slices
            top = maximal[:, :-1].max(axis=0)
            pad = np.pad(most, [(0, 0), *((int(t), 0) for t in top)], mode="edge")
            new = most.copy()
            for row in maximal:
                shift = zip(top, row[:-1], shape[1:], strict=True)
                view = pad[(slice(None), *(slice(t - k, t - k + s) for t, k, s in shift))]
                np.maximum(new, np.where(view >= 0, view + row[-1], -1), out=new)
            most = np.minimum(new, last)
            if most[full] >= last:
                return True
        return bool(most[full] >= last)

    def check(T: float) -> bool | None:
        cap_w, cap_fb = caps(T)[0]
        got = _configs(values, counts, cap_w, cap_fb, 200_000)
        if got is None:
            return None
        table[:] = [got]
        return feasible(T)

    lo = total_bound(lt.work_ms, p, m)
    if floor_ms > lo:
        ok = check(floor_ms)
        if ok is None or ok:
            return floor_ms if ok else 0.0
        lo = floor_ms
    hi = lo * 1.02
    while True:
        ok = check(hi)
        if ok is None:
            return 0.0 if floor_ms <= 0 else lo
        if ok:
            break
        lo, hi = hi, hi + 2 * (hi - lo)
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        ok = feasible(mid)
        if ok is None:
            return lo
        if ok:
            hi = mid
        else:
            lo = mid
    return lo


def contiguous_bound(
    lt: LayerTimes, devices: int, microbatches: int, hop_ms: float = 0.0
) -> float | None:
    """Exact minimum, over partitions into ``devices`` contiguous stages (one per device), of
    the largest ``max(P_a + m * work, P_a + m * (F+B) + Q_a)`` over the stages ``[a, b)``,
    each start and drain also paying ``hop_ms`` per boundary crossed. None if fewer layers
    than devices.

    >>> contiguous_bound(LayerTimes([1, 1], [1, 1], [1, 1]), 2, 2)  # stage 1 starts at 1 ms
    7.0
    """
    from octopipe_core.fill_partition import FillModel, solve_fill

    n = len(lt.f_ms)
    if n < devices:
        return None
    model = FillModel.from_times(lt, microbatches, hop_ms=hop_ms)
    res = solve_fill(model, list(range(devices)))
    return res.objective_ms


def min_hop_ms(profile: Profile) -> float:
    """The cheapest transfer across a stage boundary (ms): latency plus size over bandwidth
    of the smallest layer output that can be sent; 0 with a cluster deployment (its links
    differ by class) or when some layer sends nothing.

    >>> from octopipe_core.profile import Profile, example_profile_dict
    >>> min_hop_ms(Profile.from_dict(example_profile_dict())) > 0
    True
    """
    if profile.deployment is not None:
        return 0.0
    outs = [lt.output_mib for lt in profile.layer_costs()[:-1]]
    if not outs or min(outs) <= 0:
        return 0.0
    return min(profile.device.transfer_ms(x) for x in outs)


def plan_bounds(
    profile: Profile, devices: int, microbatches: int, contiguous: bool = True
) -> Bounds:
    """Every bound for ``profile`` on ``devices`` devices and ``microbatches`` micro-batches.

    >>> from octopipe_core.profile import Profile, example_profile_dict
    >>> b = plan_bounds(Profile.from_dict(example_profile_dict()), 2, 4)
    >>> b.best_name in b.universal
    True
    """
    lt = LayerTimes.of(profile)
    work = lt.work_ms
    m = microbatches
    hop = min_hop_ms(profile)
    cont = contiguous_bound(lt, devices, m, hop_ms=hop) if contiguous else None
    b = Bounds(
        total_ms=total_bound(work, devices, m),
        any_assignment_ms=any_assignment_bound(lt, devices, m, hop),
        layer_ms=layer_bound(lt, m, devices, hop),
        granularity_ms=granularity_bound(work, devices, m),
        contiguous_ms=cont,
        packing_ms=packing_bound(work, devices, m),
    )
    fill = fill_packing_bound(lt, devices, m, hop, floor_ms=b.best_ms)
    b = replace(b, fill_packing_ms=fill)
    rt = profile.runtime
    if rt.has_tail or any(rt.op_ms(k) for k in ("F", "B", "W", "BW")):
        # The layer-time bounds hold with fixed costs per op too (an op costs at least its
        # layers); every device runs at least M forwards and M backwards of some stage, and
        # every step ends with its tail after the last op.
        per_dev = m * (rt.op_ms("F") + min(rt.op_ms("B") + rt.op_ms("W"), rt.op_ms("BW")))
        t = rt.step_tail_ms
        b = Bounds(
            total_ms=b.total_ms + per_dev + t,
            any_assignment_ms=b.any_assignment_ms + t,
            layer_ms=b.layer_ms + t,
            granularity_ms=b.granularity_ms + t,
            contiguous_ms=None if b.contiguous_ms is None else b.contiguous_ms + t,
            packing_ms=b.packing_ms + t,
            fill_packing_ms=b.fill_packing_ms + t,
        )
    return b
