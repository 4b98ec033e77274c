"""Rank TP x PP x DP layouts of a GPU budget for a global batch (``octopipe plan-cluster``).

For a cluster, a GPU budget ``budget`` and a global batch of ``B`` sequences (``seq`` tokens each;
a micro-batch holds ``tokens_per_microbatch / seq`` of them):

1. **enumerate** every split ``budget = TP x PP x DP`` with TP dividing a node (the profile's own
   TP degree, others derived by ``tp_scaling.scale_tp``), ``PP`` at most the layer count and
   ``B`` divisible into ``m = B / (DP x micro-batch)`` micro-batches; each in Megatron's rank
   order and in the pipeline-inside-a-node order, with and without ZeRO-1 when ``DP > 1``;
2. **screen** each with a few peer plans (1F1B/uniform, ZB-H1 and ZB-V, balanced),
   simulated on the cluster; layouts whose static memory alone exceeds the cap say so;
3. **tune** the most promising layouts, best screened throughput first, each with a share of the
   time budget, skipping any whose upper bound on tokens/GPU/s (from the compute-over-devices
   lower bound) cannot beat the best tuned one; the W order is then polished for the
   data-parallel reductions (``dp_order``).

Rows are ranked by tokens/GPU/s, fitting layouts first.

>>> from octopipe_core.cluster import Cluster, example_cluster_dict
>>> from octopipe_core.profile import Profile, example_profile_dict
>>> res = rank_layouts(Profile.from_dict(example_profile_dict()),
...                    Cluster.from_dict(example_cluster_dict()), global_batch=32, gpus=4,
...                    time_budget_s=2, tps=[1])
>>> res.best.layout.gpus, res.best.fits_memory
(4, True)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from octopipe_core.cluster import Cluster
from octopipe_core.dp_order import order_w_for_dp
from octopipe_core.errors import OctoPipeError
from octopipe_core.layout import Deployment, Layout, deploy
from octopipe_core.plan import Plan
from octopipe_core.profile import Profile
from octopipe_core.schedules import build_plan
from octopipe_core.simulator import SimResult, simulate
from octopipe_core.tp_scaling import scale_tp, tp_degrees

SCREEN_PEERS = (("1f1b", "uniform"), ("zb-h1", "balanced"), ("zbv", "balanced"))


@dataclass
class LayoutRow:
    """One layout's best plan."""

    layout: Layout
    microbatches: int
    schedule: str
    step_time_ms: float = float("inf")
    tokens_per_gpu_per_s: float = 0.0
    peak_memory_gib: float = 0.0
    fits_memory: bool = False
    why: str = ""
    plan: Plan | None = None
    profile: Profile | None = None
    tuned: bool = False
    bound_ms: float = 0.0
    peer_1f1b_ms: float | None = None
    best_peer: str = ""
    best_peer_ms: float | None = None
    tune_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "layout": self.layout.label(),
            "tp": self.layout.tp,
            "pp": self.layout.pp,
            "dp": self.layout.dp,
            "zero1": self.layout.zero1,
            "order": self.layout.order,
            "microbatches": self.microbatches,
            "schedule": self.schedule,
            "step_time_ms": None if self.plan is None else round(self.step_time_ms, 3),
            "tokens_per_gpu_per_s": round(self.tokens_per_gpu_per_s, 2),
            "peak_memory_gib": round(self.peak_memory_gib, 3),
            "fits_memory": self.fits_memory,
            "tuned": self.tuned,
            "why": self.why,
        }


@dataclass
class ClusterPlanResult:
    rows: list[LayoutRow]
    gpus: int
    global_batch: int
    search_time_s: float
    notes: list[str] = field(default_factory=list)

    @property
    def best(self) -> LayoutRow | None:
        ok = [r for r in self.rows if r.plan is not None and r.fits_memory]
        return ok[0] if ok else None


ProgressFn = Callable[[str, float], Any]  # (message, fraction done)


def enumerate_layouts(
    profile: Profile,
    cluster: Cluster,
    global_batch: int,
    gpus: int,
    seq: int | None = None,
    tps: list[int] | None = None,
    orders: tuple[str, ...] = ("tp-dp-pp", "tp-pp-dp"),
    zero: tuple[bool, ...] = (False, True),
) -> tuple[list[tuple[Layout, int]], list[str]]:
    """All valid (layout, micro-batches) pairs, and one line per rejected split saying why."""
    per_mb = micro_batch_samples(profile, seq)
    out: list[tuple[Layout, int]] = []
    notes: list[str] = []
    for tp in tps or tp_degrees(cluster):
        if gpus % tp or cluster.gpus_per_node % tp:
            continue
        for pp in range(1, gpus // tp + 1):
            if (gpus // tp) % pp:
                continue
            dp = gpus // (tp * pp)
            label = f"TP{tp} x PP{pp} x DP{dp}"
            if pp > profile.num_layers:
                notes.append(f"{label}: {pp} pipeline devices but only {profile.num_layers} layers")
                continue
            if global_batch % (dp * per_mb):
                notes.append(
                    f"{label}: global batch {global_batch} is not a multiple of DP x micro-batch "
                    f"= {dp * per_mb} sequences"
                )
                continue
            m = global_batch // (dp * per_mb)
            for order in orders if dp > 1 and pp > 1 else orders[:1]:
                for z in zero if dp > 1 else (False,):
                    out.append((Layout(pp=pp, dp=dp, tp=tp, zero1=z, order=order), m))
    return out, notes


def micro_batch_samples(profile: Profile, seq: int | None) -> int:
    """Sequences per micro-batch: ``tokens_per_microbatch / seq`` (1 when ``seq`` is None)."""
    if seq is None:
        return 1
    if seq <= 0 or profile.tokens_per_microbatch % seq:
        raise OctoPipeError(
            f"--seq {seq}: must divide the profile's tokens_per_microbatch "
            f"({profile.tokens_per_microbatch}); fix: pass the sequence length it was profiled at"
        )
    return profile.tokens_per_microbatch // seq


def _tokens_per_gpu_s(profile: Profile, lay: Layout, m: int, step_ms: float) -> float:
    if step_ms <= 0 or step_ms == float("inf"):
        return 0.0
    return m * profile.tokens_per_microbatch / (step_ms / 1e3) / (lay.tp * lay.pp)


def _static_shortfall(prof: Profile, pp: int) -> str:
    """Why a layout cannot fit even with a perfect split (static memory alone), or ''."""
    dep: Deployment = prof.deployment
    total = sum(lt.weight_mib for lt in prof.layer_costs())
    need = dep.static_mib(total) / pp / 1024
    cap = prof.device.memory_gib
    if need > cap:
        return (
            f"static memory {need:.1f} GiB per device even split evenly exceeds the "
            f"{cap:g} GiB cap (try more PP, TP or ZeRO-1)"
        )
    return ""


def _estimate(profile: Profile, cluster: Cluster, lay: Layout, m: int) -> float:
    """A cheap tokens/GPU/s guess to screen promising layouts first: the 1F1B closed form
    ``(m + pp - 1) / pp`` x per-micro-batch compute, ignoring communication and memory."""
    base = profile if lay.tp == profile.device.gpus else scale_tp(profile, lay.tp, cluster)
    per_mb = sum(lt.forward_ms + lt.backward_input_ms + lt.backward_weight_ms
                 for lt in base.layer_costs())  # fmt: skip
    step = per_mb * (m + lay.pp - 1) / lay.pp
    return _tokens_per_gpu_s(base, lay, m, step) - (0.01 if lay.order != "tp-dp-pp" else 0.0)


def screen_layout(profile: Profile, cluster: Cluster, lay: Layout, m: int) -> LayoutRow:
    """Deploy ``lay`` and simulate the screening peers; the row holds the best of them."""
    row = LayoutRow(lay, m, "")
    base = profile if lay.tp == profile.device.gpus else scale_tp(profile, lay.tp, cluster)
    try:
        prof = deploy(base, cluster, lay.pp, lay.dp, tp=lay.tp, zero1=lay.zero1, order=lay.order)
    except OctoPipeError as e:
        row.why = str(e)
        return row
    row.profile = prof
    per_mb = sum(lt.forward_ms + lt.backward_input_ms + lt.backward_weight_ms
                 for lt in prof.layer_costs())  # fmt: skip
    row.bound_ms = per_mb * m / lay.pp
    row.why = _static_shortfall(prof, lay.pp)
    best: tuple[float, str, Plan, SimResult] | None = None
    for sched, part in SCREEN_PEERS:
        try:
            plan = build_plan(prof, sched, lay.pp, m, partition=part)
        except OctoPipeError:
            continue
        r = simulate(prof, plan)
        key = (not r.fits_memory, r.step_time_ms)
        if sched == "1f1b":
            row.peer_1f1b_ms = r.step_time_ms
        if best is None or key < (not best[3].fits_memory, best[0]):
            best = (r.step_time_ms, plan.name, plan, r)
    if best is None:
        row.why = row.why or "no peer schedule can be built for this layout"
        return row
    _set(row, best[2], best[3], best[1])
    row.best_peer, row.best_peer_ms = best[1], best[0]
    if not row.fits_memory and not row.why:
        over = max(best[3].peak_memory_gib)
        row.why = f"best peer peaks at {over:.1f} GiB over the {prof.device.memory_gib:g} GiB cap"
    return row


def _set(row: LayoutRow, plan: Plan, r: SimResult, schedule: str) -> None:
    row.plan, row.schedule = plan, schedule
    row.step_time_ms = r.step_time_ms
    row.fits_memory = r.fits_memory
    row.peak_memory_gib = max(r.peak_memory_gib)
    assert row.profile is not None
    row.tokens_per_gpu_per_s = _tokens_per_gpu_s(row.profile, row.layout, row.microbatches,
                                                 r.step_time_ms)  # fmt: skip


def tune_layout(row: LayoutRow, time_budget_s: float, seed: int = 0) -> None:
    """Tune ``row``'s layout with the tuner, then order W for the reductions; keeps the best."""
    from octopipe_core.tuner import tune

    assert row.profile is not None
    prof, lay = row.profile, row.layout
    try:
        res = tune(prof, lay.pp, row.microbatches, time_budget_s=max(0.2, 0.8 * time_budget_s),
                   seed=seed, stop_at_convergence=True)  # fmt: skip
    except OctoPipeError as e:
        row.why = row.why or str(e)
        return
    pol = order_w_for_dp(prof, res.plan, time_budget_s=max(0.1, 0.2 * time_budget_s))
    r = pol.result
    row.tuned = True
    row.tune_s = res.search_time_s
    bp = res.best_peer()
    if bp is not None:
        row.best_peer, row.best_peer_ms = bp
    one_ms = res.baselines.step_ms("1f1b/uniform")
    if one_ms is not None:
        row.peer_1f1b_ms = one_ms
    if (not r.fits_memory, r.step_time_ms) < (not row.fits_memory, row.step_time_ms):
        layout_family = res.plan.meta.get("tuner", {}).get("layout", "tuned")
        pol.plan.name = f"tuned ({layout_family})"
        _set(row, pol.plan, r, pol.plan.name)
        if r.fits_memory:
            row.why = ""
    elif not r.fits_memory and res.shortfall and not row.why:
        row.why = f"tuner: {res.why or res.shortfall}"


def rank_layouts(
    profile: Profile,
    cluster: Cluster,
    global_batch: int,
    *,
    seq: int | None = None,
    gpus: int | None = None,
    time_budget_s: float = 30.0,
    layouts: list[tuple[Layout, int]] | None = None,
    tps: list[int] | None = None,
    max_tuned: int = 6,
    progress: ProgressFn | None = None,
) -> ClusterPlanResult:
    """Enumerate, screen and tune layouts; see the module docstring."""
    t0 = time.perf_counter()
    budget = cluster.total_gpus if gpus is None else gpus
    if budget < 1 or budget > cluster.total_gpus:
        raise OctoPipeError(
            f"--gpus {budget}: cluster '{cluster.name}' has {cluster.total_gpus} GPUs; "
            "fix: use a budget between 1 and that"
        )
    if global_batch < 1:
        raise OctoPipeError("--global-batch: must be >= 1; fix: pass the sequences per step")
    notes: list[str] = []
    if layouts is None:
        own = profile.device.gpus
        tps = tps or sorted({own, *(t for t in tp_degrees(cluster) if t >= own)})
        layouts, notes = enumerate_layouts(profile, cluster, global_batch, budget, seq, tps)
    if not layouts:
        raise OctoPipeError(
            f"plan-cluster: no TP x PP x DP split of {budget} GPUs fits a global batch of "
            f"{global_batch}; fix: use a multiple of the DP degree ({'; '.join(notes[:3])})"
        )
    layouts = sorted(layouts, key=lambda lm: -_estimate(profile, cluster, *lm))
    rows: list[LayoutRow] = []
    screen_share = 0.35 * time_budget_s
    for i, (lay, m) in enumerate(layouts):
        rows.append(screen_layout(profile, cluster, lay, m))
        if progress:
            progress(f"screened {lay.label()} m={m}", 0.3 * (i + 1) / len(layouts))
        # past the screening share, stop once a layout fits: "no layout fits" must mean that
        # none does, not that the budget ran out first (a busy machine screens fewer)
        if (
            time.perf_counter() - t0 > screen_share
            and i + 1 < len(layouts)
            and any(r.plan is not None and r.fits_memory for r in rows)
        ):
            notes.append(f"screening stopped after {i + 1} of {len(layouts)} layouts (budget)")
            break
    order = sorted((r for r in rows if r.plan is not None),
                   key=lambda r: (not r.fits_memory, -r.tokens_per_gpu_per_s))  # fmt: skip
    todo = order[:max_tuned]
    best_tok = 0.0
    for k, row in enumerate(todo):
        left = time_budget_s - (time.perf_counter() - t0)
        if left <= 0.2:
            notes.append(f"tuned {k} of {len(todo)} layouts within the budget")
            break
        assert row.profile is not None
        upper = _tokens_per_gpu_s(row.profile, row.layout, row.microbatches, row.bound_ms)
        if upper <= best_tok:
            notes.append(f"{row.layout.label()}: skipped, its bound cannot beat the best")
            continue
        tune_layout(row, left / (len(todo) - k))
        if row.fits_memory:
            best_tok = max(best_tok, row.tokens_per_gpu_per_s)
        if progress:
            progress(f"tuned {row.layout.label()}: {row.tokens_per_gpu_per_s:,.0f} tokens/GPU/s",
                     0.3 + 0.7 * (k + 1) / len(todo))  # fmt: skip
    rows.sort(key=lambda r: (r.plan is None, not r.fits_memory, -r.tokens_per_gpu_per_s))
    return ClusterPlanResult(rows, budget, global_batch, time.perf_counter() - t0, notes)
