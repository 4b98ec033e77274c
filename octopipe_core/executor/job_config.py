"""Reading an exported job's ``executor_config.json``: every field checked before any process
starts, so a truncated, hand-edited or hostile config gives one line naming the file, the field
and the fix instead of a worker traceback (or a job that exits 0 with a NaN loss).

>>> cfg = {"model": {"hidden": 16, "microbatch_size": 0}, "runtime": {}}
>>> try:
...     check_sections(cfg, "job/executor_config.json")
... except ValueError as e:
...     print(e)
job/executor_config.json: field 'model.microbatch_size': got 0; fix: use an integer in 1..65,536
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from octopipe_core.errors import OctoPipeError, input_error
from octopipe_core.jsonio import loads_checked

# (low, high) of every integer model/runtime field; floats are listed in FLOAT_FIELDS
INT_FIELDS: dict[str, tuple[int, int]] = {
    "model.hidden": (1, 65_536),
    "model.seq": (1, 1_048_576),
    "model.vocab": (1, 10_000_000),
    "model.microbatch_size": (1, 65_536),
    "model.seed": (0, 2**31 - 1),
    "model.mamba_state": (1, 4_096),
    "model.moe_experts": (1, 4_096),
    "model.moe_topk": (1, 4_096),
    "runtime.steps": (0, 10**9),
    "runtime.warmup": (0, 10**6),
    "runtime.threads": (1, 1_024),
}
FLOAT_FIELDS: dict[str, tuple[float, float]] = {"runtime.timeout_s": (0.001, 7 * 86_400.0)}
CHOICES: dict[str, tuple[str, ...]] = {
    "model.dtype": ("float64", "float32", "bfloat16"),
    "model.input": ("auto", "tokens", "hidden"),
    "model.loss": ("auto", "cross_entropy", "mse"),
    "runtime.backend": ("auto", "gloo", "nccl"),
}


def _check_value(key: str, v: Any, src: str) -> None:
    if key in INT_FIELDS:
        lo, hi = INT_FIELDS[key]
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise input_error(src, key, f"got {v!r}", f"use an integer in {lo:,}..{hi:,}")
    elif key in FLOAT_FIELDS:
        lo_f, hi_f = FLOAT_FIELDS[key]
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or not lo_f <= v <= hi_f:
            raise input_error(src, key, f"got {v!r}", f"use a number in {lo_f:g}..{hi_f:g}")
    elif key in CHOICES and v not in CHOICES[key]:
        raise input_error(src, key, f"got {v!r}", f"use one of {', '.join(CHOICES[key])}")
    elif key == "model.factory" and not isinstance(v, str):
        raise input_error(src, key, f"got {v!r}", 'write "module:function" or ""')


def check_sections(cfg: Any, src: str) -> None:
    """Types and ranges of the ``model`` and ``runtime`` sections (see ``INT_FIELDS``)."""
    if not isinstance(cfg, dict):
        raise input_error(src, "<root>", "expected a JSON object", "re-export the job")
    for section in ("model", "runtime"):
        sec = cfg.get(section, {})
        if not isinstance(sec, dict):
            raise input_error(src, section, f"got {type(sec).__name__}", "write an object")
        for k, v in sec.items():
            _check_value(f"{section}.{k}", v, src)


def check_job_config(cfg: Any, src: str) -> None:
    """The whole config: sections, plan, profile, layout, data, optimizer and checkpoints."""
    from octopipe_core.executor.mesh import config_layout
    from octopipe_core.executor.settings import (
        CheckpointSettings,
        DataSettings,
        OptimSettings,
    )
    from octopipe_core.plan import plan_from_dict, validate_plan
    from octopipe_core.profile import Profile

    check_sections(cfg, src)
    plan_d = cfg.get("plan")
    if not isinstance(plan_d, dict) or not isinstance(plan_d.get("profile"), dict):
        raise input_error(src, "plan", "missing or without its profile", "re-export the job")
    plan = plan_from_dict(plan_d, src)
    prof = Profile.from_dict(plan_d["profile"], f"{src}#plan.profile")
    validate_plan(plan, prof.num_layers, src=src)
    lowered = cfg.get("lowered")
    if (
        not isinstance(lowered, list)
        or len(lowered) != plan.num_devices
        or not all(
            isinstance(r, str) or (isinstance(r, list) and all(isinstance(t, str) for t in r))
            for r in lowered
        )
    ):
        raise input_error(
            src, "lowered", f"not one list of ops per device ({plan.num_devices})",
            "re-export the job with octopipe export",
        )  # fmt: skip
    try:
        config_layout(cfg)
        DataSettings.from_dict(cfg.get("data"), src)
        OptimSettings.from_dict(cfg.get("train"), src)
        CheckpointSettings.from_dict(cfg.get("checkpoint"), src)
    except (TypeError, KeyError, ValueError) as e:
        if isinstance(e, OctoPipeError):
            raise
        raise input_error(src, "<config>", f"malformed ({e})", "re-export the job") from None


def load_job_config(path: str | Path) -> dict[str, Any]:
    """Read and check a job folder's ``executor_config.json`` (or the file itself)."""
    p = Path(path)
    if p.is_dir():
        p = p / "executor_config.json"
    if not p.is_file():
        raise OctoPipeError(
            f"{p}: file not found; fix: export a job first (octopipe export PLAN.json --out DIR)"
        )
    cfg = loads_checked(p.read_bytes(), str(p))
    check_job_config(cfg, str(p))
    return dict(cfg)
