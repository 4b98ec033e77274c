"""Inputs shared by the dashboard view tests."""

from __future__ import annotations

import json
from typing import Any

from octopipe_core.executor.trace import records_trace
from octopipe_core.simulator import simulate


def executed_trace(prof: Any, plan: Any, steps: int = 2, speed: float = 0.01) -> bytes:
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
    return json.dumps(records_trace(records)).encode()
