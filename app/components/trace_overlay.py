"""Simulated against executed: read the trace ``octopipe run`` records and lay it over the
simulated timeline of the same plan (no Streamlit here).

``octopipe run JOB`` writes ``trace_executed.json`` (``executor/trace.py:records_trace``): a
Chrome trace whose ``ph: "X"`` events are the ops each rank ran, named like the plan's actions
(``2F5``, ``2BW5``; transfers ``2SEND_F5``, ``3RECV_F5``), with ``pid`` the rank (= the plan's
device), ``ts``/``dur`` in µs, ``cat`` compute, comm or wait, and ``args.step``. Everything
is checked and every problem is one line naming the file, the event and the fix; nothing in
the file is executed.

>>> import json
>>> raw = json.dumps({"traceEvents": [
...     {"name": "0F0", "cat": "compute", "ph": "X", "pid": 0, "tid": 0, "ts": 0.0,
...      "dur": 1000.0, "args": {"step": 0}}], "otherData": {"source": "executed"}})
>>> t = parse_trace(raw.encode(), "run.json")
>>> t[["device", "kind", "stage", "mb", "start_ms", "end_ms"]].values.tolist()
[[0, 'F', 0, 0, 0.0, 1.0]]
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from app.components.charts import Lanes, _bar_traces
from app.components.palette import KIND_LABELS
from octopipe_core.errors import OctoPipeError, input_error
from octopipe_core.jsonio import loads_checked
from octopipe_core.plan import Plan

MAX_EVENTS = 400_000
MAX_RANKS = 4096
COMPUTE = re.compile(r"^(\d{1,6})(BW|F|B|W)(\d{1,7})$")
COMM = re.compile(r"^(\d{1,6})(SEND_F|SEND_B|RECV_F|RECV_B)(\d{1,7})$")
COLUMNS = ["device", "step", "cat", "kind", "stage", "mb", "op", "start_ms", "end_ms"]
SIM_LANES = Lanes(compute_shift=0.2, compute_width=0.36, comm_offset=0.0, comm_width=0.0)
RUN_LANES = Lanes(compute_shift=-0.2, compute_width=0.36, comm_offset=0.0, comm_width=0.0)
FIX = "upload the trace_executed.json that `octopipe run` writes into the job folder"


def _number(ev: dict[str, Any], key: str, src: str, where: str) -> float:
    v = ev.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise input_error(src, f"{where}.{key}", f"got {str(v)[:30]!r}", "write a finite number")
    lo = 0.0 if key == "dur" else -1e15  # a wait before the first op starts before 0
    if not lo <= v <= 1e15:
        raise input_error(src, f"{where}.{key}", f"{v:g} is out of range", f"use {lo:g}..1e15 µs")
    return float(v)


def parse_trace(raw: bytes, src: str) -> pd.DataFrame:
    """The executed ops of a trace file: one row per op (``COLUMNS``; times in ms from the
    trace's first event); ``attrs["peak_memory_gib"]``: each rank's measured peak memory, []
    when the run recorded none. OctoPipeError (one line) for anything else."""
    data = loads_checked(raw, src)
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise input_error(src, "<root>", "not a Chrome trace with traceEvents", FIX)
    other = data.get("otherData")
    if isinstance(other, dict) and other.get("source") == "simulated":
        raise input_error(src, "otherData.source", "this is the simulated trace", FIX)
    events = data["traceEvents"]
    if len(events) > MAX_EVENTS:
        raise input_error(src, "traceEvents", f"{len(events):,} events", f"at most {MAX_EVENTS:,}")
    rows: list[tuple[Any, ...]] = []
    for i, ev in enumerate(events):
        where = f"traceEvents[{i}]"
        if not isinstance(ev, dict):
            raise input_error(src, where, "not an object", FIX)
        if ev.get("ph") != "X":
            continue  # metadata (process names) and other phases
        name, cat, pid = ev.get("name"), ev.get("cat"), ev.get("pid")
        if isinstance(pid, bool) or not isinstance(pid, int) or not 0 <= pid < MAX_RANKS:
            raise input_error(src, f"{where}.pid", f"got {str(pid)[:20]!r}", "a rank 0..4095")
        if not isinstance(name, str) or cat not in ("compute", "comm", "wait"):
            raise input_error(
                src, where, f"name {str(name)[:30]!r}, cat {str(cat)[:20]!r}", FIX
            )  # fmt: skip
        args = ev.get("args")
        step = args.get("step") if isinstance(args, dict) else None
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 10**6:
            raise input_error(src, f"{where}.args.step", f"got {str(step)[:20]!r}", FIX)
        ts = _number(ev, "ts", src, where)
        dur = _number(ev, "dur", src, where)
        op = name.removeprefix("wait ") if cat == "wait" else name
        m = (COMM if cat == "comm" else COMPUTE).match(op) or COMM.match(op)
        if m is None:
            raise input_error(src, f"{where}.name", f"{name[:30]!r} is not a plan action", FIX)
        rows.append((pid, step, cat, m[2], int(m[1]), int(m[3]), op, ts, ts + dur))
    if not any(r[2] == "compute" for r in rows):
        raise input_error(src, "traceEvents", "no executed compute ops", FIX)
    df = pd.DataFrame(rows, columns=COLUMNS)
    t0 = float(df["start_ms"].min())
    df["start_ms"] = (df["start_ms"] - t0) / 1000.0
    df["end_ms"] = (df["end_ms"] - t0) / 1000.0
    df.attrs["peak_memory_gib"] = _peaks(other, src)
    return df


def _peaks(other: Any, src: str) -> list[float | None]:
    """Each rank's measured peak memory (GiB) that ``octopipe run`` keeps in the trace's
    ``otherData.peak_memory_gib`` (the CUDA allocator's; None for a rank on the CPU); [] when
    the trace has none. OctoPipeError (one line) for a malformed list."""
    peaks = other.get("peak_memory_gib") if isinstance(other, dict) else None
    if peaks is None:
        return []
    where = "otherData.peak_memory_gib"
    if not isinstance(peaks, list) or len(peaks) > MAX_RANKS:
        raise input_error(src, where, "not a list of ranks' peaks", FIX)
    out: list[float | None] = []
    for i, g in enumerate(peaks):
        ok = g is None or (not isinstance(g, bool) and isinstance(g, (int, float)))
        if not ok or (g is not None and not 0 <= g <= 1e5):
            raise input_error(src, f"{where}[{i}]", f"got {str(g)[:20]!r}", "0..100000 GiB or null")
        out.append(None if g is None else float(g))
    return out


def steps(trace: pd.DataFrame) -> list[int]:
    return sorted(int(s) for s in trace["step"].unique())


def match_plan(trace: pd.DataFrame, plan: Plan, src: str, step: int) -> pd.DataFrame:
    """The compute ops and waits of ``step``, checked to be ``plan``'s (each rank runs exactly
    its device's actions), with times from the step's first event (ms)."""
    one = trace[trace["step"] == step]
    if one.empty:
        raise OctoPipeError(f"{src}: no events of step {step}; fix: pick one of {steps(trace)}")
    ranks = int(trace["device"].max()) + 1
    if ranks != plan.num_devices:
        raise OctoPipeError(
            f"{src}: the trace has {ranks} ranks, plan '{plan.name}' {plan.num_devices} devices; "
            "fix: pick the plan that was exported and run, or upload its trace"
        )
    comp = one[one["cat"] == "compute"]
    for d in range(plan.num_devices):
        want = sorted(str(a) for a in plan.schedule[d])
        got = sorted(comp.loc[comp["device"] == d, "op"])
        if want != got:
            extra = sorted(set(got) - set(want))[:3] or sorted(set(want) - set(got))[:3]
            raise OctoPipeError(
                f"{src}: rank {d} ran {len(got)} ops, plan '{plan.name}' has {len(want)} on "
                f"d{d} (differs at {', '.join(extra) or 'their count'}); fix: pick the plan that "
                "was exported and run, or upload its trace"
            )
    out = one[one["cat"].isin(["compute", "wait"])].copy()
    t0 = float(out["start_ms"].min())
    out["start_ms"] -= t0
    out["end_ms"] -= t0
    return out


def order_check(run: pd.DataFrame, plan: Plan) -> list[str]:
    """Per device where the executed order first departs from the plan's ("" if it does not)."""
    out = []
    comp = run[run["cat"] == "compute"].sort_values(["device", "start_ms"], kind="stable")
    for d in range(plan.num_devices):
        got = list(comp.loc[comp["device"] == d, "op"])
        want = [str(a) for a in plan.schedule[d]]
        first = next((i for i, (x, y) in enumerate(zip(got, want, strict=False)) if x != y), None)
        out.append("" if first is None else f"#{first}: ran {got[first]}, plan {want[first]}")
    return out


def peak_frame(sim_gib: list[float], run_gib: list[float | None]) -> pd.DataFrame:
    """Per device: the simulated and the measured peak memory (GiB) and their difference.

    >>> peak_frame([2.0, 3.0], [2.5, None]).iloc[0]["simulated / measured - 1"]
    '-20.0%'
    """
    rows = []
    for d, s in enumerate(sim_gib):
        m = run_gib[d] if d < len(run_gib) else None
        rows.append(
            {
                "device": f"d{d}",
                "simulated peak (GiB)": round(s, 3),
                "measured peak (GiB)": None if m is None else round(m, 3),
                "simulated / measured - 1": f"{s / m - 1:+.1%}" if m else "",
            }
        )
    return pd.DataFrame(rows)


def compare_frame(sim: pd.DataFrame, run: pd.DataFrame, plan: Plan) -> pd.DataFrame:
    """Per device: simulated and executed busy time, executed waits (ms) and order."""
    comp = sim[sim["stream"] == "compute"]
    ran = run[run["cat"] == "compute"]
    waits = run[run["cat"] == "wait"]
    orders = order_check(run, plan)
    rows = []
    for d in range(plan.num_devices):
        s = comp[comp["device"] == d]
        r = ran[ran["device"] == d]
        w = waits[waits["device"] == d]
        rows.append(
            {
                "device": f"d{d}",
                "simulated busy (ms)": round(float((s["end_ms"] - s["start_ms"]).sum()), 3),
                "executed busy (ms)": round(float((r["end_ms"] - r["start_ms"]).sum()), 3),
                "executed waiting for inputs (ms)": round(
                    float((w["end_ms"] - w["start_ms"]).sum()), 3
                ),
                "order as planned": "yes" if not orders[d] else f"no ({orders[d]})",
            }
        )
    return pd.DataFrame(rows)


def _as_timeline(run: pd.DataFrame, plan: Plan, scale: float) -> pd.DataFrame:
    labels = [f"{lo}-{hi - 1}" for lo, hi in plan.partition]
    comp = run[run["cat"] == "compute"]
    return pd.DataFrame(
        {
            "device": comp["device"].to_numpy(),
            "stream": "compute",
            "kind": comp["kind"].to_numpy(),
            "stage": comp["stage"].to_numpy(),
            "mb": comp["mb"].to_numpy(),
            "start_ms": comp["start_ms"].to_numpy() * scale,
            "end_ms": comp["end_ms"].to_numpy() * scale,
            "layers": [labels[s] if 0 <= s < len(labels) else "-" for s in comp["stage"]],
        }
    )


def overlay_figure(
    sim: pd.DataFrame, run: pd.DataFrame, plan: Plan, scale: float = 1.0
) -> go.Figure:
    """Each device's lane split in two: the simulated ops above, the executed ones (times
    multiplied by ``scale``, outlined) below, with their input waits in grey."""
    fig = go.Figure()
    sim_c = sim[sim["stream"] == "compute"]
    sim_c = sim_c[sim_c["kind"].isin(["F", "B", "W", "BW"])]
    for t in _bar_traces(sim_c, legend=True, lanes=SIM_LANES):
        t.name = f"simulated {t.name}"
        fig.add_trace(t)
    for t in _bar_traces(_as_timeline(run, plan, scale), legend=True, lanes=RUN_LANES):
        kind = next(k for k, v in KIND_LABELS.items() if v == t.name)
        t.name = f"executed {t.name}"
        t.legendgroup = f"run-{kind}"
        t.marker.line = {"width": 1, "color": "#222222"}
        fig.add_trace(t)
    w = run[run["cat"] == "wait"]
    if len(w):
        start = w["start_ms"].to_numpy() * scale
        fig.add_trace(
            go.Bar(
                x=w["end_ms"].to_numpy() * scale - start,
                base=start,
                y=w["device"].to_numpy() - RUN_LANES.compute_shift,
                width=RUN_LANES.compute_width * 0.5,
                orientation="h",
                name="executed: waiting for an input",
                marker={"color": "#9E9E9E"},
                customdata=w["op"].to_numpy(),
                hovertemplate="waiting for the input of %{customdata}<extra></extra>",
            )
        )
    d = plan.num_devices
    ticks = np.ravel([[i - SIM_LANES.compute_shift, i + SIM_LANES.compute_shift] for i in range(d)])
    text = np.ravel([[f"d{i} simulated", f"d{i} executed"] for i in range(d)])
    x_max = max(float(sim_c["end_ms"].max()), float(run["end_ms"].max()) * scale)
    fig.update_yaxes(
        autorange=False, range=[d - 0.5, -0.5], tickmode="array", tickvals=ticks, ticktext=text
    )
    fig.update_xaxes(range=[0, x_max * 1.01], title_text="time in the step (ms)")
    fig.update_layout(
        barmode="overlay",
        bargap=0,
        height=int(min(1400, max(260, 90 + 60 * d))),
        margin={"l": 110, "r": 20, "t": 60, "b": 50},
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0},
        hoverlabel={"align": "left"},
    )
    return fig
