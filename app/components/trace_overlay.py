"""Simulated against executed: the trace ``octopipe run`` records, laid over the simulated
timeline of the same plan (no Streamlit here).

``octopipe run JOB`` writes ``JOB/out/trace_executed.json`` (``executor/trace.py``); it is read
and checked by ``octopipe_core.executor.trace_read`` (one line naming the file, the event and
the fix for any problem; nothing in the file is executed). Its ops are named like the plan's
actions (``2F5``, ``2BW5``; transfers ``2SEND_F5``), ``pid`` is the global rank (replica x
pipeline device, ``otherData.layout``), and each step ends with its DP reductions
(``<stage>DP``), ``SYNC`` and ``OPT``.

>>> import json
>>> raw = json.dumps({"traceEvents": [
...     {"name": "0F0", "cat": "compute", "ph": "X", "pid": 0, "tid": 0, "ts": 0.0,
...      "dur": 1000.0, "args": {"step": 0}}], "otherData": {"source": "executed"}})
>>> t = parse_trace(raw.encode(), "run.json")
>>> t[["device", "replica", "kind", "stage", "mb", "start_ms", "end_ms"]].values.tolist()
[[0, 0, 'F', 0, 0, 0.0, 1.0]]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from app.components.charts import Lanes, _bar_traces
from app.components.palette import KIND_LABELS
from octopipe_core.errors import OctoPipeError
from octopipe_core.executor.mesh import JobLayout
from octopipe_core.executor.trace_read import COMM, COMPUTE, DP, read_executed_trace
from octopipe_core.plan import Plan

COLUMNS = [
    "device", "replica", "rank", "step", "cat", "kind", "stage", "mb", "op", "start_ms", "end_ms"
]  # fmt: skip
SIM_LANES = Lanes(compute_shift=0.2, compute_width=0.36, comm_offset=0.0, comm_width=0.0)
RUN_LANES = Lanes(compute_shift=-0.2, compute_width=0.36, comm_offset=0.0, comm_width=0.0)
FIX = "pick the plan that was exported and run, or upload its trace"


def _split(op: str) -> tuple[str, int, int]:
    """``(kind, stage, mb)`` of an op or a tail name (``DP``/``SYNC``/``OPT``, mb -1)."""
    m = COMPUTE.match(op) or COMM.match(op)
    if m is not None:
        return m[2], int(m[1]), int(m[3])
    dp = DP.match(op)
    return ("DP", int(dp[1]), -1) if dp else (op, -1, -1)


def parse_trace(raw: bytes, src: str) -> pd.DataFrame:
    """One row per executed op, input wait (``cat`` "wait") and DP reduction, step sync or
    optimizer step (``cat`` "dp"): ``COLUMNS``, ``device`` the pipeline device, times in ms
    from the trace's base. ``attrs``: ``layout`` (``JobLayout``), ``step_spans_ms`` (step ->
    (start, end)), ``peak_memory_gib`` (per global rank, [] when the run measured none).
    OctoPipeError (one line) for anything else (``trace_read.read_executed_trace``)."""
    t = read_executed_trace(raw, src)
    rows: list[tuple[Any, ...]] = []
    for rank, step, op, start, end, wait in t.records:
        rep, dev = t.device_of(rank)
        kind, stage, mb = _split(op)
        if wait > 0:
            rows.append((dev, rep, rank, step, "wait", kind, stage, mb, op, start - wait, start))
        cat = "comm" if COMM.match(op) else "compute"
        rows.append((dev, rep, rank, step, cat, kind, stage, mb, op, start, end))
    for rank, step, name, start, end in t.tail:
        rep, dev = t.device_of(rank)
        kind, stage, mb = _split(name)
        rows.append((dev, rep, rank, step, "dp", kind, stage, mb, name, start, end))
    df = pd.DataFrame(rows, columns=COLUMNS)
    df["start_ms"] *= 1e3
    df["end_ms"] *= 1e3
    df.attrs["layout"] = t.layout
    df.attrs["step_spans_ms"] = {s: (a * 1e3, b * 1e3) for s, (a, b) in t.step_spans.items()}
    df.attrs["peak_memory_gib"] = t.peak_memory_gib
    return df


def layout_of(trace: pd.DataFrame) -> JobLayout:
    """The run's rank layout (one replica of every device in the trace if it has none).

    >>> layout_of(pd.DataFrame({"device": [0, 2]})).label()
    'PP3 x DP1'
    """
    lay = trace.attrs.get("layout")
    return lay if isinstance(lay, JobLayout) else JobLayout(pp=int(trace["device"].max()) + 1)


def replica_peaks(trace: pd.DataFrame, replica: int) -> list[float | None]:
    """The measured peak memory (GiB) of each pipeline device of ``replica`` ([] if none).

    >>> t = pd.DataFrame({"device": [0, 1]})
    >>> t.attrs = {"layout": JobLayout(pp=2, dp=2), "peak_memory_gib": [1.0, 2.0, 3.0, None]}
    >>> replica_peaks(t, 1)
    [2.0, None]
    """
    peaks = trace.attrs.get("peak_memory_gib", [])
    ranks = layout_of(trace).pipeline(replica)
    return [peaks[r] if r < len(peaks) else None for r in ranks] if peaks else []


def steps(trace: pd.DataFrame) -> list[int]:
    return sorted(int(s) for s in trace["step"].unique())


def match_plan(
    trace: pd.DataFrame, plan: Plan, src: str, step: int, replica: int = 0
) -> pd.DataFrame:
    """The ops, waits and DP rows of ``step`` on ``replica``'s ranks, checked to be ``plan``'s
    (each pipeline device runs exactly its actions), times from the step's start (ms);
    ``attrs["step_ms"]``: the measured step (its span over every rank)."""
    lay = layout_of(trace)
    if lay.pp != plan.num_devices:
        raise OctoPipeError(
            f"{src}: the run was a {lay.pp}-device pipeline ({lay.label()}), plan "
            f"'{plan.name}' has {plan.num_devices} devices; fix: {FIX}"
        )
    if not 0 <= replica < lay.dp:
        raise OctoPipeError(
            f"{src}: no replica {replica}, the run had {lay.dp}; fix: pick 0..{lay.dp - 1}"
        )
    one = trace[(trace["step"] == step) & (trace["replica"] == replica)]
    if one.empty:
        raise OctoPipeError(f"{src}: no events of step {step}; fix: pick one of {steps(trace)}")
    comp = one[one["cat"] == "compute"]
    for d in range(plan.num_devices):
        want = sorted(str(a) for a in plan.schedule[d])
        got = sorted(comp.loc[comp["device"] == d, "op"])
        if want != got:
            extra = sorted(set(got) - set(want))[:3] or sorted(set(want) - set(got))[:3]
            where = f" (replica {replica})" if lay.dp > 1 else ""
            raise OctoPipeError(
                f"{src}: rank {lay.rank(replica, d)}{where} ran {len(got)} ops, plan "
                f"'{plan.name}' has {len(want)} on d{d} (differs at "
                f"{', '.join(extra) or 'their count'}); fix: {FIX}"
            )
    out = one[one["cat"] != "comm"].copy()
    spans = trace.attrs.get("step_spans_ms", {})
    lo, hi = spans.get(step, (float(one["start_ms"].min()), float(one["end_ms"].max())))
    out["start_ms"] -= lo
    out["end_ms"] -= lo
    out.attrs = {"step_ms": hi - lo, "replica": replica}
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


def _error_pct(predicted: float, measured: float) -> float | None:
    """``100 * (predicted - measured) / measured``, 0.1 % steps (None without a measure)."""
    return round(100.0 * (predicted / measured - 1.0), 1) if measured > 0 else None


def _span(rows: pd.DataFrame) -> float:
    return float(rows["end_ms"].max() - rows["start_ms"].min()) if len(rows) else 0.0


def compare_frame(
    sim: pd.DataFrame, run: pd.DataFrame, plan: Plan, step_ms: float | None = None
) -> pd.DataFrame:
    """Per device, predicted (the simulated timeline) against measured (the run's step, from
    ``match_plan``): the span from the device's first op start to its last op end, the busy
    time (sum of its ops), the error of each in %, the run's input waits and its order; then
    the whole step, predicted ``step_ms`` (the simulated step time) against the measured step
    (``run.attrs["step_ms"]``), when both are known. Times in ms."""
    comp = sim[sim["stream"] == "compute"]
    ran = run[run["cat"] == "compute"]
    waits = run[run["cat"] == "wait"]
    orders = order_check(run, plan)
    rows: list[dict[str, Any]] = []
    for d in range(plan.num_devices):
        s, r = comp[comp["device"] == d], ran[ran["device"] == d]
        w = waits[waits["device"] == d]
        sim_busy = float((s["end_ms"] - s["start_ms"]).sum())
        run_busy = float((r["end_ms"] - r["start_ms"]).sum())
        rows.append(
            {
                "device": f"d{d}",
                "simulated_span_ms": round(_span(s), 3),
                "executed_span_ms": round(_span(r), 3),
                "span_error_%": _error_pct(_span(s), _span(r)),
                "simulated_busy_ms": round(sim_busy, 3),
                "executed_busy_ms": round(run_busy, 3),
                "busy_error_%": _error_pct(sim_busy, run_busy),
                "executed_wait_ms": round(float((w["end_ms"] - w["start_ms"]).sum()), 3),
                "order as planned": "yes" if not orders[d] else f"no ({orders[d]})",
            }
        )
    measured = run.attrs.get("step_ms")
    if step_ms is not None and measured is not None:
        rows.append(
            {
                "device": "whole step",
                "simulated_span_ms": round(step_ms, 3),
                "executed_span_ms": round(float(measured), 3),
                "span_error_%": _error_pct(step_ms, float(measured)),
                "order as planned": "",
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


def _side_bars(rows: pd.DataFrame, scale: float, name: str, color: str, hover: str) -> go.Bar:
    """Thin bars in the executed half of each lane: waits, or the step's tail."""
    start = rows["start_ms"].to_numpy() * scale
    return go.Bar(
        x=rows["end_ms"].to_numpy() * scale - start,
        base=start,
        y=rows["device"].to_numpy() - RUN_LANES.compute_shift,
        width=RUN_LANES.compute_width * 0.5,
        orientation="h",
        name=name,
        marker={"color": color},
        customdata=rows["op"].to_numpy(),
        hovertemplate=hover,
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
    side = (
        ("wait", "executed: waiting for an input", "#9E9E9E",
         "waiting for the input of %{customdata}<extra></extra>"),
        ("dp", "executed: DP reduction, step sync, optimizer", "#5C6BC0",
         "%{customdata}: %{x:.3f} ms<extra></extra>"),
    )  # fmt: skip
    for cat, name, color, hover in side:
        rows = run[run["cat"] == cat]
        if len(rows):
            fig.add_trace(_side_bars(rows, scale, name, color, hover))
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
