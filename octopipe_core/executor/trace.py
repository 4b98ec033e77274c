"""Chrome trace (Perfetto / chrome://tracing) JSON of simulated or executed timelines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from octopipe_core.executor.mesh import JobLayout

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


def result_steps(result: dict[str, Any]) -> list[tuple[int, float, float]]:
    """``(step, start_s, end_s)`` of each step of a merged run result (``train.merge_results``'s
    ``step_starts`` and ``step_ms``, from ``start_step``), on the records' clock.

    >>> result_steps({"start_step": 3, "step_starts": [10.0], "step_ms": [250.0]})
    [(3, 10.0, 10.25)]
    """
    first = int(result.get("start_step", 0))
    pairs = zip(result["step_starts"], result["step_ms"], strict=True)
    return [(first + i, float(s), float(s) + float(ms) / 1e3) for i, (s, ms) in enumerate(pairs)]


def records_trace(
    records: list[tuple[Any, ...]],
    t0: float | None = None,
    tail: list[tuple[Any, ...]] | None = None,
    peak_memory_gib: list[float | None] | None = None,
    layout: JobLayout | dict[str, Any] | None = None,
    steps: list[tuple[int, float, float]] | None = None,
) -> dict[str, Any]:
    """Trace of executed op records ``(rank, step, op, start_s, end_s, wait_s)``; ``tail``:
    ``(rank, step, name, start_s, end_s)`` of DP reductions (``<stage>DP``, from launch to the
    end of its wait), the step's small all-reduce (``SYNC``: gradient norm, loss, requests) and
    optimizer steps (``OPT``), on a third thread of each rank. ``pid`` is the global rank.

    ``otherData`` keeps ``layout`` (the job's ``JobLayout.to_dict()``, when given), ``steps``
    (``[step, start_us, end_us]`` each: ``steps`` as ``(step, start_s, end_s)``, see
    ``result_steps``, else each step's first to last event) and ``peak_memory_gib`` (each
    rank's measured peak, the CUDA allocator's; None on the CPU). Time 0 is ``t0`` (default:
    the earliest op, wait, tail or step start). ``trace_read.read_executed_trace`` reads it back.

    >>> tr = records_trace([(0, 0, "0F0", 2.0, 2.5, 0.0)], layout={"pp": 1, "dp": 1})
    >>> [e["ts"] for e in tr["traceEvents"] if e["ph"] == "X"], tr["otherData"]["steps"]
    ([0.0], [[0, 0.0, 500000.0]])
    """
    if not records:
        return {"traceEvents": []}
    if t0 is None:
        firsts = [r[3] - max(0.0, r[5]) for r in records]
        firsts += [t[3] for t in tail or []] + [s[1] for s in steps or []]
        base = min(firsts)
    else:
        base = t0
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
    if layout is not None:
        other["layout"] = layout.to_dict() if isinstance(layout, JobLayout) else dict(layout)
    if steps is None:
        steps = _event_spans(records, tail or [])
    other["steps"] = [[int(s), (a - base) * 1e6, (b - base) * 1e6] for s, a, b in steps]
    if peak_memory_gib and any(g is not None for g in peak_memory_gib):
        other["peak_memory_gib"] = [None if g is None else round(g, 4) for g in peak_memory_gib]
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def _event_spans(
    records: list[tuple[Any, ...]], tail: list[tuple[Any, ...]]
) -> list[tuple[int, float, float]]:
    """Each step's ``(step, start_s, end_s)``: its first wait or op start to its last end."""
    spans: dict[int, tuple[float, float]] = {}
    ends = [(r[1], r[3] - max(0.0, r[5]), r[4]) for r in records]
    for step, a, b in ends + [(t[1], t[3], t[4]) for t in tail]:
        lo, hi = spans.get(int(step), (a, b))
        spans[int(step)] = (min(lo, a), max(hi, b))
    return [(s, a, b) for s, (a, b) in sorted(spans.items())]


def write_trace(trace: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(trace))
