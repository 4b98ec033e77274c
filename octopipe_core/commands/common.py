"""Helpers shared by sub-commands: profile resolution, tables, JSON output."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from octopipe_core.errors import OctoPipeError
from octopipe_core.plan import Plan, load_plan
from octopipe_core.profile import Profile, list_samples, load_profile, load_sample


def add_profile_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--profile",
        required=True,
        metavar="FILE",
        help="profile .json/.csv, or the name of a bundled sample "
        f"({', '.join(list_samples()) or 'none'})",
    )


def resolve_profile(arg: str, memory_gib: float | None = None) -> Profile:
    """A path, or a bundled sample's name; ``memory_gib`` overrides the device memory."""
    if Path(arg).is_file() or (
        arg not in list_samples() and ("/" in arg or arg.endswith((".json", ".csv")))
    ):
        prof = load_profile(arg)
    else:
        prof = load_sample(arg)
    if memory_gib is not None:
        prof = prof.with_device(memory_gib=memory_gib)
    return prof


def plan_with_profile(plan_path: str, profile_arg: str | None) -> tuple[Plan, Profile]:
    """A saved plan and its profile: the embedded one, else ``--profile``."""
    plan, prof = load_plan(plan_path)
    if prof is not None:
        return plan, prof
    if plan.deployment is not None and profile_arg:
        p = resolve_profile(profile_arg)
        plan.deployment.check(plan.num_devices, p.device.gpus, f"{plan_path}#layout")
        p = p.with_device(memory_gib=plan.deployment.cluster.gpu_memory_gib)
        return plan, p.with_deployment(plan.deployment)
    if not profile_arg:
        raise OctoPipeError(
            f"{plan_path}: field 'profile': the plan has no embedded profile; "
            "fix: pass --profile FILE"
        )
    return plan, resolve_profile(profile_arg)


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=1))


def table(rows: list[list[Any]], header: list[str]) -> str:
    """A plain, aligned text table."""
    cells = [[str(h) for h in header]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [
        "  ".join(
            c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(c: Any) -> str:
    if isinstance(c, float):
        return f"{c:,.3f}" if abs(c) < 1000 else f"{c:,.1f}"
    if isinstance(c, bool):
        return "yes" if c else "NO"
    return str(c)
