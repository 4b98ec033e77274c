"""``octopipe simulate``: simulate one peer schedule, or a saved plan."""

from __future__ import annotations

import argparse
from typing import Any

from octopipe_core.breakdown import critical_path, time_breakdown
from octopipe_core.commands.argtypes import CHUNKS, DEVICES, MEMORY_GIB, MICROBATCHES
from octopipe_core.commands.cluster_args import add_cluster_args, apply_cluster
from octopipe_core.commands.common import (
    add_out_args,
    check_writable,
    plan_with_profile,
    print_json,
    resolve_profile,
    save_plan_file,
    table,
)
from octopipe_core.errors import OctoPipeError
from octopipe_core.layout_bound import plan_layout_bound
from octopipe_core.limits import check_size
from octopipe_core.schedules import PARTITIONS, SCHEDULES, build_plan
from octopipe_core.simulator import SimResult, simulate


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate a peer schedule or a saved plan",
        description="Simulate a peer schedule on a profile, or a plan saved as JSON. "
        "With --plan, --profile (when given) replaces the plan's embedded profile: the same "
        "plan re-simulates on another profile (a note on stderr says so when they differ; the "
        "plan's partition must fit the profile's layers). --out saves the simulated plan with "
        "the profile it used embedded.",
    )
    p.add_argument(
        "--profile",
        metavar="FILE",
        help="profile file or bundled sample name; with --plan it replaces the embedded profile",
    )
    p.add_argument("--plan", metavar="PLAN.json", help="a saved plan (its profile is embedded)")
    p.add_argument("--schedule", choices=SCHEDULES, default="1f1b")
    p.add_argument("--devices", type=DEVICES, default=4, metavar="D")
    p.add_argument("--microbatches", type=MICROBATCHES, default=16, metavar="M")
    p.add_argument("--chunks", type=CHUNKS, default=None, metavar="V", help="interleaved chunks")
    p.add_argument("--partition", choices=PARTITIONS, default="uniform")
    p.add_argument(
        "--memory-gib",
        type=MEMORY_GIB,
        default=None,
        metavar="X",
        help="memory cap per device in GiB (default: the profile's device memory)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--breakdown", action="store_true", help="per-device idle by cause and the critical path"
    )
    p.add_argument("--show-schedule", action="store_true", help="print the per-device orders")
    add_out_args(
        p,
        "PLAN.json",
        "save the simulated plan here, its profile embedded and the memory cap in meta "
        "(refuses an existing file unless --force)",
    )
    add_cluster_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = check_writable(args.out, args.force) if args.out else None
    if args.plan:
        plan, prof = plan_with_profile(args.plan, args.profile, override=True)
        if args.cluster is not None:  # re-deploy the plan on another cluster / layout
            prof = apply_cluster(prof.with_deployment(None), args, plan.num_devices)
        cap = args.memory_gib if args.memory_gib is not None else plan.meta.get("memory_cap_gib")
    else:
        if not args.profile:
            raise OctoPipeError(
                "simulate: field '--profile': missing; fix: pass --profile FILE or --plan PLAN.json"
            )
        check_size(args.devices * (args.chunks or 2), args.microbatches, "simulate")
        prof = apply_cluster(resolve_profile(args.profile), args, args.devices)
        plan = build_plan(
            prof, args.schedule, args.devices, args.microbatches, args.chunks, args.partition
        )
        cap = args.memory_gib
    check_size(plan.num_stages, plan.num_microbatches, "simulate")
    result = simulate(prof, plan, cap)
    if out is not None:
        saved = plan.copy()
        if cap is not None:
            saved.meta["memory_cap_gib"] = cap
        save_plan_file(out, saved, prof)
    if args.json:
        extra: dict[str, Any] = {}
        if args.breakdown:
            lb = plan_layout_bound(prof, plan)
            extra = {
                "breakdown": [x.to_dict() for x in time_breakdown(result)],
                "layout_bound_ms": round(lb.ms, 6),
                "gap_to_layout_bound_pct": round(lb.gap_pct(result.step_time_ms), 4),
            }
        print_json({**result.metrics(), **extra, **({"plan": str(out)} if out else {})})
    else:
        print(report(result))
        if args.breakdown:
            print()
            print(breakdown_report(result))
        if args.show_schedule:
            print()
            print(plan)
        if out is not None:
            print(f"\nplan saved to {out} (re-simulate: octopipe simulate --plan {out})")
    return 0


def breakdown_report(r: SimResult) -> str:
    """Where the time goes per device, and the critical path's length by kind."""
    cols = ["device", "busy_ms", "fill_ms", "wait_transfer_ms", "idle_between_ms", "drain_ms"]
    rows = [
        [x.to_dict()[c] for c in cols] + [x.to_dict()["bubble_ratio"]] for x in time_breakdown(r)
    ]
    path = critical_path(r)
    on_ops = sum(p.end_ms - p.start_ms for p in path if p.kind == "op")
    on_wire = sum(p.end_ms - p.start_ms for p in path if p.kind == "transfer")
    head = "where the time goes (bubble_ratio: idle / step time per device)"
    tail = (
        f"critical path: {sum(p.kind == 'op' for p in path)} ops ({on_ops:,.1f} ms) and "
        f"{sum(p.kind == 'transfer' for p in path)} transfers ({on_wire:,.1f} ms), from "
        f"{path[0].label} on d{path[0].device} to {path[-1].label} on d{path[-1].device}"
        if path
        else "critical path: empty plan"
    )
    lb = plan_layout_bound(r.profile, r.plan)
    tail += (
        f"\nlayout bound: {lb.describe()}; this schedule is {lb.gap_pct(r.step_time_ms):+.2f}% "
        "above it"
    )
    return f"{head}\n{table(rows, [*cols, 'bubble_ratio'])}\n{tail}"


def report(r: SimResult) -> str:
    """A readable summary of one simulation."""
    m = r.metrics()
    head = (
        f"{r.profile.name}: {m['schedule'] or 'plan'} on {m['devices']} devices, "
        f"{m['stages']} stages, {m['microbatches']} micro-batches"
    )
    rows = [
        ["step_time_ms", m["step_time_ms"]],
        ["lower_bound_ms (compute / devices)", m["lower_bound_ms"]],
        ["bubble_ratio (idle / devices x step)", m["bubble_ratio"]],
        ["bubble_ratio_vs_ideal (idle / busy)", m["bubble_ratio_vs_ideal"]],
        ["comm_overlap_ratio", m["comm_overlap_ratio"]],
        ["tokens_per_gpu_per_s (tokens/GPU/s)", m["tokens_per_gpu_per_s"]],
        ["memory_cap_gib", m["memory_cap_gib"]],
        ["fits_memory", m["fits_memory"]],
    ]
    if "cluster" in m:
        lay = r.profile.deployment.layout
        rows += [
            ["cluster / layout", f"{m['cluster']} / {lay.label()} ({lay.order})"],
            ["gpus", m["gpus"]],
            ["inter_node_boundaries", m["inter_node_boundaries"]],
            ["grad_sync_ms (sum over DP streams)", m["grad_sync_ms"]],
            ["exposed_tail_ms (after the last compute)", m["exposed_tail_ms"]],
        ]
    mem = table([[d, g] for d, g in enumerate(m["peak_memory_gib"])], ["device", "peak_memory_gib"])
    return f"{head}\n{table(rows, ['metric', 'value'])}\n\n{mem}"
