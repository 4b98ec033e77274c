"""Chrome trace (Perfetto / chrome://tracing) JSON of simulated or executed timelines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_COLORS = {"F": "thread_state_running", "B": "rail_response", "W": "good", "BW": "rail_animation"}


def _meta(pid: int, name: str) -> dict[str, Any]:
    return {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}


def sim_trace(result: Any) -> dict[str, Any]:
    """Trace of a ``SimResult``: one process per device, compute and comm threads."""
    df = result.timeline()
    events: list[dict[str, Any]] = []
    for d in sorted(set(df["device"])):
        events.append(_meta(int(d), f"device {d}"))
    for row in df.itertuples(index=False):
        comm = row.stream == "comm"
        name = (
            f"{row.stage}{row.kind}{row.mb}" if not comm else f"{row.kind} s{row.stage} mb{row.mb}"
        )
        ev = {
            "name": name,
            "cat": row.stream,
            "ph": "X",
            "pid": int(row.device),
            "tid": 1 if comm else 0,
            "ts": float(row.start_ms) * 1000.0,
            "dur": max(0.0, float(row.end_ms - row.start_ms) * 1000.0),
            "args": {"stage": int(row.stage), "mb": int(row.mb), "layers": str(row.layers)},
        }
        if not comm and row.kind in _COLORS:
            ev["cname"] = _COLORS[row.kind]
        events.append(ev)
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"source": "simulated"}}


def records_trace(
    records: list[tuple[Any, ...]],
    t0: float | None = None,
    tail: list[tuple[Any, ...]] | None = None,
    peak_memory_gib: list[float | None] | None = None,
) -> dict[str, Any]:
    """Trace of executed op records ``(rank, step, op, start_s, end_s, wait_s)``; ``tail``:
    ``(rank, step, name, start_s, end_s)`` of DP reductions (``<stage>DP``, from launch to the
    end of its wait), the step's small all-reduce (``SYNC``: gradient norm, loss, requests) and
    optimizer steps (``OPT``), on a third thread of each rank. ``peak_memory_gib``: each rank's
    measured peak (the CUDA allocator's; None on the CPU), kept in ``otherData``."""
    if not records:
        return {"traceEvents": []}
    base = min(r[3] for r in records) if t0 is None else t0
    events: list[dict[str, Any]] = [_meta(r, f"rank {r}") for r in sorted({r[0] for r in records})]
    for rank, step, op, start, end, wait in records:
        comm = "SEND" in op or "RECV" in op
        if wait > 0:
            events.append(
                {
                    "name": f"wait {op}",
                    "cat": "wait",
                    "ph": "X",
                    "pid": rank,
                    "tid": 0,
                    "ts": (start - wait - base) * 1e6,
                    "dur": wait * 1e6,
                    "args": {"step": step},
                }
            )
        events.append(
            {
                "name": op,
                "cat": "comm" if comm else "compute",
                "ph": "X",
                "pid": rank,
                "tid": 1 if comm else 0,
                "ts": (start - base) * 1e6,
                "dur": max(0.0, (end - start) * 1e6),
                "args": {"step": step},
            }
        )
    for rank, step, name, start, end in tail or []:
        events.append(
            {
                "name": name,
                "cat": "dp",
                "ph": "X",
                "pid": rank,
                "tid": 2,
                "ts": (start - base) * 1e6,
                "dur": max(0.0, (end - start) * 1e6),
                "args": {"step": step},
            }
        )
    other: dict[str, Any] = {"source": "executed"}
    if peak_memory_gib and any(g is not None for g in peak_memory_gib):
        other["peak_memory_gib"] = [None if g is None else round(g, 4) for g in peak_memory_gib]
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def write_trace(trace: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(trace))
