"""Fill-aware partitioning: the contiguous partition that minimises the slowest device's
(earliest start + load), exactly, for a given placement of the stages on the devices.

Model (``FillModel``): layer ``i`` costs ``work_i`` ms (F+B+W) and ``fb_i`` ms (F+B) per
micro-batch. Stage ``s`` starting at layer ``a`` cannot start before ``P_a + s * hop``
(micro-batch 0's forwards through layers ``0..a-1`` and the transfers on the way), and its F
and B work must end ``Q_a + s * hop`` before the step does (the gradient still travels down
to layer 0). On a device with stages ``s_1 < s_2 < ...``, the forwards of ``s_k`` and later
stages cannot start before ``s_k`` does, and no backward (B, W) of any of its stages can
start before that either (it needs a full forward pass), so the device needs the largest of

    start_k + m * (F of stages s_k, s_k+1, ... + B and W of all its stages)
    start_k + m * (F of stages s_k, ... + B of all its stages) + drain_1
    start_k + m * (F and B of stages s_k, s_k+1, ...) + drain_k

over ``k``, and the objective is ``max_d need_d`` (one stage per device: start + m x load,
and start + m x (F + B) + drain). Optionally each
device must also fit a memory budget: ``sum(weight_mib) + k_s * sum(activation_mib)`` over
its stages, with ``k_s`` micro-batches in flight on stage ``s``.

``solve_fill`` bisects on the step time ``T``; each test is a dynamic programme over
contiguous layer ranges. It is exact for *nested* placements, where a device holds one or two
stages and every stage between a device's two stages belongs to a device whose stages are
all between them: ``seq`` (1F1B), ``v`` (ZB-V, DualPipeV) and the folds
``fold_placement(p, r)`` (the first ``r`` devices hold a second stage on the way back, the
rest one). A range ``[i, j)`` of layers can be filled by a nested block when a boolean matrix
``M[i, j]`` says so: a device with one stage tests the range directly; a sequence of blocks is
a boolean matrix product; a device with two stages around an inner block takes ``[i, i')``
and ``[j', j)`` around an inner fill ``[i', j')``, and only the largest feasible ``j' < j``
matters (every cost grows with the range). Other placements (loops, zigzags with three stages
per device) fall back to a descent on the same objective (``exact`` is then False).

>>> from octopipe_core.bounds import LayerTimes
>>> lt = LayerTimes([1.0] * 6, [1.0] * 6, [1.0] * 6)
>>> res = solve_fill(FillModel.from_times(lt, microbatches=4), [0, 1, 1, 0])
>>> res.partition, res.objective_ms, res.exact
([(0, 1), (1, 2), (2, 4), (4, 6)], 37.0, True)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from itertools import accumulate, pairwise
from typing import TYPE_CHECKING, Any

import numpy as np

from octopipe_core.bounds import nested_fill_bound
from octopipe_core.partition import balanced_partition

if TYPE_CHECKING:
    from octopipe_core.bounds import LayerTimes

Partition = list[tuple[int, int]]
_REL = 1e-12


@dataclass(frozen=True)
class FillModel:
    """Per-layer costs for fill-aware partitioning; see the module docstring."""

    work_ms: list[float]
    fb_ms: list[float]
    fill_ms: list[float]  # P, length n + 1
    drain_ms: list[float]  # Q, length n + 1
    microbatches: int
    hop_ms: float = 0.0
    weight_mib: list[float] | None = None
    activation_mib: list[float] | None = None
    cap_mib: float | None = None  # per device; None: no memory constraint
    inflight: tuple[float, ...] | None = None  # k_s per stage (default: stages from s to the end)
    extra: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def prefix(self) -> tuple[list[float], list[float], list[float], list[float]]:
        """Prefix sums (length ``n + 1``) of ``work_ms``, ``fb_ms``, ``weight_mib`` and
        ``activation_mib`` (zeros where the model has no memory)."""
        zeros = [0.0] * self.num_layers

        def pre(x: list[float] | None) -> list[float]:
            return [0.0, *accumulate(x or zeros)]

        return pre(self.work_ms), pre(self.fb_ms), pre(self.weight_mib), pre(self.activation_mib)

    @property
    def num_layers(self) -> int:
        return len(self.work_ms)

    @cached_property
    def forward_ms(self) -> list[float]:
        """Each layer's F (ms): the steps of ``fill_ms``."""
        return [b - a for a, b in pairwise(self.fill_ms)]

    @staticmethod
    def from_times(lt: LayerTimes, microbatches: int, hop_ms: float = 0.0) -> FillModel:
        """A time-only model from per-layer F, B and W times."""
        return FillModel(
            lt.work_ms, lt.fb_ms, lt.fill_ms(), lt.drain_ms(), microbatches, hop_ms=hop_ms
        )

    def with_memory(
        self,
        weight_mib: list[float],
        activation_mib: list[float],
        cap_mib: float,
        inflight: tuple[float, ...] | None = None,
    ) -> FillModel:
        """The same model with a per-device memory budget (MiB)."""
        return replace(
            self,
            weight_mib=list(weight_mib),
            activation_mib=list(activation_mib),
            cap_mib=cap_mib,
            inflight=inflight,
        )

    def k(self, s: int, num_stages: int) -> float:
        """Micro-batches in flight on stage ``s`` (the 1F1B depth, at most ``m``)."""
        if self.inflight is not None:
            return self.inflight[s]
        return float(min(self.microbatches, num_stages - s))


@dataclass
class FillResult:
    """The partition found, its objective (ms; None if nothing fits the memory budget),
    whether it is proven optimal for the model, and the per-device needs (ms)."""

    partition: Partition | None
    objective_ms: float | None
    exact: bool
    device_need_ms: list[float] = field(default_factory=list)
    checks: int = 0


def fold_placement(devices: int, folded: int) -> list[int]:
    """``devices`` stages in a row, then ``folded`` more back on devices ``folded-1 .. 0``.

    ``folded = 0`` is ``seq``, ``folded = devices`` is the V.

    >>> fold_placement(4, 2)
    [0, 1, 2, 3, 1, 0]
    """
    return [*range(devices), *range(folded - 1, -1, -1)]


def device_need(
    model: FillModel, stages: list[tuple[int, tuple[int, int]]], num_stages: int
) -> float:
    """``need_d`` (ms) of one device holding ``stages`` (stage index, layer range), in stage
    order, out of ``num_stages``; ``inf`` where its memory overflows."""
    if not stages:
        return 0.0
    P, Q = model.fill_ms, model.drain_ms
    m, h = model.microbatches, model.hop_ms
    pre_w, pre_fb, pw, pa = model.prefix
    f = [P[b] - P[a] for _s, (a, b) in stages]
    fb = [pre_fb[b] - pre_fb[a] for _s, (a, b) in stages]
    work = [pre_w[b] - pre_w[a] for _s, (a, b) in stages]
    bw_all = sum(work) - sum(f)
    b_all = sum(fb) - sum(f)
    drain1 = Q[stages[0][1][0]] + stages[0][0] * h
    need, f_from, fb_from = 0.0, 0.0, 0.0
    for k in range(len(stages) - 1, -1, -1):
        f_from += f[k]
        fb_from += fb[k]
        s, (a, _b) = stages[k]
        start = P[a] + s * h
        need = max(
            need,
            start + m * (f_from + bw_all),
            start + m * (f_from + b_all) + drain1,
            start + m * fb_from + Q[a] + s * h,
        )
    if model.cap_mib is not None and model.weight_mib is not None:
        mem = sum(pw[b] - pw[a] + model.k(s, num_stages) * (pa[b] - pa[a]) for s, (a, b) in stages)
        if mem > model.cap_mib * (1 + 1e-9):
            return float("inf")
    return need


def device_needs(model: FillModel, partition: Partition, placement: list[int]) -> list[float]:
    """Per-device ``need_d`` (ms) of the module docstring; ``inf`` where memory overflows."""
    D = max(placement) + 1
    stages: list[list[tuple[int, tuple[int, int]]]] = [[] for _ in range(D)]
    for s, d in enumerate(placement):
        stages[d].append((s, partition[s]))
    return [device_need(model, mine, len(partition)) for mine in stages]


def fill_objective(model: FillModel, partition: Partition, placement: list[int]) -> float:
    """The largest ``need_d`` (ms); ``inf`` if a device overflows its memory budget."""
    return max(device_needs(model, partition, placement))


# ---- nested placements -----------------------------------------------------------------------
@dataclass
class _Single:
    stage: int


@dataclass
class _Pair:
    first: int
    second: int
    inner: list[Any]


def nested_blocks(placement: list[int]) -> list[Any] | None:
    """The placement as nested blocks, or None if it is not nested (module docstring).

    >>> nested_blocks([0, 1, 1, 0])
    [_Pair(first=0, second=3, inner=[_Pair(first=1, second=2, inner=[])])]
    >>> nested_blocks([0, 1, 0, 1]) is None
    True
    """
    stages: dict[int, list[int]] = {}
    for s, d in enumerate(placement):
        stages.setdefault(d, []).append(s)
    if any(len(v) > 2 for v in stages.values()):
        return None

    def parse(lo: int, hi: int) -> list[Any] | None:
        out: list[Any] = []
        t = lo
        while t < hi:
            mine = stages[placement[t]]
            if len(mine) == 1:
                out.append(_Single(t))
                t += 1
                continue
            a, b = mine
            if a != t or b >= hi:
                return None
            inner = parse(a + 1, b)
            if inner is None:
                return None
            out.append(_Pair(a, b, inner))
            t = b + 1
        return out

    return parse(0, len(placement))


class _Nested:
    """Feasibility matrices of a nested placement for one step time ``T``.

    A one-stage block is stored as ``jmax[i]``, the last end layer a stage starting at ``i``
    may reach (every cost grows with the range and ``jmax`` never decreases with ``i``); a
    sequence or a two-stage block as a boolean matrix ``M[i, j]``.
    """

    def __init__(self, model: FillModel, placement: list[int], blocks: list[Any]) -> None:
        self.model = model
        self.S = len(placement)
        n = model.num_layers
        self.N = n + 1
        self.idx = np.arange(self.N)
        self.pre_w, self.pre_fb, self.pre_wt, self.pre_a = map(np.array, model.prefix)
        self.P = np.array(model.fill_ms)
        self.Q = np.array(model.drain_ms)
        self.mem = model.cap_mib is not None and model.weight_mib is not None
        self.T = 0.0
        self.jmax: dict[int, np.ndarray] = {}  # id(single block) -> jmax
        self.mats: dict[int, np.ndarray] = {}  # id(pair block) -> its matrix
        self.suffix: dict[int, np.ndarray] = {}  # id(block) -> product from it to the end
        self.prv: dict[int, tuple[int, int, np.ndarray]] = {}
        self.allowed: dict[int, np.ndarray | None] = {}
        self.counts: dict[int, tuple[tuple[int, float], tuple[int, float]]] = {}
        self._count(blocks, placement)

    def _count(self, blocks: list[Any], placement: list[int]) -> None:
        """For each two-stage block: (devices, sum of earliest starts) inside and outside."""
        first: dict[int, int] = {}
        for s, d in enumerate(placement):
            first.setdefault(d, s)
        h = self.model.hop_ms
        early = {d: self.model.fill_ms[s] + s * h for d, s in first.items()}
        all_n, all_c = len(early), sum(early.values())

        def walk(bls: list[Any]) -> None:
            for bl in bls:
                if isinstance(bl, _Pair):
                    devs = {placement[t] for t in range(bl.first, bl.second + 1)}
                    c = sum(early[d] for d in devs)
                    self.counts[id(bl)] = ((len(devs), c), (all_n - len(devs), all_c - c))
                    walk(bl.inner)

        walk(blocks)

    def _mem_prefix(self, s: int) -> np.ndarray:
        return self.pre_wt + self.model.k(s, self.S) * self.pre_a

    def _caps(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        """Per start layer i: time left for m x work, and for m x (F+B)."""
        h = s * self.model.hop_ms
        t = self.T * (1 + _REL)
        start = self.P + h
        return t - start, t - start - (self.Q + h)

    def _reach(self, pre: np.ndarray, budget: np.ndarray) -> np.ndarray:
        """Per i, the largest j with ``pre[j] - pre[i] <= budget[i]`` (i if none)."""
        tol = 1e-12 * max(1.0, float(pre[-1]))
        j = np.searchsorted(pre, pre + budget + tol, side="right") - 1
        return np.maximum(j, self.idx)

    def single(self, s: int) -> np.ndarray:
        m = self.model.microbatches
        cw, cfb = self._caps(s)
        j = np.minimum(self._reach(self.pre_w, cw / m), self._reach(self.pre_fb, cfb / m))
        j = np.where((cw < 0) | (cfb < 0), self.idx, j)
        if self.mem:
            cap = np.full(self.N, (self.model.cap_mib or 0.0) * (1 + 1e-9))
            j = np.minimum(j, self._reach(self._mem_prefix(s), cap))
        return j

    def seq(self, blocks: list[Any]) -> np.ndarray:
        """``M`` of a sequence of blocks (identity if empty); stores suffix products."""
        cur = np.eye(self.N, dtype=bool)
        ident = True
        for bl in reversed(blocks):
            if isinstance(bl, _Single):
                jm = self.single(bl.stage)
                self.jmax[id(bl)] = jm
                # (single o cur)[i, j] = any cur[k, j] for k in (i, jmax[i]]
                cs = np.zeros((self.N + 1, self.N), dtype=np.int32)
                np.cumsum(cur, axis=0, out=cs[1:])
                cur = (cs[jm + 1] - cs[self.idx + 1]) > 0
            else:
                mb = self.pair(bl)
                self.mats[id(bl)] = mb
                prod = None if ident else mb.astype(np.float32) @ cur.astype(np.float32)
                cur = mb if prod is None else prod > 0.5
            ident = False
            self.suffix[id(bl)] = cur
        return cur

    def _window(self, bl: _Pair) -> tuple[np.ndarray, np.ndarray]:
        """Per start layer i, the end layers j a block on ``[i, j)`` can have at all: its
        devices (all inside) must do its work, the others the rest, each device within
        ``T`` minus the earliest start its first stage could ever have."""
        m = self.model.microbatches
        inside, outside = self.counts[id(bl)]
        u_in = (inside[0] * self.T - inside[1]) / m
        u_out = (outside[0] * self.T - outside[1]) / m
        total = float(self.pre_w[-1])
        tol = 1e-9 * max(1.0, total)
        base = self.pre_w
        jlo = np.searchsorted(base, base + (total - u_out) - tol, side="left")
        jhi = np.searchsorted(base, base + u_in + tol, side="right") - 1
        return np.maximum(jlo, self.idx + 2), np.minimum(jhi, self.N - 1)

    def _inner_rows(self, bl: _Pair, rows: np.ndarray) -> np.ndarray:
        """Start layers the inner block of ``bl`` can get from the allowed ``rows``."""
        m = self.model.microbatches
        cw, _ = self._caps(bl.first)
        reach = np.where(cw < 0, self.idx, self._reach(self.pre_w, cw / m))
        diff = np.zeros(self.N + 1, dtype=np.int64)
        src = np.nonzero(rows & (reach > self.idx))[0]
        np.add.at(diff, src + 1, 1)
        np.add.at(diff, reach[src] + 1, -1)
        return np.cumsum(diff[:-1]) > 0

    def _allow(self, blocks: list[Any], rows: np.ndarray | None) -> None:
        """Top-down: the start layers each two-stage block can be handed (None: any)."""
        for k, bl in enumerate(blocks):
            here = rows if k == 0 else None
            if isinstance(bl, _Pair):
                self.allowed[id(bl)] = here
                self._allow(bl.inner, None if here is None else self._inner_rows(bl, here))

    def pair(self, bl: _Pair) -> np.ndarray:
        m = self.model.microbatches
        N, idx = self.N, self.idx
        inner = self.seq(bl.inner)
        h, Tt = self.model.hop_ms, self.T * (1 + _REL)
        cw, cfb = self._caps(bl.first)
        drain1 = self.Q + bl.first * h
        # band of i' per i: the left stage [i, i') must fit the time left on its own
        reach = self._reach(self.pre_w, cw / m)
        reach = np.where(cw < 0, idx, reach)
        jlo, jhi = self._window(bl)
        out = np.zeros((N, N), dtype=bool)
        ok_rows = (reach > idx) & (jhi >= jlo)
        allowed = self.allowed.get(id(bl))
        if allowed is not None:
            ok_rows &= allowed
        rows = np.nonzero(ok_rows)[0]
        if len(rows) == 0:
            self.prv[id(bl)] = (0, 0, np.full((1, 1), -1, dtype=np.int64))
            return out
        width = int((reach[rows] - rows).max())
        span = int((jhi[rows] - jlo[rows]).max()) + 1
        # the sub-block of (i', j) the candidates can touch
        a0, a1 = int(rows.min()) + 1, min(N - 1, int(rows.max()) + width)
        b0, b1 = int(jlo[rows].min()), int(jhi[rows].max())
        # prv[i', j] = the largest j' < j with inner[i', j'] (-1 if none)
        lab = np.where(inner[a0 : a1 + 1], idx[None, :], -1)
        cm = np.maximum.accumulate(lab, axis=1)
        prv = np.full((a1 - a0 + 1, b1 - b0 + 1), -1, dtype=np.int64)
        lo_j = max(b0, 1)
        prv[:, lo_j - b0 :] = cm[:, lo_j - 1 : b1]
        self.prv[id(bl)] = (a0, b0, prv)
        has = prv >= 0
        pj = np.where(has, prv, 0)
        cols = idx[b0 : b1 + 1][None, :]
        start2 = self.P[pj] + bl.second * h
        gap_w = np.where(has, self.pre_w[cols] - self.pre_w[pj], np.inf)
        gap_fb = np.where(has, self.pre_fb[cols] - self.pre_fb[pj], np.inf)
        # the second stage's own drain term; then the terms counted from its start: its
        # work and all the device's B and W, or its F and B and all the device's B (the
        # largest j' is still the best: m x work falls faster than the start grows)
        alone = start2 + m * gap_fb + self.Q[pj] + bl.second * h <= Tt
        gap2 = np.where(has & alone, start2 + m * gap_w, np.inf)
        gap4 = np.where(has & alone, start2 + m * gap_fb, np.inf)
        gap_w = np.where(alone, gap_w, np.inf)
        gap_fb = np.where(alone, gap_fb, np.inf)
        ip = rows[:, None] + 1 + np.arange(width)[None, :]  # (R, B) candidate i'
        valid = ip <= reach[rows][:, None]
        ipc = np.minimum(ip, a1)
        jj = jlo[rows][:, None] + np.arange(span)[None, :]  # (R, W) candidate j
        jvalid = jj <= jhi[rows][:, None]
        jjc = np.minimum(jj, b1)

        def left(pre: np.ndarray) -> np.ndarray:
            return np.where(valid, m * (pre[ipc] - pre[rows][:, None]), np.inf)[:, :, None]

        g_i, g_j = (ipc - a0)[:, :, None], (jjc - b0)[:, None, :]
        ok = (left(self.pre_w) + m * gap_w[g_i, g_j] <= cw[rows][:, None, None]) & (
            left(self.pre_fb) + m * gap_fb[g_i, g_j] <= cfb[rows][:, None, None]
        )
        ok &= left(self.pre_w - self.P) + gap2[g_i, g_j] <= Tt
        ok &= left(self.pre_fb - self.P) + gap4[g_i, g_j] <= Tt - drain1[rows][:, None, None]
        if self.mem:
            cap = (self.model.cap_mib or 0.0) * (1 + 1e-9)
            c1, c2 = self._mem_prefix(bl.first), self._mem_prefix(bl.second)
            lm = np.where(valid, c1[ipc] - c1[rows][:, None], np.inf)
            gm = np.where(has, c2[cols] - c2[pj], np.inf)
            ok &= lm[:, :, None] + gm[g_i, g_j] <= cap
        hit = ok.any(axis=1) & jvalid
        r_idx = np.broadcast_to(rows[:, None], hit.shape)
        out[r_idx[hit], jjc[hit]] = True
        return out

    def feasible(self, blocks: list[Any], T: float) -> bool:
        self.T = T
        for d in (self.jmax, self.mats, self.suffix, self.prv, self.allowed):
            d.clear()
        start = np.zeros(self.N, dtype=bool)
        start[0] = True
        self._allow(blocks, start)
        top = self.seq(blocks)
        return bool(top[0, self.N - 1])

    # ---- reconstruction (after a feasible test) --------------------------------------------
    def rebuild(self, blocks: list[Any], i: int, j: int, out: dict[int, tuple[int, int]]) -> None:
        for k, bl in enumerate(blocks):
            if k + 1 == len(blocks):
                mid = j
            else:
                rest = self.suffix[id(blocks[k + 1])]
                if isinstance(bl, _Single):
                    row = np.zeros(self.N, dtype=bool)
                    row[i + 1 : int(self.jmax[id(bl)][i]) + 1] = True
                else:
                    row = self.mats[id(bl)][i, :]
                mid = int(np.nonzero(row & rest[:, j])[0][0])
            self._rebuild_block(bl, i, mid, out)
            i = mid

    def _rebuild_block(self, bl: Any, i: int, j: int, out: dict[int, tuple[int, int]]) -> None:
        if isinstance(bl, _Single):
            out[bl.stage] = (i, j)
            return
        m = self.model.microbatches
        a0, b0, sub = self.prv[id(bl)]

        def prv_at(ip: int) -> int:
            r, c = ip - a0, j - b0
            ok = 0 <= r < sub.shape[0] and 0 <= c < sub.shape[1]
            return int(sub[r, c]) if ok else -1

        cw, cfb = self._caps(bl.first)
        _cw2, cfb2 = self._caps(bl.second)
        pw, pfb = self.pre_w, self.pre_fb
        cap = (self.model.cap_mib or 0.0) * (1 + 1e-9)
        P, Q, h, Tt = self.P, self.Q, self.model.hop_ms, self.T * (1 + _REL)
        for ip in range(i + 1, j):
            jp = prv_at(ip)
            if jp < ip:
                continue
            start2 = P[jp] + bl.second * h
            if m * (pfb[j] - pfb[jp]) > cfb2[jp]:
                continue
            if m * (pw[ip] - pw[i] + pw[j] - pw[jp]) > cw[i]:
                continue
            if m * (pfb[ip] - pfb[i] + pfb[j] - pfb[jp]) > cfb[i]:
                continue
            bw1, b1 = (pw[ip] - P[ip]) - (pw[i] - P[i]), (pfb[ip] - P[ip]) - (pfb[i] - P[i])
            if start2 + m * (pw[j] - pw[jp] + bw1) > Tt:
                continue
            if start2 + m * (pfb[j] - pfb[jp] + b1) > Tt - (Q[i] + bl.first * h):
                continue
            if self.mem:
                c1, c2 = self._mem_prefix(bl.first), self._mem_prefix(bl.second)
                if c1[ip] - c1[i] + c2[j] - c2[jp] > cap:
                    continue
            out[bl.first] = (i, ip)
            out[bl.second] = (jp, j)
            if bl.inner:
                self.rebuild(bl.inner, ip, jp, out)
            return
        raise AssertionError("fill partition: no split found although the test passed")


# Above this many layers the exact search's (layers x layers) matrices cost more time and
# memory than a tuning budget allows (1,000 layers: minutes and GiBs); the descent is used.
EXACT_MAX_LAYERS = 320


def solve_fill(
    model: FillModel, placement: list[int], start: Partition | None = None, rel_tol: float = 1e-7
) -> FillResult:
    """The partition of ``model``'s layers into ``len(placement)`` contiguous stages that
    minimises the objective (module docstring): exact for nested placements, a descent from
    ``start`` (default: balanced stages) otherwise.

    >>> from octopipe_core.bounds import LayerTimes
    >>> lt = LayerTimes([1.0] * 4, [1.0] * 4, [1.0] * 4)
    >>> solve_fill(FillModel.from_times(lt, 8), [0, 1]).partition  # device 1 starts later
    [(0, 2), (2, 4)]
    """
    S, n = len(placement), model.num_layers
    if n < S:
        return FillResult(None, None, True)
    blocks = nested_blocks(placement)
    if blocks is None or n > EXACT_MAX_LAYERS:  # the exact search's matrices grow as n^2..n^3
        return _descent(model, placement, start)
    nest = _Nested(model, placement, blocks)
    D = max(placement) + 1
    m = model.microbatches
    P, Q = model.fill_ms, model.drain_ms
    d = min(D, n)
    lo = max(  # the any-assignment bound (bounds.py) holds for this objective too
        nested_fill_bound(model.work_ms, P[:d], m),
        nested_fill_bound(model.fb_ms, [P[k] + Q[k] for k in range(d)], m),
    )
    hi = P[-1] + m * sum(model.work_ms) + Q[-1] + 2 * S * model.hop_ms
    guesses = [balanced_partition(model.work_ms, S)]
    if start is not None and len(start) == S:
        guesses.append(list(start))
    best: Partition | None = None
    for g in guesses:
        h = fill_objective(model, g, placement)
        if h < hi:  # meets the memory budget: its objective is feasible
            best, hi = g, h
    checks = 0
    if best is None:
        checks += 1
        if not nest.feasible(blocks, hi):
            return FillResult(None, None, True, checks=checks)  # memory: nothing fits
        best, hi = _rebuild(nest, blocks, model, placement)
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        checks += 1
        if nest.feasible(blocks, mid):
            best, hi = _rebuild(nest, blocks, model, placement)  # snap to the partition found
        else:
            lo = mid
    needs = device_needs(model, best, placement)
    return FillResult(best, max(needs), True, needs, checks)


def _rebuild(
    nest: _Nested, blocks: list[Any], model: FillModel, placement: list[int]
) -> tuple[Partition, float]:
    ranges: dict[int, tuple[int, int]] = {}
    nest.rebuild(blocks, 0, model.num_layers, ranges)
    part = [ranges[s] for s in range(len(placement))]
    return part, fill_objective(model, part, placement)


def _descent(model: FillModel, placement: list[int], start: Partition | None) -> FillResult:
    """Boundary and chain moves off the device with the largest need, until none helps."""
    from octopipe_core.tuner.layouts import balance_partition

    D = max(placement) + 1
    S = len(placement)
    part = list(start) if start is not None and len(start) == S else None
    if part is None:
        part = balanced_partition(model.work_ms, S)

    def fn(p: Partition) -> list[float]:
        return [min(x, 1e300) for x in device_needs(model, p, placement)]

    part = balance_partition(model.work_ms, part, placement, D, fn)
    needs = device_needs(model, part, placement)
    obj = max(needs)
    if obj == float("inf"):
        return FillResult(part, None, False, needs)
    return FillResult(part, obj, False, needs)
