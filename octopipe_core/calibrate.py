"""Fit a profile to what real runs of plans measured (``octopipe calibrate``).

A profile that times each layer alone misses what an op costs inside the pipeline: dispatch,
autograd bookkeeping, posting sends and receives, ranks slowing each other down. This module
fits the cost model of ``costs.py`` to the ops that runs recorded, by least squares over
stages, op kinds and runs:

* an op's busy time (from its start, input waits excluded, to the moment the rank is ready for
  its next op: its own compute plus the sends and receives it posts) is the sum of its stage's
  layers' times for that kind plus a fixed cost per op kind (F, B, W, fused BW), plus a fixed
  cost of posting its output when it goes to another device;
* each device's speed (its ops' time relative to the fastest device's: a slower core, a
  straggling GPU), from the same layers measured on different devices;
* per layer type and kind (F, B, W), the layer time starts from the prior profile's, scaled
  per kind (a first fit of one scale and one fixed cost per kind), and moves as far as the
  measurements say: stages made of different layers tell the types apart, so calibrate on at
  least two plans with different partitions (a ridge keeps what no run tells apart at the
  scaled prior);
* transfers: latency (and bandwidth, where messages of several sizes crossed) from the
  receives a consumer waited for, from the send's post to the consumer's start;
* the step's tail: the optimizer step per MiB of a device's weights (its ``OPT`` records),
  and the rest of the step outside the pipeline (the step's small all-reduce, set-up, at DP >
  1 the exposed gradient reduction) as one fixed time per step.

Nothing here runs a job; ``commands/calibrate.py`` runs them or reads their traces.

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> from octopipe_core.schedules import build_plan
>>> prior = Profile.from_dict(example_profile_dict())
>>> plans = [build_plan(prior, "1f1b", 2, 4, partition=p) for p in ("uniform", "balanced")]
>>> truth = prior.with_runtime(RuntimeCosts(f_op_ms=0.3, b_op_ms=0.3, w_op_ms=0.3))
>>> runs = [synthetic_run(truth, p, f"p{i}") for i, p in enumerate(plans)]
>>> fit = fit_profile(prior, runs)
>>> max(abs(e) for e in fit.step_error_pct().values()) < 1  # each run's step, in %
True
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from octopipe_core.costs import stage_costs
from octopipe_core.dp_sync import device_weight_mib
from octopipe_core.errors import OctoPipeError
from octopipe_core.plan import Plan
from octopipe_core.profile import NO_RUNTIME, Profile, RuntimeCosts

Record = tuple[int, int, str, float, float, float]  # (rank, step, op, start_s, end_s, wait_s)
TailRecord = tuple[int, int, str, float, float]  # (rank, step, name, start_s, end_s)
KINDS = ("F", "B", "W")
OP_KINDS = ("F", "B", "W", "BW")
_COMPUTE = re.compile(r"^(\d+)(BW|F|B|W)(\d+)$")
_SEND = re.compile(r"^(\d+)SEND_(F|B)(\d+)$")
WAITED_S = 1e-4  # a receive counts for the latency fit when its consumer waited this long
PRIOR_REL = 0.25  # how far (relative) a layer time may move from its scaled prior per "unit"
MIN_MS = 1e-6  # the profile's time resolution


@dataclass(frozen=True)
class RunData:
    """What one run of a plan recorded (the ``result.json`` or trace of ``octopipe run``)."""

    name: str
    """The plan's label in reports (its file name, or the peer's name)."""
    plan: Plan
    """The plan that ran."""
    records: list[Record]
    """Every op each rank ran: ``(rank, step, op, start_s, end_s, wait_s)``."""
    tail: list[TailRecord]
    """DP reductions (``<stage>DP``), the step's all-reduce (``SYNC``), optimizer (``OPT``)."""
    steps: dict[int, tuple[float, float]]
    """The measured steps (warm-up left out): step -> ``(start_s, end_s)``."""
    device_of: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Global rank -> ``(replica, pipeline device)``; empty: rank = device, one replica."""

    def where(self, rank: int) -> tuple[int, int]:
        return self.device_of.get(rank, (0, rank))

    def step_ms(self) -> list[float]:
        return [(e - s) * 1e3 for s, e in self.steps.values()]


@dataclass
class Fit:
    """A calibrated profile and how well it reproduces the runs it was fitted to."""

    profile: Profile
    runs: list[RunData]
    # per (run index, stage, kind): measured mean busy time (ms) and the op count
    observed: dict[tuple[int, int, str], tuple[float, int]]
    latency_samples: int = 0
    # computed once (the record, the report and --json all read them)
    _memo: dict[str, Any] = field(default_factory=dict, repr=False)

    def residuals(self) -> dict[str, dict[str, float]]:
        """Per op kind: ops fitted, RMS and largest error of the fitted op time against the
        measured mean (%, fitted / measured - 1)."""
        if "residuals" in self._memo:
            return dict(self._memo["residuals"])
        out: dict[str, dict[str, float]] = {}
        tables = [
            stage_costs(self.profile, r.plan.partition, r.plan.recompute).ops_on(r.plan.placement)
            for r in self.runs
        ]
        errs: dict[str, list[tuple[float, int]]] = defaultdict(list)
        for (ri, s, k), (y, n) in self.observed.items():
            if y > 0:
                errs[k].append((tables[ri].ms[k][s] / y - 1, n))
        for k in OP_KINDS:
            if not errs[k]:
                continue
            tot = sum(n for _, n in errs[k])
            rms = math.sqrt(sum(e * e * n for e, n in errs[k]) / tot)
            out[k] = {
                "ops": tot,
                "rms_pct": round(rms * 100, 2),
                "max_abs_pct": round(max(abs(e) for e, _ in errs[k]) * 100, 2),
            }
        self._memo["residuals"] = out
        return out

    def step_error_pct(self) -> dict[str, float]:
        """Per run: the calibrated profile's simulated step against the measured median (%)."""
        from octopipe_core.simulator import simulate

        if "steps" in self._memo:
            return dict(self._memo["steps"])
        out = {}
        for r in self.runs:
            pred = simulate(self.profile, r.plan, check=False).step_time_ms
            out[r.name] = round((pred / statistics.median(r.step_ms()) - 1) * 100, 2)
        self._memo["steps"] = out
        return out

    def report(self) -> list[str]:
        """The lines ``octopipe calibrate`` prints: the fitted terms, residuals, step errors."""
        rt = self.profile.runtime
        d = self.profile.device
        lines = [
            "fixed cost per op (ms): "
            + ", ".join(f"{k} {rt.op_ms(k):.4f}" for k in OP_KINDS)
            + f"; posting a send to another device {rt.send_op_ms:.4f}",
            f"transfers: latency {d.p2p_latency_us:.1f} us, bandwidth {d.p2p_gbps:.3g} GB/s "
            f"({self.latency_samples} waited receives)",
            "device speed (op time / the fastest device's): "
            + (", ".join(f"d{i} {v:.3f}" for i, v in enumerate(rt.device_speed)) or "all 1"),
            f"step tail: {rt.step_tail_ms:.3f} ms per step + optimizer "
            f"{rt.optimizer_ms_per_mib:.4g} ms per weight MiB",
            "residuals per op kind (fitted op time / measured mean - 1):",
        ]
        for k, r in self.residuals().items():
            lines.append(
                f"  {k:<2} {int(r['ops']):>6} ops  rms {r['rms_pct']:6.2f} %  "
                f"max {r['max_abs_pct']:6.2f} %"
            )
        lines.append("step, simulated with the calibrated profile / measured median - 1:")
        for name, e in self.step_error_pct().items():
            med = statistics.median(next(r for r in self.runs if r.name == name).step_ms())
            lines.append(f"  {name}: {e:+.2f} % (measured median {med:.3f} ms)")
        return lines


# ---- measurements ---------------------------------------------------------------------------
def op_busy_ms(run: RunData) -> list[tuple[int, str, float]]:
    """``(stage, kind, busy_ms)`` of every compute op of the measured steps: from its start to
    the moment its rank was ready for its next compute op (input waits excluded), i.e. its
    compute plus the sends and receives it posted; the rank's last op runs to the end of its
    last record."""
    by: dict[tuple[int, int], list[Record]] = defaultdict(list)
    for rec in run.records:
        if rec[1] in run.steps:
            by[(rec[0], rec[1])].append(rec)
    out: list[tuple[int, str, float]] = []
    for recs in by.values():
        recs.sort(key=lambda r: r[3])
        comp = [(r, m) for r in recs if (m := _COMPUTE.match(r[2])) is not None]
        last_end = max(r[4] for r in recs)
        for i, (r, m) in enumerate(comp):
            if i + 1 < len(comp):
                nxt = comp[i + 1][0]
                until = nxt[3] - nxt[5]
            else:
                until = last_end
            out.append((int(m[1]), m[2], max(0.0, until - r[3]) * 1e3))
    return out


def transfer_samples(run: RunData, prior: Profile) -> list[tuple[float, float]]:
    """``(size_mib, ms)`` of every transfer a consumer waited for: from the send's post to the
    consumer's start (the consumer waited, so that is when the message arrived)."""
    posted: dict[tuple[int, int, str], float] = {}
    for rank, step, op, _, end, _ in run.records:
        m = _SEND.match(op)
        if m is not None and step in run.steps:
            posted[(step, run.where(rank)[0], f"{m[1]}{m[2]}{m[3]}")] = end
    sizes = stage_costs(prior, run.plan.partition).output_mib
    S = run.plan.num_stages
    out = []
    for rank, step, op, start, _, wait in run.records:
        m = _COMPUTE.match(op)
        if m is None or wait < WAITED_S or step not in run.steps:
            continue
        s, k, mb = int(m[1]), m[2], m[3]
        src = s - 1 if k == "F" else s + 1
        if not 0 <= src < S or (k != "F" and s == S - 1):
            continue
        key = (step, run.where(rank)[0], f"{src}{'F' if k == 'F' else 'B'}{mb}")
        if key in posted:
            out.append((sizes[min(s, src)], (start - posted[key]) * 1e3))
    return out


def tail_samples(run: RunData, profile: Profile) -> tuple[list[float], list[tuple[float, float]]]:
    """Per measured step, the time outside the pipeline (ms: from the step's start to its first
    op, plus from its last pipeline op to its end); and ``(weight_mib, ms)`` of every optimizer
    step (``OPT`` record) with its device's weights."""
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for _, step, _, start, end, wait in run.records:
        if step in run.steps:
            first[step] = min(first.get(step, math.inf), start - wait)
            last[step] = max(last.get(step, -math.inf), end)
    outside = [
        ((first[st] - s) + (e - last[st])) * 1e3 for st, (s, e) in run.steps.items() if st in last
    ]
    costs = stage_costs(profile, run.plan.partition, run.plan.recompute)
    opt = [
        (device_weight_mib(run.plan, costs, run.where(rank)[1]), (end - start) * 1e3)
        for rank, step, name, start, end in run.tail
        if name == "OPT" and step in run.steps
    ]
    return outside, opt


# ---- least squares ---------------------------------------------------------------------------
def nnls(a: np.ndarray, b: np.ndarray, iters: int = 500) -> np.ndarray:
    """Non-negative least squares, ``min |a x - b|`` over ``x >= 0`` (Lawson and Hanson).

    >>> x = nnls(np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([2.0, -1.0]))
    >>> [round(float(v), 6) for v in x]
    [2.0, 0.0]
    """
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    tol = 1e-10 * max(1.0, float(np.abs(a).max(initial=0.0))) * max(1.0, float(np.abs(b).max()))
    for _ in range(iters):
        if passive.all() or w[~passive].max(initial=-np.inf) <= tol:
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = float(np.min(x[neg] / (x[neg] - z[neg])))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
        w = a.T @ (b - a @ x)
    return x


@dataclass(frozen=True)
class _Obs:
    """One (run, stage, kind): the measured mean busy time of its ops, its standard error,
    whether they post a send to another device, and the stage's layers by type index."""

    run: int
    stage: int
    kind: str
    mean_ms: float
    count: int
    sem_ms: float
    sends: bool
    layers: dict[int, int]
    device: int


def _observations(runs: list[RunData], types: list[str], prior: Profile) -> list[_Obs]:
    """Per (run, stage, kind): the mean busy time (a step pays every op's time: the mean,
    not a median or a trimmed mean, adds up to it) and its standard error, floored at 1 % of
    the mean (and 1 us): no op is known better than that."""
    out: list[_Obs] = []
    idx = {t: i for i, t in enumerate(types)}
    for ri, run in enumerate(runs):
        per: dict[tuple[int, str], list[float]] = defaultdict(list)
        for s, k, ms in op_busy_ms(run):
            per[(s, k)].append(ms)
        pl, n = run.plan.placement, run.plan.num_stages
        for (s, k), v in sorted(per.items()):
            kept = v
            mean = statistics.fmean(kept)
            sd = statistics.stdev(kept) if len(kept) > 1 else 0.0
            sends = (k == "F" and s + 1 < n and pl[s + 1] != pl[s]) or (
                k in ("B", "BW") and s > 0 and pl[s - 1] != pl[s]
            )
            lo, hi = run.plan.partition[s]
            layers: dict[int, int] = defaultdict(int)
            for j in range(lo, hi):
                layers[idx[prior.layers[j]]] += 1
            sem = max(sd / math.sqrt(len(kept)), 0.01 * mean, 1e-3)
            out.append(_Obs(ri, s, k, mean, len(v), sem, sends, dict(layers), pl[s]))
    return out


def fit_profile(prior: Profile, runs: list[RunData], meta: dict[str, Any] | None = None) -> Fit:
    """Fit ``prior``'s layer times, fixed costs per op, transfer latency and step tail to
    ``runs`` (see the module docstring); ``meta`` goes into the profile's ``calibration``."""
    if not runs:
        raise OctoPipeError("calibrate: no runs to fit; fix: give at least one plan or trace")
    for r in runs:
        if r.plan.partition[-1][1] != prior.num_layers:
            raise OctoPipeError(
                f"calibrate: plan {r.name} has {r.plan.partition[-1][1]} layers, the profile "
                f"{prior.num_layers}; fix: calibrate plans of the same model"
            )
        if not r.steps:
            raise OctoPipeError(
                f"calibrate: run {r.name} has no measured step; fix: run more --steps"
            )
    types = [t.name for t in prior.layer_types]
    obs = _observations(runs, types, prior)
    if not obs:
        raise OctoPipeError("calibrate: the runs recorded no compute op; fix: re-run them")
    tm = prior.type_map()
    x0 = np.array([[getattr(tm[t], f) for f in _FIELDS] for t in types])  # [type, kind]
    x, fixed, speed = _fit_ops(obs, x0)
    seen = {o.kind for o in obs}
    new_types = tuple(
        replace(
            lt,
            forward_ms=_ms(x[i, 0]),
            backward_input_ms=_ms(x[i, 1]),
            backward_weight_ms=_ms(x[i, 2]) if _ms(x[i, :].sum()) > 0 else MIN_MS,
        )
        for i, lt in enumerate(prior.layer_types)
    )
    runtime = RuntimeCosts(
        f_op_ms=_ms(fixed["F"]),
        b_op_ms=_ms(fixed["B"]),
        w_op_ms=_ms(fixed["W"]),
        bw_op_ms=_ms(fixed["BW"]) if "BW" in seen else None,
        send_op_ms=_ms(fixed["send"]),
        device_speed=tuple(round(float(v), 6) for v in speed) if len(speed) > 1 else (),
    )
    prof = replace(prior, layer_types=new_types, runtime=runtime, deployment=None)
    samples = [s for r in runs for s in transfer_samples(r, prior)]
    prof = _fit_transfers(prof, samples)
    prof = _fit_tail(prof, runs)
    observed = {(o.run, o.stage, o.kind): (o.mean_ms, o.count) for o in obs}
    fit = Fit(prof, runs, observed, len(samples))
    if meta is not None:
        rec = dict(meta, residuals=fit.residuals(), step_error_pct=fit.step_error_pct())
        fit.profile = Profile.from_dict(
            {**prof.to_dict(), "calibration": rec}, "calibrated profile"
        )
    return fit


_FIELDS = ("forward_ms", "backward_input_ms", "backward_weight_ms")
FIXED = ("F", "B", "W", "BW", "send")  # the fixed costs: per op kind, and per remote send


def _ms(v: float) -> float:
    """A fitted time as the profile stores it (0 below its resolution, 9 decimals)."""
    return 0.0 if v < MIN_MS else round(float(v), 9)


def _kind_cols(k: str) -> tuple[int, ...]:
    return (1, 2) if k == "BW" else (KINDS.index(k),)


def _fixed_row(o: _Obs, width: int, at: int) -> np.ndarray:
    """The fixed-cost part of an observation's row: its kind's cost, and the send's."""
    row = np.zeros(width)
    row[at + FIXED.index(o.kind)] = 1.0
    if o.sends:
        row[at + FIXED.index("send")] = 1.0
    return row


def _fit_ops(
    obs: list[_Obs], x0: np.ndarray, rounds: int = 16
) -> tuple[np.ndarray, dict[str, float], np.ndarray]:
    """Layer times, fixed costs and each device's speed (its ops' time relative to the
    fastest device's): the costs fitted on times divided by the devices' speeds, then each
    speed from its device's measured over fitted time (count-weighted), a few rounds."""
    speed = np.ones(max(o.device for o in obs) + 1)
    for _ in range(rounds):
        adj = [
            replace(o, mean_ms=o.mean_ms / speed[o.device], sem_ms=o.sem_ms / speed[o.device])
            for o in obs
        ]
        scale, fixed = _fit_scales(adj, x0)
        x, fixed = _fit_layers(adj, x0 * scale, fixed)
        if len(speed) == 1:
            break
        meas, fit = np.zeros(len(speed)), np.zeros(len(speed))
        for o in obs:
            meas[o.device] += o.count * o.mean_ms
            fit[o.device] += o.count * _predict(o, x, fixed)
        ratio = np.where(fit > 0, meas / np.maximum(fit, 1e-12), 1.0)
        speed = ratio / ratio.min()
    return x, fixed, speed


def _predict(o: _Obs, x: np.ndarray, fixed: dict[str, float]) -> float:
    """An observation's op time under fitted layer times and fixed costs (speed 1)."""
    ms = fixed[o.kind] + (fixed["send"] if o.sends else 0.0)
    for col in _kind_cols(o.kind):
        ms += sum(n * x[t, col] for t, n in o.layers.items())
    return ms


def _fit_scales(obs: list[_Obs], x0: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
    """One scale per kind (F, B, W) of the prior's layer times and the fixed costs (per op
    kind, per remote send): ``[a_F, a_B, a_W, c_F, c_B, c_W, c_BW, c_send]``. A fixed cost is
    an op's overhead, not its work: where the runs cannot tell it from a scale, a prior of 0
    (10 % of the kind's typical op) prefers the scale; weak rows tie what the runs cannot tell
    apart (the scales of B and W when only fused BW ran; c_B + c_W = c_BW)."""
    width = 3 + len(FIXED)
    rows, rhs = [], []
    for o in obs:
        row = _fixed_row(o, width, 3)
        for col in _kind_cols(o.kind):
            row[col] = sum(n * x0[t, col] for t, n in o.layers.items())
        rows.append(row / o.sem_ms)
        rhs.append(o.mean_ms / o.sem_ms)
    seen = {o.kind for o in obs}
    for i, k in enumerate(FIXED):
        typical = [o.mean_ms for o in obs if o.kind == k or (k == "send" and o.sends)]
        if typical:
            row = np.zeros(width)
            row[3 + i] = 1.0 / (0.1 * statistics.median(typical) + 1e-3)
            rows.append(row)
            rhs.append(0.0)
    a, b = np.array(rows), np.array(rhs)
    weak = 1e-3 * max(1.0, float(np.abs(a).max()))
    extra = []
    if "W" not in seen or "B" not in seen:
        for i, j in ((1, 2), (4, 5)):
            row = np.zeros(width)
            row[i], row[j] = weak, -weak
            extra.append(row)
    if "BW" in seen and ("B" not in seen or "W" not in seen):
        row = np.zeros(width)
        row[4], row[5], row[6] = weak, weak, -weak
        extra.append(row)
    if extra:
        a = np.vstack([a, *extra])
        b = np.concatenate([b, np.zeros(len(extra))])
    sol = nnls(a, b)
    scale = sol[:3].copy()
    for i in range(3):  # a kind with no prior time at all keeps scale 1
        if not x0[:, i].any():
            scale[i] = 1.0
    return scale, dict(zip(FIXED, (float(v) for v in sol[3:]), strict=True))


def _fit_layers(
    obs: list[_Obs], prior: np.ndarray, fixed: dict[str, float]
) -> tuple[np.ndarray, dict[str, float]]:
    """Layer times per type and kind, and the fixed costs, by least squares over every
    observation, with a ridge toward the scaled prior (``PRIOR_REL`` of each time, and 10 us)
    and toward the first fit's fixed costs (half of each, and 10 us)."""
    T = prior.shape[0]
    width = 3 * T + len(FIXED)
    rows, rhs = [], []
    for o in obs:
        row = _fixed_row(o, width, 3 * T)
        for col in _kind_cols(o.kind):
            for t, n in o.layers.items():
                row[3 * t + col] += n
        rows.append(row / o.sem_ms)
        rhs.append(o.mean_ms / o.sem_ms)
    for t in range(T):
        for col in range(3):
            row = np.zeros(width)
            sd = PRIOR_REL * prior[t, col] + 0.01
            row[3 * t + col] = 1.0 / sd
            rows.append(row)
            rhs.append(prior[t, col] / sd)
    seen = {o.kind for o in obs} | ({"send"} if any(o.sends for o in obs) else set())
    for i, k in enumerate(FIXED):
        row = np.zeros(width)
        sd = 0.5 * fixed[k] + 0.01 if k in seen else 1e-3
        row[3 * T + i] = 1.0 / sd
        rows.append(row)
        rhs.append(fixed[k] / sd)
    sol = nnls(np.array(rows), np.array(rhs))
    return sol[: 3 * T].reshape(T, 3), {k: float(sol[3 * T + i]) for i, k in enumerate(FIXED)}


def _fit_transfers(prof: Profile, samples: list[tuple[float, float]]) -> Profile:
    """Latency (and bandwidth, with messages of several sizes) of the waited receives: per
    size the mean, then ``ms = latency + size / bandwidth``. The mean, not the median: on a
    loaded CPU most messages arrive in microseconds and a few wait a scheduler slice (an I/O
    thread without a free core), and a step pays those on its critical path in proportion."""
    if not samples:
        return prof
    per: dict[float, list[float]] = defaultdict(list)
    for size, ms in samples:
        per[round(size, 9)].append(ms)
    sizes, means = [], []
    for size, v in sorted(per.items()):
        means.append(max(0.0, statistics.fmean(v)))
        sizes.append(size)
    dev = prof.device
    gbps = dev.p2p_gbps
    if len(sizes) > 1 and max(sizes) > 1.5 * min(sizes):
        a = np.array([[1.0, s * 2**20 / 1e6] for s in sizes])  # ms = lat_ms + bytes/1e6 * s_per_gb
        lat_ms, per_gb = nnls(a, np.array(means))
        if per_gb > 0:
            gbps = min(1e6, 1.0 / per_gb)
    else:
        wire = [s * 2**20 / (gbps * 1e9) * 1e3 for s in sizes]
        lat_ms = max(0.0, statistics.fmean(m - w for m, w in zip(means, wire, strict=True)))
    return prof.with_device(p2p_latency_us=round(lat_ms * 1e3, 3), p2p_gbps=round(gbps, 6))


def _fit_tail(prof: Profile, runs: list[RunData]) -> Profile:
    """The optimizer's time per weight MiB (its ``OPT`` records), then the rest of the time
    outside the pipeline as one fixed time per step (median over every measured step)."""
    opt = [s for r in runs for s in tail_samples(r, prof)[1]]
    rate = 0.0
    if opt and max(w for w, _ in opt) > 0:
        a = np.array([[1.0, w] for w, _ in opt])
        rate = float(nnls(a, np.array([ms for _, ms in opt]))[1])
    rest: list[float] = []
    for r in runs:
        costs = stage_costs(prof, r.plan.partition, r.plan.recompute)
        slowest = max(rate * device_weight_mib(r.plan, costs, d) for d in range(r.plan.num_devices))
        rest += [x - slowest for x in tail_samples(r, prof)[0]]
    step_tail = max(0.0, statistics.median(rest)) if rest else 0.0
    rt = replace(prof.runtime, step_tail_ms=_ms(step_tail), optimizer_ms_per_mib=_ms(rate))
    return prof.with_runtime(rt)


# ---- a run made up from a profile (tests and doctests) ---------------------------------------
def synthetic_run(truth: Profile, plan: Plan, name: str, steps: int = 3) -> RunData:
    """What a run of ``plan`` would record if ``truth`` were exact: each op at its simulated
    time, the step's tail after the last op. For tests of the fit (a known truth)."""
    from octopipe_core.simulator import simulate

    r = simulate(truth, plan, check=False)
    span = r.step_time_ms
    records: list[Record] = []
    spans: dict[int, tuple[float, float]] = {}
    for st in range(steps):
        t0 = 10.0 + st * (span / 1e3 + 1.0)
        spans[st] = (t0, t0 + span / 1e3)
        prev = [0.0] * plan.num_devices
        for (d, a), s, e in zip(r.ops, r.start_ms, r.end_ms, strict=True):
            # a rank idles only waiting for an input: the gap is the op's wait
            records.append((d, st, str(a), t0 + s / 1e3, t0 + e / 1e3, (s - prev[d]) / 1e3))
            prev[d] = e
    if truth.runtime == NO_RUNTIME:
        return RunData(name, plan, records, [], spans)
    tail: list[TailRecord] = [
        (t.device, st, "OPT", spans[st][0] + t.start_ms / 1e3, spans[st][0] + t.end_ms / 1e3)
        for st in range(steps)
        for t in r.tail
        if t.kind == "optimizer"
    ]
    return RunData(name, plan, records, tail, spans)
