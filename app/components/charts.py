"""Plotly figures of the dashboard, as pure functions of plain tables (tests assert on them).

Gantt charts draw one trace per op kind (horizontal ``go.Bar`` with ``base=start``), never one
per block. Past ``max_bars`` blocks a panel is drawn as a raster instead: a heatmap with one
row per device and about one column per screen pixel (``bins``), each cell showing the op that
ends last in it, with the op's stage, micro-batch and layers in the hover. At the default zoom
the raster loses nothing the eye could see (at p=64, m=256 a block is about one pixel wide),
and a browser draws it several times faster than thousands of SVG bars; bars stay available
for sharp zooming (``max_bars`` large).

On a cluster the timeline gets more: transfers that cross nodes get their own darker colours
on the comm strip (``send_F_x``, ``send_B_x``), each device gets a third strip for its
data-parallel stream (gradient reductions, ZeRO-1 parameter all-gathers, the timeline's
``stream == "dp"`` rows), and the optimizer step is drawn on the compute lane.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

COMPUTE_KINDS = ("F", "B", "W", "BW", "optimizer")
COMM_KINDS = ("send_F", "send_B", "send_F_x", "send_B_x")
DP_KINDS = ("grad_sync", "param_gather")
KINDS = (*COMPUTE_KINDS, *COMM_KINDS, *DP_KINDS)
KIND_COLORS = {
    "F": "#4C78A8",
    "B": "#F58518",
    "W": "#54A24B",
    "BW": "#B64E9B",
    "optimizer": "#9D755D",
    "send_F": "#9ECAE9",
    "send_B": "#FFBF79",
    "send_F_x": "#08306B",
    "send_B_x": "#A63603",
    "grad_sync": "#E45756",
    "param_gather": "#17BECF",
}
KIND_LABELS = {
    "F": "F (forward)",
    "B": "B (input grad)",
    "W": "W (weight grad)",
    "BW": "BW (fused backward)",
    "optimizer": "optimizer step",
    "send_F": "send activation",
    "send_B": "send gradient",
    "send_F_x": "send activation (inter-node)",
    "send_B_x": "send gradient (inter-node)",
    "grad_sync": "DP gradient reduction",
    "param_gather": "ZeRO-1 parameter all-gather",
}
INTER_NODE = " (inter-node)"  # suffix of the timeline's "layers" on a transfer across nodes
DEFAULT_MAX_BARS = 3000
DEFAULT_BINS = 1000
COMPUTE_WIDTH = 0.62
COMPUTE_SHIFT = 0.08  # compute lane centre above the device tick (y grows downwards)
COMM_WIDTH = 0.18
COMM_OFFSET = 0.36  # comm strip centre below the device tick
TEMPLATE = "plotly_white"


@dataclass(frozen=True)
class Lanes:
    """Where a device's lanes sit around its tick ``d`` (y grows downwards): centre offsets
    and widths of the compute lane, the comm strip and (on a cluster) the DP strip."""

    compute_shift: float = COMPUTE_SHIFT
    compute_width: float = COMPUTE_WIDTH
    comm_offset: float = COMM_OFFSET
    comm_width: float = COMM_WIDTH
    dp_offset: float = 0.0
    dp_width: float = 0.0


FLAT_LANES = Lanes()
DP_LANES = Lanes(0.14, 0.5, 0.18, 0.18, 0.36, 0.18)


def lanes_for(df: pd.DataFrame) -> Lanes:
    """Three lanes per device when the timeline has data-parallel rows, else two."""
    return DP_LANES if (df["stream"] == "dp").any() else FLAT_LANES


def with_link_kinds(df: pd.DataFrame) -> pd.DataFrame:
    """The timeline with transfers across nodes renamed ``send_F_x`` / ``send_B_x`` (the
    simulator marks them by an ``" (inter-node)"`` suffix on ``layers``)."""
    comm = df["stream"] == "comm"
    if not comm.any():
        return df
    cross = comm & df["layers"].str.endswith(INTER_NODE)
    if not cross.any():
        return df
    out = df.copy()
    out.loc[cross, "kind"] = out.loc[cross, "kind"] + "_x"
    return out


def lane_height(devices: int) -> int:
    """Pixels per plan panel: grows with the device count, within readable bounds."""
    return int(min(1100, max(170, 60 + 26 * devices)))


def _split_layers(layers: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    parts = layers.str.split("-", n=1, expand=True)
    lo = pd.to_numeric(parts[0], errors="coerce").fillna(-1).to_numpy(np.int32)
    hi = pd.to_numeric(parts[1], errors="coerce").fillna(-1).to_numpy(np.int32)
    return lo, hi


def _bar_traces(df: pd.DataFrame, legend: bool, lanes: Lanes = FLAT_LANES) -> list[go.Bar]:
    traces = []
    for kind in KINDS:
        g = df[df["kind"] == kind]
        if g.empty:
            continue
        start = g["start_ms"].to_numpy(np.float64)
        dur = g["end_ms"].to_numpy(np.float64) - start
        dev = g["device"].to_numpy(np.int32)
        when = "%{customdata[5]:.2f}–%{customdata[6]:.2f} ms (%{x:.3f} ms)<extra></extra>"
        if kind in COMM_KINDS:
            dst = g["layers"].str.extract(r"^to d(\d+)", expand=False)
            dst_i = pd.to_numeric(dst, errors="coerce").fillna(-1).to_numpy(np.int32)
            cd = np.column_stack([g["stage"], g["mb"], dst_i, dst_i, dev, start, start + dur])
            hover = (
                f"<b>{KIND_LABELS[kind]}</b> d%{{customdata[4]}} → d%{{customdata[2]}}<br>"
                f"from stage %{{customdata[0]}} · micro-batch %{{customdata[1]}}<br>{when}"
            )
            y, width = dev + lanes.comm_offset, lanes.comm_width
        elif kind in DP_KINDS:
            cd = np.column_stack([g["stage"], g["mb"], dev, dev, dev, start, start + dur])
            hover = (
                f"<b>{KIND_LABELS[kind]}</b> on d%{{customdata[4]}}<br>"
                f"gradients of stage %{{customdata[0]}} over the DP group<br>{when}"
            )
            y, width = dev + lanes.dp_offset, lanes.dp_width
        elif kind == "optimizer":
            cd = np.column_stack([g["stage"], g["mb"], dev, dev, dev, start, start + dur])
            hover = f"<b>{KIND_LABELS[kind]}</b> on d%{{customdata[4]}}<br>{when}"
            y, width = dev - lanes.compute_shift, lanes.compute_width
        else:
            lo, hi = _split_layers(g["layers"])
            cd = np.column_stack([g["stage"], g["mb"], lo, hi, dev, start, start + dur])
            hover = (
                f"<b>{KIND_LABELS[kind]}</b> on d%{{customdata[4]}}<br>"
                "stage %{customdata[0]} · micro-batch %{customdata[1]}<br>"
                f"layers %{{customdata[2]}}–%{{customdata[3]}}<br>{when}"
            )
            y, width = dev - lanes.compute_shift, lanes.compute_width
        traces.append(
            go.Bar(
                x=dur,
                base=start,
                y=y,
                width=width,
                orientation="h",
                name=KIND_LABELS[kind],
                legendgroup=kind,
                showlegend=legend,
                marker={"color": KIND_COLORS[kind], "line": {"width": 0}},
                customdata=cd.astype(np.float32),
                hovertemplate=hover,
            )
        )
    return traces


RASTER_KINDS = ("F", "B", "W", "BW", *COMM_KINDS)  # the rest (few per device) stay bars


def _raster_traces(
    df: pd.DataFrame, devices: int, x_max: float, bins: int, lanes: Lanes = FLAT_LANES
) -> list[go.Heatmap]:
    """Compute ops as a (devices x bins) heatmap; comm as a thin strip under each lane (and,
    with a DP strip, a blank band under it where the DP bars go)."""
    dt = x_max / bins if x_max > 0 else 1.0
    # Codes 2..11 and small unsigned ints keep the base64 payload free of '/', which
    # plotly.io.to_json (what Streamlit sends) escapes as six characters.
    codes = {k: i + 2 for i, k in enumerate(RASTER_KINDS)}
    comp = df[(df["stream"] == "compute") & df["kind"].isin(RASTER_KINDS)]
    comm = df[df["stream"] == "comm"]
    z = np.full((devices, bins), np.nan, np.float32)  # NaN: idle, no colour, no hover
    lo, hi = _split_layers(comp["layers"])
    top = max(int(comp["stage"].max()), int(comp["mb"].max()), int(hi.max())) if len(comp) else 0
    cd = np.zeros((devices, bins, 4), np.uint8 if top < 256 else np.uint16)
    _fill(z, cd, comp, lo, hi, dt, bins, codes)
    # strip rows per device: the comm strip (0: white), [a blank band (0)], a clear gap (1)
    k = 3 if lanes.dp_width else 2
    zc = np.zeros((k * devices, bins), np.uint8)
    zc[k - 1 :: k] = 1
    _fill_comm(zc, comm, dt, bins, codes, k)
    n = len(RASTER_KINDS) + 2  # codes 0, 1: transparent (0 marks an empty comm cell)
    scale: list[list[Any]] = [[0.0, "rgba(0,0,0,0)"], [2 / n, "rgba(0,0,0,0)"]]
    for i, kind in enumerate(RASTER_KINDS, start=2):
        scale += [[i / n, KIND_COLORS[kind]], [(i + 1) / n, KIND_COLORS[kind]]]
    common = {
        "x0": dt / 2,
        "dx": dt,
        "zmin": -0.5,
        "zmax": n - 0.5,
        "colorscale": scale,
        "showscale": False,
        "zsmooth": False,
    }
    # Row edges: compute cells span [d-0.55, d+0.45]; the comm strip (and the DP band) are
    # drawn over their bottom in opaque white (empty cells), which also separates lanes.
    # No xgap/ygap: with gaps plotly paints every cell with fillRect instead of one image.
    y_comp = np.arange(devices + 1, dtype=np.float64) - 0.55
    d = np.arange(devices, dtype=np.float64)
    if lanes.dp_width:
        c_lo = lanes.comm_offset - lanes.comm_width / 2
        c_hi = lanes.comm_offset + lanes.comm_width / 2
        y_comm = np.column_stack([d + c_lo, d + c_hi, d + 0.45]).ravel()
        y_comm = np.append(y_comm, devices + c_lo)
    else:
        y_comm = np.sort(np.concatenate([d + 0.25, d + 0.45]))
        y_comm = np.append(y_comm, devices + 0.25)
    comm_scale = [[0.0, "#FFFFFF"], [1 / n, "#FFFFFF"], [1 / n, "rgba(0,0,0,0)"], *scale[1:]]
    return [
        go.Heatmap(
            z=z,
            y=y_comp,
            customdata=cd,
            hoverongaps=False,
            name="compute",
            hovertemplate=(
                "d%{y:.0f} · %{x:.0f} ms<br>stage %{customdata[0]} · micro-batch "
                "%{customdata[1]}<br>layers %{customdata[2]}–%{customdata[3]}<extra>compute</extra>"
            ),
            **common,
        ),
        go.Heatmap(
            z=zc,
            y=y_comm,
            name="comm",
            hoverinfo="skip",
            **{**common, "colorscale": comm_scale},
        ),
    ]


def _cells(df: pd.DataFrame, dt: float, bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (op, column) pair an op touches: op index, device, column.

    Ops of a device come in time order, so when two ops share a column the later one is
    written last and wins: a column shows the op that ends last in it.
    """
    a = np.clip((df["start_ms"].to_numpy() / dt).astype(np.int64), 0, bins - 1)
    b = np.clip(np.ceil(df["end_ms"].to_numpy() / dt).astype(np.int64), 1, bins)
    lens = np.maximum(b, a + 1) - a
    op = np.repeat(np.arange(len(a)), lens)
    offset = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
    return op, df["device"].to_numpy()[op], a[op] + offset


def _fill(
    z: np.ndarray,
    cd: np.ndarray,
    df: pd.DataFrame,
    lo: np.ndarray,
    hi: np.ndarray,
    dt: float,
    bins: int,
    codes: dict[str, int],
) -> None:
    op, dev, col = _cells(df, dt, bins)
    z[dev, col] = df["kind"].map(codes).to_numpy()[op]
    info = np.column_stack([df["stage"].to_numpy(), df["mb"].to_numpy(), lo, hi])
    cd[dev, col] = info[op].astype(cd.dtype)


def _fill_comm(
    zc: np.ndarray, df: pd.DataFrame, dt: float, bins: int, codes: dict, rows: int = 2
) -> None:
    op, dev, col = _cells(df, dt, bins)
    zc[rows * dev, col] = df["kind"].map(codes).to_numpy()[op]


def _legend_stubs(kinds: list[str]) -> list[go.Bar]:
    return [
        go.Bar(
            x=[None],
            y=[None],
            name=KIND_LABELS[k],
            legendgroup=k,
            marker={"color": KIND_COLORS[k]},
            showlegend=True,
        )
        for k in kinds
    ]


def is_raster(timeline: pd.DataFrame, max_bars: int = DEFAULT_MAX_BARS) -> bool:
    return len(timeline) > max_bars


def compare_gantt_figure(
    timelines: Mapping[str, pd.DataFrame],
    *,
    max_bars: int = DEFAULT_MAX_BARS,
    bins: int = DEFAULT_BINS,
    x_max_ms: float | None = None,
) -> go.Figure:
    """Gantt panels, one per plan, on one shared time axis (ms); one lane per device.

    ``max_bars`` is per panel: a panel with more blocks is drawn as a raster of ``bins``
    time columns (see the module docstring).
    """
    names = list(timelines)
    devs = [int(df["device"].max()) + 1 if len(df) else 1 for df in timelines.values()]
    x_max = x_max_ms or max((float(df["end_ms"].max()) for df in timelines.values()), default=1)
    heights = [lane_height(d) for d in devs]
    fig = make_subplots(
        rows=len(names),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=min(0.12, 60 / max(1, sum(heights))),
        row_heights=heights,
        subplot_titles=names,
    )
    seen: set[str] = set()
    any_raster = False
    for r, raw in enumerate(timelines.values(), start=1):
        df = with_link_kinds(raw)
        lanes = lanes_for(df)
        kinds = [k for k in KINDS if (df["kind"] == k).any()]
        bars = df
        if is_raster(df, max_bars):
            any_raster = True
            for t in _raster_traces(df, devs[r - 1], x_max, bins, lanes):
                fig.add_trace(t, row=r, col=1)
            new = [k for k in kinds if k not in seen and k in RASTER_KINDS]
            for t in _legend_stubs(new):
                fig.add_trace(t, row=r, col=1)
            seen.update(new)
            bars = df[~df["kind"].isin(RASTER_KINDS)]  # DP ops and optimizer steps: few
        for t in _bar_traces(bars, legend=False, lanes=lanes):
            kind = next(k for k in KINDS if KIND_LABELS[k] == t.name)
            t.showlegend = kind not in seen
            fig.add_trace(t, row=r, col=1)
        seen.update(kinds)
        d = devs[r - 1]
        step = max(1, d // 16)
        fig.update_yaxes(
            autorange=False,
            range=[d - 0.5, -0.5],
            tickmode="array",
            tickvals=list(range(0, d, step)),
            ticktext=[f"d{i}" for i in range(0, d, step)],
            title_text="device",
            row=r,
            col=1,
        )
    fig.update_xaxes(range=[0, x_max * 1.01], title_text="time (ms)", row=len(names), col=1)
    height = sum(heights) + 60 * len(names) + 90
    plot_h = height - 80 - 50
    fig.update_layout(
        barmode="overlay",
        bargap=0,
        template=TEMPLATE,
        height=height,
        margin={"l": 60, "r": 20, "t": 80, "b": 50},
        # legend above the first panel's title
        legend={
            "orientation": "h",
            "y": 1.0 + 26 / plot_h,
            "yanchor": "bottom",
            "x": 0,
            "xanchor": "left",
        },
        hoverlabel={"align": "left"},
        meta={"raster": any_raster},
    )
    fig.update_annotations(font_size=13)
    return fig


def gantt_figure(
    timeline: pd.DataFrame,
    *,
    title: str = "",
    max_bars: int = DEFAULT_MAX_BARS,
    bins: int = DEFAULT_BINS,
    x_max_ms: float | None = None,
) -> go.Figure:
    """One plan's Gantt chart: a lane per device, compute above its comm strip, time in ms."""
    return compare_gantt_figure(
        {title or "timeline": timeline}, max_bars=max_bars, bins=bins, x_max_ms=x_max_ms
    )


# --------------------------------------------------------------------------------------------
def memory_figure(
    curves: Mapping[str, pd.DataFrame], cap_gib: float, *, x_max_ms: float | None = None
) -> go.Figure:
    """Memory (GiB) against time (ms) per device, one panel per plan, the cap drawn dashed."""
    names = list(curves)
    fig = make_subplots(
        rows=1, cols=len(names), shared_yaxes=True, subplot_titles=names, horizontal_spacing=0.04
    )
    top = cap_gib
    for c, df in enumerate(curves.values(), start=1):
        devices = sorted(df["device"].unique())
        if len(devices) <= 16:
            for d in devices:
                g = df[df["device"] == d]
                fig.add_trace(
                    go.Scatter(
                        x=g["time_ms"].to_numpy(np.float32),
                        y=g["memory_gib"].to_numpy(np.float32),
                        mode="lines",
                        line={"shape": "hv", "width": 1.4},
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
            line={"dash": "dash", "color": "#C00000", "width": 1.5},
            annotation_text=f"cap {cap_gib:g} GiB",
            annotation_position="top left",
            row=1,
            col=c,
        )
        fig.update_xaxes(title_text="time (ms)", row=1, col=c)
        if x_max_ms:
            fig.update_xaxes(range=[0, x_max_ms * 1.01], row=1, col=c)
    fig.update_yaxes(title_text="memory (GiB)", range=[0, top * 1.08], row=1, col=1)
    fig.update_layout(template=TEMPLATE, height=340, margin={"l": 60, "r": 20, "t": 40, "b": 50})
    return fig


def layer_cost_figure(layers: pd.DataFrame, types: pd.DataFrame) -> go.Figure:
    """Left: F/B/W time (ms) of every layer, stacked. Right: memory (MiB) by layer type."""
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.68, 0.32],
        subplot_titles=["time per layer (ms)", "memory by layer type (MiB)"],
        horizontal_spacing=0.08,
    )
    for col, kind in (("F (ms)", "F"), ("B (ms)", "B"), ("W (ms)", "W")):
        fig.add_trace(
            go.Bar(
                x=layers["layer"],
                y=layers[col],
                name=f"{kind} time (ms)",
                marker={"color": KIND_COLORS[kind]},
                customdata=layers[["type"]].to_numpy(),
                hovertemplate=f"layer %{{x}} (%{{customdata[0]}}): {kind} %{{y:.3f}} ms"
                "<extra></extra>",
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
        template=TEMPLATE,
        height=360,
        margin={"l": 60, "r": 20, "t": 40, "b": 50},
        legend={"orientation": "h", "y": -0.22},
    )
    # the right panel groups rather than stacks: give each bar its own offset group
    for t in fig.data[3:]:
        t.offsetgroup = t.name
    fig.update_xaxes(title_text="layer index", row=1, col=1)
    fig.update_yaxes(title_text="time (ms)", row=1, col=1)
    fig.update_yaxes(title_text="memory (MiB)", row=1, col=2)
    return fig


def sweep_figure(df: pd.DataFrame, x: str, cap_gib: float) -> go.Figure:
    """Throughput (tokens/GPU/s) and peak memory (GiB) against ``x`` per schedule."""
    xlabel = {"microbatches": "micro-batches", "devices": "devices"}.get(x, x)
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=["throughput (tokens/GPU/s)", "peak memory (GiB, max over devices)"],
        horizontal_spacing=0.08,
    )
    palette = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#B279A2", "#72B7B2", "#9D755D"]
    for i, (name, g) in enumerate(df.groupby("plan", sort=False)):
        color = palette[i % len(palette)]
        g = g.sort_values(x)
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
                    hovertemplate=f"{name}: %{{y:,.2f}} at {xlabel}=%{{x}}<extra></extra>",
                ),
                row=1,
                col=col,
            )
    fig.add_hline(
        y=cap_gib,
        line={"dash": "dash", "color": "#C00000"},
        annotation_text=f"cap {cap_gib:g} GiB",
        row=1,
        col=2,
    )
    fig.update_xaxes(title_text=xlabel, type="log", dtick=np.log10(2))
    fig.update_yaxes(title_text="tokens/GPU/s", row=1, col=1)
    fig.update_yaxes(title_text="memory (GiB)", row=1, col=2)
    fig.update_layout(template=TEMPLATE, height=360, margin={"l": 60, "r": 20, "t": 40, "b": 50})
    return fig
