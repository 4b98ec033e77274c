"""Helpers shared by sub-commands: profile resolution, output files, tables, JSON output."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from octopipe_core.errors import OctoPipeError
from octopipe_core.plan import Plan, load_plan, validate_plan
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


def plan_with_profile(
    plan_path: str, profile_arg: str | None, *, override: bool = False
) -> tuple[Plan, Profile]:
    """A saved plan and the profile to use with it.

    Without ``--profile`` the plan's embedded profile is used. With ``--profile``:
    ``override=True`` (``simulate``) uses it instead of the embedded one, after checking that the
    plan's partition fits its layers, and says so on stderr when the two differ;
    ``override=False`` refuses, in one line, a ``--profile`` that differs from the embedded one
    (it is never silently ignored).
    """
    plan, embedded = load_plan(plan_path)
    if not profile_arg:
        if embedded is None:
            raise OctoPipeError(
                f"{plan_path}: field 'profile': the plan has no embedded profile; "
                "fix: pass --profile FILE"
            )
        return plan, embedded
    prof = resolve_profile(profile_arg)
    if plan.deployment is not None:  # the plan's cluster and layout go with any profile
        plan.deployment.check(plan.num_devices, prof.device.gpus, f"{plan_path}#layout")
        prof = prof.with_device(memory_gib=plan.deployment.cluster.gpu_memory_gib)
        prof = prof.with_deployment(plan.deployment)
    differs = embedded is not None and embedded.to_dict() != prof.to_dict()
    embedded_name = embedded.name if embedded is not None else ""
    if differs and not override:
        raise OctoPipeError(
            f"{plan_path}: field 'profile': embeds profile '{embedded_name}', which differs from "
            f"--profile {profile_arg}; fix: drop --profile, or re-embed it with `octopipe "
            f"simulate --plan {plan_path} --profile {profile_arg} --out NEW.json`"
        )
    validate_plan(plan, prof.num_layers, src=f"{plan_path} with --profile {profile_arg}")
    if differs:
        print(
            f"octopipe: note: using --profile {profile_arg} ('{prof.name}') instead of the "
            f"profile embedded in {plan_path} ('{embedded_name}')",
            file=sys.stderr,
        )
    return plan, prof


def add_out_args(p: argparse.ArgumentParser, metavar: str, what: str) -> None:
    """``--out`` and ``--force`` for a command that saves what it computed."""
    p.add_argument("--out", default=None, metavar=metavar, help=what)
    p.add_argument("--force", action="store_true", help="overwrite existing --out files")


def check_writable(path: str | Path, force: bool = False) -> Path:
    """Check, before any work, that ``path`` can be written; return it as a ``Path``.

    Refuses an existing file unless ``force``, a folder, and a place whose nearest existing
    parent is not a writable folder (missing parents are created when writing).

    >>> check_writable(".")
    Traceback (most recent call last):
    ...
    octopipe_core.errors.OctoPipeError: .: is a folder; fix: pass a file name, e.g. plan.json
    """
    p = Path(path)
    if p.is_dir():
        raise OctoPipeError(f"{p}: is a folder; fix: pass a file name, e.g. {p / 'plan.json'}")
    if p.exists() and not force:
        raise OctoPipeError(f"{p}: already exists; fix: pass --force to overwrite it")
    parent = p.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK) or not _can_create(parent):
        raise OctoPipeError(
            f"{p}: cannot write there ({parent} is not a writable folder); "
            "fix: choose another --out"
        )
    return p


def _can_create(folder: Path) -> bool:
    """Really create (and remove) a file in ``folder``: permissions alone do not tell (root,
    read-only mounts, /proc)."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".octopipe-probe-"):
            return True
    except OSError:
        return False


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (creating parent folders); an OS error becomes one line."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise OctoPipeError(
            f"{path}: cannot write ({e.strerror}); fix: choose another --out"
        ) from None


def save_plan_file(path: Path, plan: Plan, profile: Profile) -> None:
    """Save ``plan`` as JSON with ``profile`` embedded (``simulate --plan`` reads it back)."""
    write_text(path, json.dumps(plan.to_dict(profile), indent=1) + "\n")


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=1))


def table(rows: list[list[Any]], header: list[str]) -> str:
    """A plain, aligned text table.

    >>> print(table([["a", 1.5], ["bb", 1234.5]], ["k", "v_ms"]))
    k      v_ms
    --  -------
    a     1.500
    bb  1,234.5
    """
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
