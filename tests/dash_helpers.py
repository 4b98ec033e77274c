"""AppTest helpers and inputs shared by the dashboard tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from streamlit.testing.v1 import AppTest

from octopipe_core.executor.trace import records_trace
from octopipe_core.simulator import simulate

APP = str(Path(__file__).resolve().parent.parent / "app" / "streamlit_app.py")


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
    return json.dumps(records_trace(records, peak_memory_gib=peaks)).encode()
