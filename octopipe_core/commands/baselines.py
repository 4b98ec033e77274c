"""``octopipe baselines``: every peer schedule, uniform and balanced, side by side."""

from __future__ import annotations

import argparse
from pathlib import Path

from octopipe_core.commands.argtypes import CHUNKS, DEVICES, MEMORY_GIB, MICROBATCHES
from octopipe_core.commands.common import (
    add_profile_arg,
    check_writable,
    print_json,
    resolve_profile,
    save_plan_file,
    table,
)
from octopipe_core.errors import OctoPipeError
from octopipe_core.limits import check_peers_size
from octopipe_core.peers import PeerRun, PeerTable, baselines, run_peers
from octopipe_core.profile import Profile
from octopipe_core.schedules import PARTITIONS, SCHEDULES

__all__ = ["baselines", "register", "run"]  # ``baselines`` moved to octopipe_core.peers


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "baselines",
        help="simulate every peer schedule side by side",
        description="Simulate every peer schedule with a uniform and a balanced partition. "
        "--out DIR saves each simulated plan as DIR/<schedule>-<partition>.json, its profile "
        "embedded (re-simulate one with `octopipe simulate --plan FILE`).",
    )
    add_profile_arg(p)
    p.add_argument("--devices", type=DEVICES, required=True, metavar="D")
    p.add_argument("--microbatches", type=MICROBATCHES, required=True, metavar="M")
    p.add_argument("--chunks", type=CHUNKS, default=2, metavar="V", help="interleaved chunks")
    p.add_argument("--memory-gib", type=MEMORY_GIB, default=None, metavar="X")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="save every simulated plan into DIR (refuses existing files unless --force)",
    )
    p.add_argument("--force", action="store_true", help="overwrite existing plan files in DIR")
    p.set_defaults(func=run)


def plan_file(out_dir: Path, schedule: str, partition: str) -> Path:
    """Where ``baselines --out`` saves one peer's plan.

    >>> plan_file(Path("out"), "zb-h1", "balanced").as_posix()
    'out/zb-h1-balanced.json'
    """
    return out_dir / f"{schedule}-{partition}.json"


def _check_out_dir(out: str, force: bool) -> Path:
    d = Path(out)
    if d.exists() and not d.is_dir():
        raise OctoPipeError(f"{d}: is a file; fix: pass a folder to --out")
    for s in SCHEDULES:
        for p in PARTITIONS:
            check_writable(plan_file(d, s, p), force)
    return d


def run(args: argparse.Namespace) -> int:
    out_dir = _check_out_dir(args.out, args.force) if args.out else None
    check_peers_size(args.devices, args.microbatches, args.chunks, "baselines")
    prof = resolve_profile(args.profile)
    runs = run_peers(prof, args.devices, args.microbatches, args.chunks, args.memory_gib)
    saved = _save(runs, out_dir, args.memory_gib, prof) if out_dir else []
    if args.json:
        print_json(
            {
                "profile": prof.name,
                "devices": args.devices,
                "microbatches": args.microbatches,
                "baselines": PeerTable.of(runs).to_json(),
                **({"plans": [str(p) for p in saved]} if out_dir else {}),
            }
        )
        return 0
    print(
        f"{prof.name}: {args.devices} devices, {args.microbatches} micro-batches "
        f"(bubble_ratio = idle / (devices x step); speedup vs 1f1b/uniform)"
    )
    print(table(_rows(runs), _HEADER))
    for r in runs:
        if not r.ok:
            print(f"  {r.key}: skipped: {r.error}")
    if out_dir:
        print(
            f"{len(saved)} plans saved to {out_dir}/ (re-simulate: octopipe simulate --plan FILE)"
        )
    return 0


_HEADER = [
    "plan",
    "step_time_ms",
    "speedup",
    "bubble_ratio",
    "tokens/GPU/s",
    "max_peak_gib",
    "fits",
]


def _rows(runs: list[PeerRun]) -> list[list[object]]:
    done = sorted(
        ((r.key, r.result) for r in runs if r.result is not None), key=lambda kr: kr[1].step_time_ms
    )
    ref = next((res.step_time_ms for key, res in done if key == "1f1b/uniform"), None)
    return [
        [
            key,
            round(res.step_time_ms, 6),
            f"{ref / res.step_time_ms:.3f}x" if ref else "-",
            round(res.bubble_ratio, 6),
            round(res.tokens_per_gpu_per_s, 3),
            round(max(res.peak_memory_gib), 4),
            res.fits_memory,
        ]
        for key, res in done
    ]


def _save(runs: list[PeerRun], out_dir: Path, cap: float | None, prof: Profile) -> list[Path]:
    saved = []
    for r in runs:
        if r.plan is None:
            continue
        plan = r.plan.copy()
        if cap is not None:
            plan.meta["memory_cap_gib"] = cap
        path = plan_file(out_dir, r.schedule, r.partition)
        save_plan_file(path, plan, prof)
        saved.append(path)
    return saved
