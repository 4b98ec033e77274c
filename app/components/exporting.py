"""Export adapters for the Export page (no Streamlit here).

The runnable job comes from ``octopipe_core.executor.export`` (written separately); when that
module is missing, :func:`exporter` says why and the page offers the plan JSON alone.
"""

from __future__ import annotations

import importlib
import io
import json
import tempfile
import zipfile
from pathlib import Path
from types import ModuleType

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


def job_zip(plan: Plan, profile: Profile, folder: str) -> tuple[bytes, list[str]]:
    """The job folder written by ``export_job``, zipped under ``folder/``; and its file list."""
    mod, why = exporter()
    if mod is None:
        raise RuntimeError(why)
    with tempfile.TemporaryDirectory() as td:
        out = Path(td) / folder
        mod.export_job(plan, profile, out)
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
