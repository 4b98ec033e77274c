"""Plotly figures other than the Gantt chart: memory curves, layer costs, sweeps, where the time
goes and peak memory per device. Pure functions of plain tables (no Streamlit).

Where the time goes: each device's step splits into busy compute and four kinds of idle
(``octopipe_core.breakdown``): fill (before its first op), waiting on transfers, idle between
ops for other reasons, and drain (after its last op). The idle parts add up to the device's
bubble; the plan's bubble ratio is idle / (devices x step time).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.components.palette import (
    CAP_COLOR,
    KIND_COLORS,
    device_colors,
    legend_stub,
    plan_colors,
)

# (column of a breakdown frame, legend label, colour), in drawing order
TIME_PARTS = (
    ("busy_ms", "busy (compute)", "#5B6F82"),
    ("fill_ms", "fill: idle before the first op", "#F2CF5B"),
    ("wait_transfer_ms", "waiting on transfers", "#9ECAE9"),
    ("idle_between_ms", "idle between ops (other)", "#E8875F"),
    ("drain_ms", "drain: idle after the last op", "#BDBDBD"),
)
IDLE_PARTS = tuple(c for c, _, _ in TIME_PARTS[1:])
MAX_LAYER_BARS = 1500  # above this, the layer chart shows groups of consecutive layers
MAX_DEVICE_LINES = 64  # memory curves: one line (and colour) per device up to this many


def bubble_ratio(frame: pd.DataFrame) -> float:
    """Idle / (devices x step time) of a breakdown frame (the simulator's ``bubble_ratio``).

    >>> f = pd.DataFrame({"busy_ms": [6.0, 8.0], "fill_ms": [2.0, 0.0], "wait_transfer_ms":
    ...     [0.0, 1.0], "idle_between_ms": [1.0, 0.0], "drain_ms": [1.0, 1.0]})
    >>> bubble_ratio(f)
    0.3
    """
    idle = float(frame[list(IDLE_PARTS)].to_numpy().sum())
    total = idle + float(frame["busy_ms"].sum())
    return 0.0 if total <= 0 else round(idle / total, 6)


def where_time_figure(frames: Mapping[str, pd.DataFrame]) -> go.Figure:
    """Per plan (one panel each), per device: a bar of busy, fill, transfer waits, other idle
    and drain (ms), stacked to the step time. ``frames`` has one row per device with the
    ``TIME_PARTS`` columns (``octopipe_core.breakdown.DeviceTime.to_dict``)."""
    names = list(frames)
    devs = [len(f) for f in frames.values()]
    heights = [max(140, 40 + 14 * d) for d in devs]
    titles = [f"{n}: bubble ratio {bubble_ratio(f):.3f}" for n, f in frames.items()]
    fig = make_subplots(
        rows=len(names),
        cols=1,
        shared_xaxes=True,
        row_heights=heights,
        vertical_spacing=min(0.12, 70 / max(1, sum(heights))),
        subplot_titles=titles,
    )
    for r, f in enumerate(frames.values(), start=1):
        y = [f"d{d}" for d in f["device"]]
        for col, label, color in TIME_PARTS:
            fig.add_trace(
                go.Bar(
                    x=f[col].to_numpy(np.float64),
                    y=y,
                    orientation="h",
                    name=label,
                    legendgroup=col,
                    showlegend=r == 1,
                    marker={"color": color, "line": {"width": 0}},
                    hovertemplate=f"%{{y}}: {label} %{{x:,.1f}} ms<extra></extra>",
                ),
                row=r,
                col=1,
            )
        step = max(1, len(y) // 16)
        fig.update_yaxes(autorange="reversed", tickmode="array", tickvals=y[::step], row=r, col=1)
    fig.update_xaxes(title_text="time in the step (ms)", row=len(names), col=1)
    fig.update_layout(
        barmode="stack",
        bargap=0.15,
        height=sum(heights) + 50 * len(names) + 130,
        margin={"l": 60, "r": 20, "t": 50, "b": 120},
        legend={"orientation": "h", "y": 0, "yanchor": "bottom", "x": 0, "yref": "container"},
    )
    fig.update_annotations(font_size=12)
    return fig


def peak_memory_figure(peaks: Mapping[str, Sequence[float]], cap_gib: float) -> go.Figure:
    """Peak memory (GiB) per device, one bar group per device and one colour per plan; bars
    over the cap are red-outlined and cross-hatched; the cap is a dashed line."""
    fig = go.Figure()
    colors = plan_colors(len(peaks))
    over_any = False
    for (name, vals), color in zip(peaks.items(), colors, strict=True):
        v = np.asarray(vals, np.float64)
        over = v > cap_gib + 1e-9
        over_any = over_any or bool(over.any())
        fig.add_trace(
            go.Bar(
                x=[f"d{d}" for d in range(len(v))],
                y=v,
                name=name,
                marker={
                    "color": color,
                    "line": {"color": np.where(over, CAP_COLOR, color).tolist(), "width": 2},
                    "pattern": {"shape": np.where(over, "x", "").tolist(), "solidity": 0.25},
                },
                customdata=np.where(over, "over the cap", "fits").astype(object),
                hovertemplate=f"{name}<br>%{{x}}: %{{y:.2f}} GiB (%{{customdata}})<extra></extra>",
            )
        )
    if over_any:
        fig.add_trace(
            legend_stub(
                "over the cap", "#FFFFFF", line={"color": CAP_COLOR, "width": 2},
                pattern={"shape": "x"},
            )
        )  # fmt: skip
    fig.add_hline(
        y=cap_gib,
        line={"dash": "dash", "color": CAP_COLOR, "width": 1.5},
        annotation_text=f"cap {cap_gib:g} GiB",
        annotation_position="top left",
    )
    top = max([cap_gib, *(max(v, default=0.0) for v in peaks.values())])
    fig.update_yaxes(title_text="peak memory (GiB)", range=[0, top * 1.12])
    fig.update_xaxes(title_text="device")
    fig.update_layout(
        barmode="group",
        height=300,
        margin={"l": 60, "r": 20, "t": 40, "b": 50},
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0},
    )
    return fig


# --------------------------------------------------------------------------------------------
def memory_figure(
    curves: Mapping[str, pd.DataFrame], cap_gib: float, *, x_max_ms: float | None = None
) -> go.Figure:
    """Memory (GiB) against time (ms) per device, one panel per plan, the cap drawn dashed.

    Each device has its own colour from a sequential scale (d0 dark to the last device
    light), so colours never repeat; past ``MAX_DEVICE_LINES`` devices one trace draws all.
    """
    names = list(curves)
    fig = make_subplots(
        rows=1, cols=len(names), shared_yaxes=True, subplot_titles=names, horizontal_spacing=0.04
    )
    top = cap_gib
    for c, df in enumerate(curves.values(), start=1):
        devices = sorted(df["device"].unique())
        if len(devices) <= MAX_DEVICE_LINES:
            colors = device_colors(len(devices))
            for d, color in zip(devices, colors, strict=True):
                g = df[df["device"] == d]
                fig.add_trace(
                    go.Scatter(
                        x=g["time_ms"].to_numpy(np.float32),
                        y=g["memory_gib"].to_numpy(np.float32),
                        mode="lines",
                        line={"shape": "hv", "width": 1.4, "color": color},
                        name=f"d{d}",
                        legendgroup=f"d{d}",
                        showlegend=c == 1,
                        hovertemplate=f"d{d}: %{{y:.2f}} GiB at %{{x:.1f}} ms<extra></extra>",
                    ),
                    row=1,
                    col=c,
                )
        else:
            # one trace for all devices, NaN-separated (a gap between devices)
            parts_x, parts_y, parts_d = [], [], []
            for d in devices:
                g = df[df["device"] == d]
                parts_x += [g["time_ms"].to_numpy(np.float32), np.array([np.nan], np.float32)]
                parts_y += [g["memory_gib"].to_numpy(np.float32), np.array([np.nan], np.float32)]
                parts_d += [np.full(len(g) + 1, d, np.int32)]
            fig.add_trace(
                go.Scatter(
                    x=np.concatenate(parts_x),
                    y=np.concatenate(parts_y),
                    customdata=np.concatenate(parts_d),
                    mode="lines",
                    line={"shape": "hv", "width": 1},
                    name="all devices",
                    showlegend=c == 1,
                    hovertemplate="d%{customdata}: %{y:.2f} GiB at %{x:.1f} ms<extra></extra>",
                ),
                row=1,
                col=c,
            )
        top = max(top, float(df["memory_gib"].max()) if len(df) else 0.0)
        fig.add_hline(
            y=cap_gib,
            line={"dash": "dash", "color": CAP_COLOR, "width": 1.5},
            annotation_text=f"cap {cap_gib:g} GiB",
            annotation_position="top left",
            row=1,
            col=c,
        )
        fig.update_xaxes(title_text="time (ms)", row=1, col=c)
        if x_max_ms:
            fig.update_xaxes(range=[0, x_max_ms * 1.01], row=1, col=c)
    fig.update_yaxes(title_text="memory (GiB)", range=[0, top * 1.08], row=1, col=1)
    fig.update_layout(height=340, margin={"l": 60, "r": 20, "t": 40, "b": 50})
    return fig


def _grouped_layers(layers: pd.DataFrame, limit: int) -> tuple[pd.DataFrame, int]:
    """At most ``limit`` rows: consecutive layers averaged in groups (and the group size)."""
    n = len(layers)
    k = max(1, -(-n // limit))
    if k == 1:
        return layers, 1
    g = layers.groupby(np.arange(n) // k)
    out = g[["F (ms)", "B (ms)", "W (ms)"]].mean()
    out["layer"] = g["layer"].first().to_numpy()
    out["type"] = g["type"].agg(lambda s: ",".join(sorted(set(s)))).to_numpy()
    return out.reset_index(drop=True), k


def layer_cost_figure(
    layers: pd.DataFrame, types: pd.DataFrame, *, max_bars: int = MAX_LAYER_BARS
) -> go.Figure:
    """Left: F/B/W time (ms) of every layer, stacked (past ``max_bars`` layers, the mean of
    groups of consecutive layers). Right: memory (MiB) by layer type."""
    shown, k = _grouped_layers(layers, max_bars)
    left = "time per layer (ms)" if k == 1 else f"time per layer (ms, mean of {k} layers)"
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.68, 0.32],
        subplot_titles=[left, "memory by layer type (MiB)"],
        horizontal_spacing=0.08,
    )
    what = "layer %{x}" if k == 1 else f"layers %{{x}}+{k - 1}"
    for col, kind in (("F (ms)", "F"), ("B (ms)", "B"), ("W (ms)", "W")):
        fig.add_trace(
            go.Bar(
                x=shown["layer"],
                y=shown[col],
                name=f"{kind} time (ms)",
                marker={"color": KIND_COLORS[kind], "line": {"width": 0}},
                customdata=shown[["type"]].to_numpy(),
                hovertemplate=f"{what} (%{{customdata[0]}}): {kind} %{{y:.3f}} ms<extra></extra>",
            ),
            row=1,
            col=1,
        )
    for col, label, color in (
        ("activation_mib", "activation / micro-batch (MiB)", "#72B7B2"),
        ("w_stash_mib", "kept for W (MiB)", "#EECA3B"),
        ("weight_mib", "weights + optimizer (MiB)", "#9D755D"),
    ):
        fig.add_trace(
            go.Bar(
                x=types["type"],
                y=types[col],
                name=label,
                marker={"color": color},
                hovertemplate=f"%{{x}}: {label} %{{y:,.1f}}<extra></extra>",
            ),
            row=1,
            col=2,
        )
    fig.update_layout(
        barmode="stack",
        height=360,
        margin={"l": 60, "r": 20, "t": 40, "b": 50},
        legend={"orientation": "h", "y": -0.22},
        meta={"layers_per_bar": k},
    )
    # the right panel groups rather than stacks: give each bar its own offset group
    for t in fig.data[3:]:
        t.offsetgroup = t.name
    fig.update_xaxes(title_text="layer index", row=1, col=1)
    fig.update_yaxes(title_text="time (ms)", row=1, col=1)
    fig.update_yaxes(title_text="memory (MiB)", row=1, col=2)
    return fig


def sweep_figure(df: pd.DataFrame, x: str, cap_gib: float) -> go.Figure:
    """Throughput (tokens/GPU/s) and peak memory (GiB) against ``x`` per schedule; a point
    whose plan does not fit the memory cap (``fits_memory`` false) is a hollow red-ringed
    cross on both panels."""
    xlabel = {"microbatches": "micro-batches", "devices": "devices"}.get(x, x)
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=["throughput (tokens/GPU/s)", "peak memory (GiB, max over devices)"],
        horizontal_spacing=0.08,
    )
    groups = list(df.groupby("plan", sort=False))
    fits_col = "fits_memory" in df.columns
    any_over = False
    for (name, g), color in zip(groups, plan_colors(len(groups)), strict=True):
        g = g.sort_values(x)
        fits = g["fits_memory"].to_numpy(bool) if fits_col else np.ones(len(g), bool)
        any_over = any_over or not fits.all()
        marker: dict[str, Any] = {
            "color": np.where(fits, color, "rgba(0,0,0,0)").tolist(),
            "symbol": np.where(fits, "circle", "x-thin-open").tolist(),
            "size": np.where(fits, 7, 11).tolist(),
            "line": {"color": np.where(fits, color, CAP_COLOR).tolist(), "width": 2},
        }
        note = np.where(fits, "fits the cap", "OVER the memory cap").astype(object)
        for col, ycol in ((1, "tokens_per_gpu_per_s"), (2, "max_peak_memory_gib")):
            fig.add_trace(
                go.Scatter(
                    x=g[x],
                    y=g[ycol],
                    mode="lines+markers",
                    name=str(name),
                    legendgroup=str(name),
                    showlegend=col == 1,
                    line={"color": color},
                    marker=marker,
                    customdata=note,
                    hovertemplate=f"{name}: %{{y:,.2f}} at {xlabel}=%{{x}} (%{{customdata}})"
                    "<extra></extra>",
                ),
                row=1,
                col=col,
            )
    if any_over:
        fig.add_trace(
            go.Scatter(
                x=[None], y=[None], mode="markers", name="does not fit the memory cap",
                marker={"symbol": "x-thin-open", "size": 11, "line": {"color": CAP_COLOR,
                        "width": 2}},
            ),
            row=1, col=1,
        )  # fmt: skip
    fig.add_hline(
        y=cap_gib,
        line={"dash": "dash", "color": CAP_COLOR},
        annotation_text=f"cap {cap_gib:g} GiB",
        row=1,
        col=2,
    )
    fig.update_xaxes(title_text=xlabel, type="log", dtick=np.log10(2))
    fig.update_yaxes(title_text="tokens/GPU/s", row=1, col=1)
    fig.update_yaxes(title_text="memory (GiB)", row=1, col=2)
    fig.update_layout(height=360, margin={"l": 60, "r": 20, "t": 40, "b": 50})
    return fig
