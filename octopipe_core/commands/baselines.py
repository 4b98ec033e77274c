"""``octopipe baselines``: every peer schedule, uniform and balanced, side by side."""

from __future__ import annotations

import argparse
from typing import Any

from octopipe_core.commands.common import add_profile_arg, print_json, resolve_profile, table
from octopipe_core.errors import OctoPipeError
from octopipe_core.profile import Profile
from octopipe_core.schedules import PARTITIONS, SCHEDULES, build_plan
from octopipe_core.simulator import simulate


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("baselines", help="simulate every peer schedule side by side")
    add_profile_arg(p)
    p.add_argument("--devices", type=int, required=True, metavar="D")
    p.add_argument("--microbatches", type=int, required=True, metavar="M")
    p.add_argument("--chunks", type=int, default=2, metavar="V", help="interleaved chunks")
    p.add_argument("--memory-gib", type=float, default=None, metavar="X")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def baselines(
    prof: Profile,
    devices: int,
    microbatches: int,
    chunks: int = 2,
    memory_gib: float | None = None,
) -> dict[str, dict[str, Any]]:
    """Simulate every peer with each partition; keys like ``1f1b/uniform``.

    A peer that cannot be built (too few layers, too few micro-batches) gets ``{"error": ...}``.
    """
    out: dict[str, dict[str, Any]] = {}
    for sched in SCHEDULES:
        for part in PARTITIONS:
            key = f"{sched}/{part}"
            try:
                plan = build_plan(prof, sched, devices, microbatches, chunks, part)
                r = simulate(prof, plan, memory_gib)
            except OctoPipeError as e:
                out[key] = {"error": str(e)}
                continue
            m = r.metrics()
            out[key] = {
                k: m[k]
                for k in (
                    "step_time_ms",
                    "bubble_ratio",
                    "comm_overlap_ratio",
                    "peak_memory_gib",
                    "fits_memory",
                    "tokens_per_gpu_per_s",
                    "lower_bound_ms",
                )
            }
    return out


def run(args: argparse.Namespace) -> int:
    prof = resolve_profile(args.profile)
    res = baselines(prof, args.devices, args.microbatches, args.chunks, args.memory_gib)
    if args.json:
        print_json(
            {
                "profile": prof.name,
                "devices": args.devices,
                "microbatches": args.microbatches,
                "baselines": res,
            }
        )
        return 0
    ok = {k: v for k, v in res.items() if "error" not in v}
    ref = ok.get("1f1b/uniform", {}).get("step_time_ms")
    rows = []
    for k, v in sorted(ok.items(), key=lambda kv: kv[1]["step_time_ms"]):
        speed = f"{ref / v['step_time_ms']:.3f}x" if ref else "-"
        rows.append(
            [
                k,
                v["step_time_ms"],
                speed,
                v["bubble_ratio"],
                v["tokens_per_gpu_per_s"],
                max(v["peak_memory_gib"]),
                v["fits_memory"],
            ]
        )
    print(
        f"{prof.name}: {args.devices} devices, {args.microbatches} micro-batches "
        f"(bubble_ratio = idle / (devices x step); speedup vs 1f1b/uniform)"
    )
    print(
        table(
            rows,
            [
                "plan",
                "step_time_ms",
                "speedup",
                "bubble_ratio",
                "tokens/GPU/s",
                "max_peak_gib",
                "fits",
            ],
        )
    )
    for k, v in res.items():
        if "error" in v:
            print(f"  {k}: skipped: {v['error']}")
    return 0
