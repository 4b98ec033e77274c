"""Export adapters for the Export page (no Streamlit here).

The runnable job comes from ``octopipe_core.executor.export`` (written separately); when that
module is missing, :func:`exporter` says why and the page offers the plan JSON alone.
"""

from __future__ import annotations

import importlib
import io
import json
import re
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from octopipe_core.plan import Plan
from octopipe_core.profile import Profile


def exporter() -> tuple[ModuleType | None, str]:
    """``(module, "")`` or ``(None, why)``."""
    try:
        export = importlib.import_module("octopipe_core.executor.export")
    except Exception as e:  # missing or half-written module
        return None, f"the exporter is not available ({type(e).__name__}: {e})"
    missing = [f for f in ("export_job", "torch_csv") if not hasattr(export, f)]
    if missing:
        return None, f"the exporter lacks {', '.join(missing)}"
    return export, ""


_HOOK = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_]\w*$")
DATA_KINDS = {"synthetic": "synthetic (learnable)", "tokens": "token file", "hook": "data hook"}


@dataclass
class JobSettings:
    """The Export page's training-job settings (what ``octopipe export`` flags set)."""

    model_hook: str = ""  # module:function building this rank's layers; "" = stand-in layers
    data: str = "synthetic"  # "synthetic" | "tokens" | "hook"
    token_path: str = ""
    token_dtype: str = "uint16"
    data_hook: str = ""
    steps: int = 100
    lr: float = 1e-3
    weight_decay: float = 0.01
    clip: float = 1.0
    checkpoint_every: int = 0
    dp: int = 1
    zero1: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def errors(self) -> list[str]:
        """One line per bad field (nothing is imported or read: hooks and files are checked
        where the job runs)."""
        out = []
        if self.model_hook and not _HOOK.match(self.model_hook):
            out.append(
                f"model hook {self.model_hook!r}: expected module:function; fix: e.g. mymodel:build"
            )
        if self.data == "tokens" and not self.token_path.strip():
            out.append("token file: empty; fix: give the path of the token file on the cluster")
        if self.data == "hook" and not _HOOK.match(self.data_hook):
            out.append(
                f"data hook {self.data_hook!r}: expected module:function; fix: e.g. mydata:batch"
            )
        if self.zero1 and self.dp < 2:
            out.append("ZeRO-1 with DP 1: nothing to shard; fix: set DP to 2 or more")
        return out

    def export_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``export_job`` for these settings."""
        data: dict[str, Any] = {"kind": self.data}
        if self.data == "tokens":
            data.update(path=self.token_path.strip(), token_dtype=self.token_dtype)
        elif self.data == "hook":
            data["hook"] = self.data_hook
        return {
            "model": {"factory": self.model_hook} if self.model_hook else None,
            "runtime": {"steps": self.steps},
            "layout": {"dp": self.dp, "zero1": self.zero1},
            "data": data,
            "train": {
                "lr": self.lr,
                "min_lr": min(self.lr, 1e-4),
                "weight_decay": self.weight_decay,
                "clip": self.clip,
            },
            "checkpoint": {"every": self.checkpoint_every},
        }

    def cli(self, plan_file: str = "plan.json") -> str:
        """The ``octopipe export`` command that writes the same job."""
        parts = ["octopipe export", plan_file, "--out job/", f"--steps {self.steps}"]
        if self.model_hook:
            parts.append(f"--model {self.model_hook}")
        if self.data == "tokens":
            parts.append(f"--data {self.token_path.strip()} --token-dtype {self.token_dtype}")
        elif self.data == "hook":
            parts.append(f"--data-hook {self.data_hook}")
        parts.append(f"--lr {self.lr:g} --weight-decay {self.weight_decay:g} --clip {self.clip:g}")
        if self.checkpoint_every:
            parts.append(f"--checkpoint-every {self.checkpoint_every}")
        parts.append(f"--dp {self.dp}" + (" --zero1" if self.zero1 else ""))
        return " ".join(parts)


def job_zip(
    plan: Plan, profile: Profile, folder: str, settings: JobSettings | None = None
) -> tuple[bytes, list[str]]:
    """The job folder written by ``export_job``, zipped under ``folder/``; and its file list."""
    mod, why = exporter()
    if mod is None:
        raise RuntimeError(why)
    kwargs = settings.export_kwargs() if settings is not None else {}
    with tempfile.TemporaryDirectory() as td:
        out = Path(td) / folder
        mod.export_job(plan, profile, out, **kwargs)
        buf = io.BytesIO()
        names = []
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for f in sorted(out.rglob("*")):
                if f.is_file():
                    arc = f"{folder}/{f.relative_to(out)}"
                    info = zipfile.ZipInfo(arc)
                    info.compress_type = zipfile.ZIP_DEFLATED
                    info.external_attr = (f.stat().st_mode & 0o777) << 16
                    zf.writestr(info, f.read_bytes())
                    names.append(arc)
    return buf.getvalue(), names


def torch_schedule_csv(plan: Plan) -> str:
    mod, why = exporter()
    if mod is None:
        raise RuntimeError(why)
    return mod.torch_csv(plan)


def chrome_trace(profile: Profile, plan: Plan) -> str:
    """Chrome/Perfetto trace JSON of the simulated timeline."""
    from octopipe_core.executor.trace import sim_trace
    from octopipe_core.simulator import simulate

    return json.dumps(sim_trace(simulate(profile, plan)))


def plan_file_json(plan: Plan, profile: Profile) -> str:
    return json.dumps(plan.to_dict(profile), indent=1) + "\n"


def safe_name(text: str) -> str:
    keep = [c if c.isalnum() or c in "-_." else "-" for c in text]
    return "".join(keep).strip("-") or "plan"
