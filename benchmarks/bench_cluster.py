"""Cluster planning: simulation speed at 8,192 GPUs, plan-cluster time, cluster-aware gains,
and strong / weak scaling from 64 to 8,192 GPUs.

Run:  python benchmarks/bench_cluster.py [--quick] [--out docs/benchmarks-cluster.md]

Sections (all on the bundled cluster samples, all figures simulated):

1. one simulation of a whole 8,192-GPU layout (1,024 nodes x 8 GPUs): wall time;
2. ``plan-cluster`` on 128 GPUs (16 nodes x 8, 400 Gb/s per GPU): wall time and the best layouts;
3. at TP1 x PP8 x DP16 on that cluster, for heterogeneous profiles: 1F1B/uniform and every peer
   against the cluster-aware tuned plan, and what the cluster-aware placement and W order gain
   over the plan tuned on a flat network (today's single-pipeline tuner), and over the same tuned
   plan with every gradient reduction left at the end of the step;
4. strong scaling (global batch fixed) and weak scaling (global batch growing with the GPUs):
   1F1B/uniform, the best peer and the tuned plan in tokens/GPU/s per point, at the layout
   ``plan-cluster`` picked, with the time of one simulation and of the search. An SVG chart is
   written beside the report.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from octopipe_core.cluster import load_cluster_sample
from octopipe_core.cluster_plan import rank_layouts
from octopipe_core.dp_order import order_w_for_dp
from octopipe_core.layout import deploy
from octopipe_core.peers import peer_table
from octopipe_core.profile import load_sample
from octopipe_core.scaling import ScalingPoint, scaling_study
from octopipe_core.schedules import build_plan
from octopipe_core.simulator import simulate
from octopipe_core.tuner import tune


def md_table(rows: list[list[object]], head: list[str]) -> str:
    def f(x: object) -> str:
        if isinstance(x, float):
            return f"{x:,.1f}" if abs(x) >= 100 else f"{x:.3f}"
        return "-" if x is None else str(x)

    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(f(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def sim_8192() -> str:
    c = load_cluster_sample("1024x8-h800-ib400")
    rows = []
    for name, tp_prof, pp, m, sched in (
        ("nemotron-h-8b", None, 8, 64, "zb-h1"),
        ("nemotron-h-8b", None, 32, 128, "zb-h1"),
        ("nemotron-h-8b", None, 16, 256, "zbv"),
        ("nemotron-h-56b", None, 32, 256, "1f1b"),
    ):
        prof = load_sample(name) if tp_prof is None else tp_prof
        dp = 8192 // (prof.device.gpus * pp)
        p = deploy(prof, c, pp, dp, zero1=True)
        plan = build_plan(p, sched, pp, m, partition="balanced")
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            r = simulate(p, plan)
            best = min(best, time.perf_counter() - t)
        rows.append([name, p.deployment.layout.label(), m, sched, best, r.step_time_ms,
                     r.exposed_tail_ms, r.tokens_per_gpu_per_s])  # fmt: skip
        print(f"[8192] {rows[-1]}", flush=True)
    head = ["profile", "layout (8,192 GPUs)", "microbatches", "schedule", "simulate_s (best of 3)",
            "step_time_ms", "exposed_tail_ms", "tokens/GPU/s"]  # fmt: skip
    return md_table(rows, head)


def plan_cluster_128(budget: float) -> str:
    c = load_cluster_sample("16x8-h800-ib400")
    out = []
    for name, batch in (("nemotron-h-8b", 512), ("jamba-v0.1", 256)):
        t = time.perf_counter()
        res = rank_layouts(load_sample(name), c, batch, time_budget_s=budget)
        wall = time.perf_counter() - t
        rows = [[i + 1, r.layout.label(), r.layout.order, r.microbatches, r.schedule,
                 r.step_time_ms, r.tokens_per_gpu_per_s, r.peak_memory_gib, r.fits_memory]
                for i, r in enumerate(res.rows[:5])]  # fmt: skip
        print(f"[plan-cluster] {name}: {wall:.1f} s, {len(res.rows)} layouts", flush=True)
        out.append(
            f"**{name}**, global batch {batch}: {len(res.rows)} layouts ranked in "
            f"**{wall:.1f} s** (goal 60 s; budget {budget:g} s)\n\n"
            + md_table(rows, ["rank", "layout", "order", "microbatches", "schedule",
                              "step_time_ms", "tokens/GPU/s", "peak_memory_gib", "fits"])
        )  # fmt: skip
    return "\n\n".join(out)


def cluster_gain(budget: float) -> str:
    c = load_cluster_sample("16x8-h800-ib400")
    rows = []
    for name in ("nemotron-h-8b", "jamba-v0.1"):
        flat_prof = load_sample(name)
        for order in ("tp-dp-pp", "tp-pp-dp"):
            pp, dp, m = 8, 16, 32
            p = deploy(flat_prof, c, pp, dp, order=order)
            peers = peer_table(p, pp, m)
            best = peers.best()
            one_ms = peers.step_ms("1f1b/uniform")
            assert best is not None and best.step_time_ms is not None and one_ms is not None
            res = tune(p, pp, m, time_budget_s=budget)
            tuned = order_w_for_dp(p, res.plan)
            t_ms = tuned.step_time_ms
            flat = tune(flat_prof.with_device(memory_gib=c.gpu_memory_gib), pp, m,
                        time_budget_s=budget)  # fmt: skip
            flat_on_cluster = simulate(p, flat.plan).step_time_ms
            p_end = deploy(flat_prof, c, pp, dp, order=order, overlap_grad_reduce=False)
            at_end = simulate(p_end, tuned.plan).step_time_ms
            both = simulate(p_end, flat.plan).step_time_ms  # flat-tuned, reductions at end
            rows.append([
                name, order, one_ms, best.key, best.step_time_ms,
                t_ms, one_ms / t_ms, best.step_time_ms / t_ms,
                flat_on_cluster, flat_on_cluster / t_ms, at_end, at_end / t_ms,
                both, both / t_ms, tuned.result.fits_memory,
            ])  # fmt: skip
            print(f"[gain] {rows[-1]}", flush=True)
    head = ["profile", "order", "1f1b/uniform ms", "best fitting peer", "peer ms", "tuned ms",
            "x vs 1f1b", "x vs best peer", "flat-tuned plan on cluster ms", "x vs flat-tuned",
            "tuned, reductions at end ms", "x vs reductions at end",
            "flat-tuned, reductions at end ms", "x vs both", "fits"]  # fmt: skip
    return md_table(rows, head)


def scaling(kind: str, gpus: list[int], budget: float) -> list[ScalingPoint]:
    prof = load_sample("nemotron-h-8b")
    c = load_cluster_sample("1024x8-h800-ib400")
    return scaling_study(
        prof, c, kind, gpus, global_batch=1024, sequences_per_gpu=0.5, time_budget_s=budget,
        max_tuned=2, tps=[1, 2, 4, 8],
        progress=lambda msg, f: print(f"[scaling] {msg}", flush=True),
    )  # fmt: skip


def scaling_table(points: list[ScalingPoint]) -> str:
    rows = [[p.gpus, p.global_batch, p.layout, p.microbatches, p.schedule,
             p.one_f_one_b_tokens_per_gpu_per_s, p.best_peer, p.best_peer_tokens_per_gpu_per_s,
             p.tuned_tokens_per_gpu_per_s,
             (p.tuned_tokens_per_gpu_per_s / p.one_f_one_b_tokens_per_gpu_per_s)
             if p.one_f_one_b_tokens_per_gpu_per_s else None,
             p.simulate_s, p.search_s] for p in points]  # fmt: skip
    head = ["GPUs", "global batch", "layout", "microbatches", "tuned schedule",
            "1F1B/uniform tokens/GPU/s", "best peer", "best peer tokens/GPU/s",
            "tuned tokens/GPU/s", "tuned / 1F1B", "simulate_s", "search_s"]  # fmt: skip
    return md_table(rows, head)


def svg_chart(series: dict[str, list[ScalingPoint]], path: Path) -> None:
    """A small dependency-free SVG: tokens/GPU/s against GPUs (log2 x axis), per study."""
    w, h, pad = 760, 360, 60
    pts = [p for s in series.values() for p in s]
    xs = sorted({p.gpus for p in pts})
    ymax = max(max(p.tuned_tokens_per_gpu_per_s, p.one_f_one_b_tokens_per_gpu_per_s or 0)
               for p in pts) * 1.1  # fmt: skip
    import math

    def x(g: int) -> float:
        lo, hi = math.log2(xs[0]), math.log2(xs[-1])
        return pad + (math.log2(g) - lo) / max(1e-9, hi - lo) * (w - 2 * pad)

    def y(v: float) -> float:
        return h - pad - v / ymax * (h - 2 * pad)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           'font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="14">nemotron-h-8b on '
           '1,024 x 8 H800 (400 Gb/s per GPU): tokens/GPU/s vs GPUs (simulated)</text>',
           f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>',
           f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>',
           f'<text x="{w / 2}" y="{h - 15}" text-anchor="middle">GPUs</text>',
           f'<text x="15" y="{h / 2}" transform="rotate(-90 15 {h / 2})" '
           'text-anchor="middle">tokens/GPU/s</text>']  # fmt: skip
    for g in xs:
        out.append(f'<text x="{x(g)}" y="{h - pad + 16}" text-anchor="middle">{g}</text>')
    for k in range(5):
        v = ymax * k / 4
        out.append(f'<text x="{pad - 6}" y="{y(v) + 4}" text-anchor="end">{v:,.0f}</text>')
    styles = {"strong": "#1f77b4", "weak": "#d62728"}
    legend_y = pad
    for kind, ps in series.items():
        col = styles.get(kind, "#333")
        for label, get, dash in (
            ("tuned", lambda p: p.tuned_tokens_per_gpu_per_s, ""),
            ("1F1B/uniform", lambda p: p.one_f_one_b_tokens_per_gpu_per_s, "5,4"),
        ):
            xy = [(x(p.gpus), y(get(p))) for p in ps if get(p)]
            if not xy:
                continue
            d = " ".join(f"{a:.1f},{b:.1f}" for a, b in xy)
            out.append(f'<polyline points="{d}" fill="none" stroke="{col}" stroke-width="2" '
                       f'stroke-dasharray="{dash}"/>')  # fmt: skip
            out += [f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{col}"/>' for a, b in xy]
            out.append(
                f'<line x1="{w - 210}" y1="{legend_y}" x2="{w - 180}" y2="{legend_y}" '
                f'stroke="{col}" stroke-width="2" stroke-dasharray="{dash}"/>'
                f'<text x="{w - 175}" y="{legend_y + 4}">{kind}: {label}</text>'
            )
            legend_y += 16
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer GPU counts, shorter budgets")
    ap.add_argument("--out", default="docs/benchmarks-cluster.md")
    args = ap.parse_args()
    t0 = time.time()
    gpus = [64, 512, 8192] if args.quick else [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    budget = 4.0 if args.quick else 15.0
    s1 = sim_8192()
    s2 = plan_cluster_128(20.0 if args.quick else 45.0)
    s3 = cluster_gain(budget)
    strong = scaling("strong", gpus, budget)
    weak = scaling("weak", gpus, budget)
    chart = Path(args.out).with_name("benchmarks-cluster-scaling.svg")
    svg_chart({"strong": strong, "weak": weak}, chart)
    import os

    load = os.getloadavg()[0]
    cmd = "python benchmarks/bench_cluster.py" + (" --quick" if args.quick else "")
    text = f"""# Cluster planning benchmark

Command: `{cmd}` ({time.time() - t0:.0f} s on 2 cores, load average {load:.1f} at the end:
other jobs shared the cores, so wall times are upper bounds). All step times are simulated on
the analytic sample profiles and the bundled cluster samples (H800, 200 GB/s NVLink,
400 Gb/s = 50 GB/s per GPU), with Megatron's rank order unless the order column says
otherwise, per-stage gradient buckets, overlapped reductions, an Adam optimizer step and (where
marked) ZeRO-1.

## 1. One simulation of an 8,192-GPU layout (goal: under 2 s)

Replicas are identical, so one pipeline plus the collectives' cost model stands for the cluster.

{s1}

## 2. `plan-cluster` on 128 GPUs (goal: under 60 s)

`octopipe plan-cluster --profile P --cluster 16x8-h800-ib400 --global-batch B` enumerates every
TP x PP x DP split (TP 1/2/4/8 derived by `tp_scaling`), both rank orders, ZeRO-1 on and off,
screens each with peers and tunes the most promising. Top 5 rows:

{s2}

## 3. Cluster-aware tuning at TP1 x PP8 x DP16 on 16 x 8 GPUs (m = 32, 80 GiB cap)

"x vs ..." columns are step-time ratios (> 1: the tuned plan is faster). *flat-tuned*: the plan
the tuner picks on the profile's flat network without data parallelism (today's single-pipeline
tuner), then simulated on the cluster. *reductions at end*: the tuned plan with every gradient
reduction started after the device's last compute op (no overlap). *both*: the flat-tuned plan
with its reductions at the end, i.e. what planning without the cluster gives.

{s3}

## 4. Strong and weak scaling, nemotron-h-8b on 1,024 x 8 H800 (64 to 8,192 GPUs)

At each GPU count the cluster is cut to that many nodes and `plan-cluster` picks the layout
(budget {budget:g} s per point, 2 layouts tuned). Columns for 1F1B/uniform and the best peer are at
the same layout as the tuned plan. `simulate_s`: one simulation of the tuned plan;
`search_s`: the whole layout search for that point.

![scaling chart](benchmarks-cluster-scaling.svg)

### Strong scaling (global batch 1,024 sequences of 8,192 tokens)

{scaling_table(strong)}

### Weak scaling (global batch = 0.5 sequence per GPU)

{scaling_table(weak)}
"""
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
