"""AppTest helpers and inputs shared by the dashboard tests, and a real tiny run whose
trace the executed-trace tests read."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from streamlit.testing.v1 import AppTest

from octopipe_core.commands.run import run_process_group
from octopipe_core.executor.trace import records_trace
from octopipe_core.plan import Plan, load_plan, save_plan
from octopipe_core.profile import load_sample
from octopipe_core.schedules import build_plan
from octopipe_core.simulator import simulate

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app" / "streamlit_app.py")
TINY_RUN = ("tiny-hybrid", "1f1b", 2, 4)  # sample, schedule, devices, micro-batches


def ok(at: AppTest) -> None:
    """The last run raised nothing (an exception would show as a red box in the page)."""
    assert not at.exception, [e.value for e in at.exception]


def start(page: str | None = None, *, timeout: float = 120, **query: str) -> AppTest:
    """The app opened fresh on ``page`` (default: the Overview) with URL query parameters."""
    at = AppTest.from_file(APP, default_timeout=timeout)
    for k, v in query.items():
        at.query_params[k] = v
    if page and page != "overview":
        at.switch_page(f"views/{page}.py")
    at.run()
    ok(at)
    return at


def metric(at: AppTest, label: str) -> float:
    """The number shown by the metric labelled ``label``."""
    m = next(m for m in at.metric if m.label == label)
    return float(m.value.split()[0].replace(",", ""))


def executed_trace(
    prof: Any, plan: Any, steps: int = 2, speed: float = 0.01, peaks: list[Any] | None = None
) -> bytes:
    """What ``octopipe run`` writes (``records_trace``), for a run ``speed`` times the
    simulated times, a little late on every op: every compute op and its input waits."""
    r = simulate(prof, plan)
    records = []
    for step in range(steps):
        t0 = 100.0 + step * 10.0
        for (d, a), s, e in zip(r.ops, r.start_ms, r.end_ms, strict=True):
            start = t0 + s * speed / 1000 * 1.1
            end = start + (e - s) * speed / 1000
            records.append((d, step, str(a), start, end, 0.0001 if a.kind == "F" else 0.0))
        records.append((0, step, f"0SEND_F{0}", t0, t0 + 0.0001, 0.0))
    layout = {"pp": plan.num_devices, "dp": 1}
    return json.dumps(records_trace(records, peak_memory_gib=peaks, layout=layout)).encode()


def real_run(tmp: Path, dp: int = 1, steps: int = 2) -> tuple[Plan, Path]:
    """The plan ``TINY_RUN`` saved with its profile, exported (``dp`` replicas, ``steps``
    steps) and trained by the real CLI in subprocesses (``python -m octopipe_core export``,
    then ``run``; the default CPU-sized model on gloo): the plan and the job folder, whose
    ``out/`` has ``result.json`` and ``trace_executed.json``."""
    sample, schedule, devices, mbs = TINY_RUN
    prof = load_sample(sample)
    tmp.mkdir(parents=True, exist_ok=True)
    path, job = tmp / "plan.json", tmp / "job"
    save_plan(build_plan(prof, schedule, devices, mbs), path, prof)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    export = ["export", str(path), "--out", str(job), "--steps", str(steps)]
    for argv in ([*export, *(["--dp", str(dp)] if dp > 1 else [])], ["run", str(job)]):
        cmd = [sys.executable, "-m", "octopipe_core", *argv]
        proc = run_process_group(cmd, env, timeout=240, cwd=tmp)
        assert proc.returncode == 0, (argv[0], proc.stdout[-2000:], proc.stderr[-2000:])
    return load_plan(path)[0], job
