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

A stage that is its device's second chunk (a V shape, an interleaved schedule) is hatched
(bars) or lighter (raster) in its kind's colour; the critical path (``critical``) is outlined
and joined by a line, the other ops dimmed. Other figures (memory, sweeps, where the time
goes) are in ``plots``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.components.palette import (
    CHUNK_LABEL,
    CHUNK_PATTERN,
    KIND_COLORS,
    KIND_LABELS,
    MASK,
    OUTLINE,
    OUTLINE_LIGHT,
    legend_stub,
    lighter,
)

COMPUTE_KINDS = ("F", "B", "W", "BW", "optimizer")
COMM_KINDS = ("send_F", "send_B", "send_F_x", "send_B_x")
DP_KINDS = ("grad_sync", "param_gather")
KINDS = (*COMPUTE_KINDS, *COMM_KINDS, *DP_KINDS)
INTER_NODE = " (inter-node)"  # suffix of the timeline's "layers" on a transfer across nodes
DEFAULT_MAX_BARS = 3000
DEFAULT_BINS = 1000
COMPUTE_WIDTH = 0.62
COMPUTE_SHIFT = 0.08  # compute lane centre above the device tick (y grows downwards)
COMM_WIDTH = 0.18
COMM_OFFSET = 0.36  # comm strip centre below the device tick


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
    """One ``go.Bar`` trace per op kind. Optional columns of ``df``: ``chunk`` (0-based index
    of the stage among its device's stages: later chunks are hatched) and ``critical`` (bool:
    the other ops are dimmed)."""
    traces = []
    chunked = "chunk" in df.columns and bool((df["chunk"] > 0).any())
    for kind in KINDS:
        g = df[df["kind"] == kind]
        if g.empty:
            continue
        start = g["start_ms"].to_numpy(np.float64)
        end = g["end_ms"].to_numpy(np.float64)
        dur = end - start
        dev = g["device"].to_numpy(np.int32)
        chunk = g["chunk"].to_numpy(np.int32) + 1 if "chunk" in g.columns else np.ones_like(dev)
        when = "%{customdata[5]:.2f}–%{customdata[6]:.2f} ms (%{customdata[7]:.3f} ms)"
        when += "<extra></extra>"
        marker: dict[str, Any] = {"color": KIND_COLORS[kind], "line": {"width": 0}}
        if kind in COMM_KINDS:
            dst = g["layers"].str.extract(r"^to d(\d+)", expand=False)
            dst_i = pd.to_numeric(dst, errors="coerce").fillna(-1).to_numpy(np.int32)
            cols = [g["stage"], g["mb"], dst_i, dst_i]
            hover = (
                f"<b>{KIND_LABELS[kind]}</b> d%{{customdata[4]}} → d%{{customdata[2]}}<br>"
                f"from stage %{{customdata[0]}} · micro-batch %{{customdata[1]}}<br>{when}"
            )
            y, width = dev + lanes.comm_offset, lanes.comm_width
        elif kind in DP_KINDS:
            cols = [g["stage"], g["mb"], dev, dev]
            hover = (
                f"<b>{KIND_LABELS[kind]}</b> on d%{{customdata[4]}}<br>"
                f"gradients of stage %{{customdata[0]}} over the DP group<br>{when}"
            )
            y, width = dev + lanes.dp_offset, lanes.dp_width
        elif kind == "optimizer":
            cols = [g["stage"], g["mb"], dev, dev]
            hover = f"<b>{KIND_LABELS[kind]}</b> on d%{{customdata[4]}}<br>{when}"
            y, width = dev - lanes.compute_shift, lanes.compute_width
        else:
            lo, hi = _split_layers(g["layers"])
            cols = [g["stage"], g["mb"], lo, hi]
            of = " (chunk %{customdata[8]} of its device)" if chunked else ""
            hover = (
                f"<b>{KIND_LABELS[kind]}</b> on d%{{customdata[4]}}<br>"
                f"stage %{{customdata[0]}}{of} · micro-batch %{{customdata[1]}}<br>"
                f"layers %{{customdata[2]}}–%{{customdata[3]}}<br>{when}"
            )
            y, width = dev - lanes.compute_shift, lanes.compute_width
            if chunked:
                marker["pattern"] = {
                    "shape": np.where(chunk > 1, CHUNK_PATTERN, "").tolist(),
                    "fgcolor": "rgba(255,255,255,0.75)",
                    "size": 6,
                    "solidity": 0.35,
                }
        if "critical" in g.columns and bool(df["critical"].any()):
            marker["opacity"] = np.where(g["critical"].to_numpy(bool), 1.0, 0.3)
        cd = np.column_stack([*cols, dev, start, end, dur, chunk])
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
                marker=marker,
                customdata=cd.astype(np.float32),
                hovertemplate=hover,
            )
        )
    return traces


RASTER_KINDS = ("F", "B", "W", "BW", *COMM_KINDS)  # the rest (few per device) stay bars
CHUNK_KINDS = ("F", "B", "W", "BW")  # drawn lighter when the stage is a later chunk


def _raster_codes() -> tuple[dict[str, int], list[str], list[str]]:
    """Cell codes (2.., 0 and 1 are transparent), their colours and their hover labels: one
    per raster kind, then a lighter one per compute kind for later chunks."""
    codes = {k: i + 2 for i, k in enumerate(RASTER_KINDS)}
    colors = [KIND_COLORS[k] for k in RASTER_KINDS]
    labels = ["", "", *RASTER_KINDS]  # short: one label per cell travels to the browser
    for k in CHUNK_KINDS:
        codes[f"{k}+"] = len(codes) + 2
        colors.append(lighter(KIND_COLORS[k]))
        labels.append(f"{k} (chunk 2)")
    return codes, colors, labels


def _raster_traces(
    df: pd.DataFrame, devices: int, x_max: float, bins: int, lanes: Lanes = FLAT_LANES
) -> list[go.Heatmap]:
    """Compute ops as a (devices x bins) heatmap; comm as a thin strip under each lane (and,
    with a DP strip, a blank band under it where the DP bars go)."""
    dt = x_max / bins if x_max > 0 else 1.0
    codes, colors, labels = _raster_codes()
    comp = df[(df["stream"] == "compute") & df["kind"].isin(RASTER_KINDS)]
    if "chunk" in comp.columns:
        later = comp["chunk"].to_numpy() > 0
        comp = comp.assign(kind=np.where(later, comp["kind"] + "+", comp["kind"]))
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
    n = len(colors) + 2  # codes 0, 1: transparent (0 marks an empty comm cell)
    scale: list[list[Any]] = [[0.0, "rgba(0,0,0,0)"], [2 / n, "rgba(0,0,0,0)"]]
    for i, color in enumerate(colors, start=2):
        scale += [[i / n, color], [(i + 1) / n, color]]
    common = {
        "x0": dt / 2,
        "dx": dt,
        "zmin": -0.5,
        "zmax": n - 0.5,
        "colorscale": scale,
        "showscale": False,
        "zsmooth": False,
    }
    # the op kind of every cell, for the hover (idle cells have none and show no hover)
    text = np.array(labels, dtype=object)[np.nan_to_num(z, nan=0).astype(np.int64)]
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
            text=text,
            hoverongaps=False,
            name="compute",
            hovertemplate=(
                "<b>%{text}</b> on d%{y:.0f} · %{x:.0f} ms<br>stage %{customdata[0]} · "
                "micro-batch %{customdata[1]}<br>layers %{customdata[2]}–%{customdata[3]}"
                "<extra></extra>"
            ),
            **common,
        ),
        go.Heatmap(
            z=zc,
            y=y_comm,
            name="comm",
            hoverinfo="skip",
            meta=MASK,
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
    return [legend_stub(KIND_LABELS[k], KIND_COLORS[k], legendgroup=k) for k in kinds]


def is_raster(timeline: pd.DataFrame, max_bars: int = DEFAULT_MAX_BARS) -> bool:
    return len(timeline) > max_bars


@dataclass(frozen=True)
class PathLink:
    """One link of a critical path to draw: an op (``kind="op"``, ``row`` its timeline row)
    or a transfer into the next op, on ``device`` (the receiver for a transfer)."""

    kind: str
    device: int
    label: str
    start_ms: float
    end_ms: float
    row: int


def _critical_traces(
    df: pd.DataFrame, path: Sequence[PathLink], lanes: Lanes, legend: bool
) -> list[go.Scatter | go.Bar]:
    """The critical path: its ops outlined, and a line through them and the transfers."""
    ops = [p for p in path if p.kind == "op"]
    if not ops:
        return []
    y_of = {p.row: int(df["device"].iat[p.row]) - lanes.compute_shift for p in ops}
    xs: list[float | None] = []
    ys: list[float | None] = []
    hover: list[str] = []
    for i, p in enumerate(path):
        if p.kind == "op":
            y = y_of[p.row]
            xs += [p.start_ms, p.end_ms]
            ys += [y, y]
            hover += [p.label, p.label]
        elif i + 1 < len(path):  # a transfer: from the producer's end to the consumer's start
            nxt = y_of.get(path[i + 1].row)
            if nxt is not None:
                xs += [p.end_ms]
                ys += [nxt]
                hover += [f"transfer {p.label}"]
    start = np.array([p.start_ms for p in ops])
    end = np.array([p.end_ms for p in ops])
    return [
        go.Bar(
            x=end - start,
            base=start,
            y=[y_of[p.row] for p in ops],
            width=lanes.compute_width,
            orientation="h",
            name="critical path",
            legendgroup="critical",
            showlegend=legend,
            meta=OUTLINE,
            marker={"color": "rgba(0,0,0,0)", "line": {"width": 2, "color": OUTLINE_LIGHT}},
            customdata=[p.label for p in ops],
            hovertemplate="<b>critical path</b> %{customdata}<extra></extra>",
        ),
        go.Scatter(
            x=xs,
            y=ys,
            mode="lines",
            name="critical path",
            legendgroup="critical",
            showlegend=False,
            meta=OUTLINE,
            line={"color": OUTLINE_LIGHT, "width": 1.5},
            text=hover,
            hoverinfo="skip",
        ),
    ]


def compare_gantt_figure(
    timelines: Mapping[str, pd.DataFrame],
    *,
    max_bars: int = DEFAULT_MAX_BARS,
    bins: int = DEFAULT_BINS,
    x_max_ms: float | None = None,
    devices: Mapping[str, int] | None = None,
    critical: Mapping[str, Sequence[PathLink]] | None = None,
) -> go.Figure:
    """Gantt panels, one per plan, on one shared time axis (ms); one lane per device.

    ``max_bars`` is per panel: a panel with more blocks is drawn as a raster of ``bins``
    time columns (see the module docstring). ``devices`` gives a panel's device count (a
    device without stages then shows as an idle lane); ``critical`` a panel's critical path
    (outlined, the other ops dimmed).
    """
    names = list(timelines)
    devs = [
        (devices or {}).get(n) or (int(df["device"].max()) + 1 if len(df) else 1)
        for n, df in timelines.items()
    ]
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
    for r, (name, raw) in enumerate(timelines.items(), start=1):
        df = with_link_kinds(raw)
        path = (critical or {}).get(name) or ()
        if path:
            df = df.assign(critical=False)
            df.iloc[[p.row for p in path if p.kind == "op"], df.columns.get_loc("critical")] = True
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
        if "chunk" in df.columns and (df["chunk"] > 0).any() and "chunk" not in seen:
            seen.add("chunk")
            stub = legend_stub(CHUNK_LABEL, "#999999", pattern={"shape": CHUNK_PATTERN})
            fig.add_trace(stub, row=r, col=1)
        for t in _critical_traces(df, path, lanes, legend="critical" not in seen):
            fig.add_trace(t, row=r, col=1)
        if path:
            seen.add("critical")
        d = devs[r - 1]
        busy = set(df.loc[df["stream"] == "compute", "device"].unique())
        for i in (i for i in range(d) if i not in busy):
            fig.add_annotation(
                x=0, y=i, text="idle: no stages on this device", showarrow=False,
                xanchor="left", font={"size": 11, "color": "#888888"}, row=r, col=1,
            )  # fmt: skip
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
    devices: int | None = None,
) -> go.Figure:
    """One plan's Gantt chart: a lane per device, compute above its comm strip, time in ms."""
    name = title or "timeline"
    return compare_gantt_figure(
        {name: timeline},
        max_bars=max_bars,
        bins=bins,
        x_max_ms=x_max_ms,
        devices={name: devices} if devices else None,
    )


def with_chunks(timeline: pd.DataFrame, placement: Sequence[int]) -> pd.DataFrame:
    """``timeline`` with a ``chunk`` column: each row's stage's index among the stages of its
    device (0 for every stage of a one-stage-per-device plan).

    >>> tl = pd.DataFrame({"device": [0, 1, 1, 0], "stage": [0, 1, 2, 3]})
    >>> with_chunks(tl, [0, 1, 1, 0])["chunk"].tolist()
    [0, 0, 1, 1]
    """
    rank = [0] * len(placement)
    count: dict[int, int] = {}
    for s, d in enumerate(placement):
        rank[s] = count.get(d, 0)
        count[d] = rank[s] + 1
    lut = np.array(rank, dtype=np.int32)
    stage = timeline["stage"].to_numpy(np.int64)
    ok = (stage >= 0) & (stage < len(lut))
    return timeline.assign(chunk=np.where(ok, lut[np.clip(stage, 0, len(lut) - 1)], 0))


# Figures of other kinds live in ``plots``; these names stay importable from here.
from app.components.plots import (  # noqa: E402
    layer_cost_figure,
    memory_figure,
    sweep_figure,
)

__all__ = [
    "KIND_COLORS",
    "KIND_LABELS",
    "compare_gantt_figure",
    "gantt_figure",
    "layer_cost_figure",
    "memory_figure",
    "sweep_figure",
    "with_chunks",
]
