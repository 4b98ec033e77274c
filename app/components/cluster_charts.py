"""Plotly figures of the cluster pages, as pure functions of plain rows (tests assert on them)."""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go

from app.components.cluster_data import bar_labels
from app.components.palette import plan_colors

ONE_F_ONE_B_COLOR, PEER_COLOR, TUNED_COLOR = plan_colors(3)
FITS_COLOR = TUNED_COLOR
OVER_COLOR = "#BAB0AC"
MAX_BARS = 24


def rank_figure(rows: list[dict[str, Any]], max_bars: int = MAX_BARS) -> go.Figure:
    """Tokens/GPU/s of each ranked layout (``LayoutRow.to_dict`` rows, best first), green when
    it fits the memory cap, grey when not; the first ``max_bars`` layouts.

    >>> fig = rank_figure([{"layout": "TP1 x PP2 x DP4", "order": "tp-dp-pp", "microbatches": 8,
    ...     "schedule": "1f1b/uniform", "tokens_per_gpu_per_s": 9000.0, "fits_memory": True,
    ...     "step_time_ms": 10.0, "peak_memory_gib": 50.0, "why": ""}])
    >>> list(fig.data[0].y), fig.layout.yaxis.title.text
    ([9000.0], 'tokens/GPU/s')
    """
    shown = [r for r in rows if r.get("step_time_ms") is not None][:max_bars]
    labels = bar_labels(shown)
    tok = [float(r["tokens_per_gpu_per_s"]) for r in shown]
    fits = [bool(r["fits_memory"]) for r in shown]
    extra = np.empty((len(shown), 4), dtype=object)
    for i, r in enumerate(shown):
        why = r["why"] or "fits the cap"
        extra[i] = [r["schedule"], f"{r['step_time_ms']:,.1f}", f"{r['peak_memory_gib']:.1f}", why]
    fig = go.Figure()
    for ok, name, color in ((True, "fits memory", FITS_COLOR), (False, "over the cap", OVER_COLOR)):
        idx = [i for i, f in enumerate(fits) if f == ok]
        if not idx:
            continue
        fig.add_trace(
            go.Bar(
                x=[labels[i] for i in idx],
                y=[tok[i] for i in idx],
                name=name,
                marker={"color": color},
                customdata=extra[idx],
                hovertemplate="%{x}<br>%{y:,.0f} tokens/GPU/s · %{customdata[0]}<br>step "
                "%{customdata[1]} ms · peak %{customdata[2]} GiB<br>%{customdata[3]}"
                "<extra></extra>",
            )
        )
    fig.update_xaxes(categoryorder="array", categoryarray=labels, tickangle=-30)
    fig.update_layout(
        height=420,
        margin={"l": 60, "r": 20, "t": 40, "b": 140},
        yaxis_title="tokens/GPU/s",
        title={"text": "throughput per layout (its best plan; tokens/GPU/s)", "font_size": 14},
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 1, "xanchor": "right"},
    )
    return fig


SERIES = (
    ("one_f_one_b_tokens_per_gpu_per_s", "1F1B (uniform)", ONE_F_ONE_B_COLOR, "dot"),
    ("best_peer_tokens_per_gpu_per_s", "best peer", PEER_COLOR, "dash"),
    ("tuned_tokens_per_gpu_per_s", "OctoPipe tuned", TUNED_COLOR, "solid"),
)


def scaling_figure(points: list[dict[str, Any]], kind: str) -> go.Figure:
    """Tokens/GPU/s against GPUs (log2 axis) for 1F1B, the best peer and the tuned plan, each
    at the layout the study picked for that GPU count (``ScalingPoint.to_dict`` rows).

    >>> fig = scaling_figure([{"gpus": 8, "layout": "TP1 x PP8 x DP1", "global_batch": 64,
    ...     "one_f_one_b_tokens_per_gpu_per_s": 1.0, "best_peer": "zbv/balanced",
    ...     "best_peer_tokens_per_gpu_per_s": 2.0, "tuned_tokens_per_gpu_per_s": 3.0}], "strong")
    >>> [t.name for t in fig.data]
    ['1F1B (uniform)', 'best peer', 'OctoPipe tuned']
    """
    pts = sorted(points, key=lambda p: p["gpus"])
    x = [p["gpus"] for p in pts]
    info = [[p["layout"], p["global_batch"], p.get("best_peer", "")] for p in pts]
    fig = go.Figure()
    for key, name, color, dash in SERIES:
        y = [p[key] if p[key] is not None else None for p in pts]
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                mode="lines+markers",
                name=name,
                line={"color": color, "dash": dash},
                customdata=info,
                hovertemplate=f"{name}: %{{y:,.0f}} tokens/GPU/s at %{{x}} GPUs<br>"
                "%{customdata[0]} · global batch %{customdata[1]}<br>best peer: "
                "%{customdata[2]}<extra></extra>",
            )
        )
    batch = "fixed global batch" if kind == "strong" else "global batch grows with the GPUs"
    fig.update_xaxes(title_text="GPUs", type="log", tickvals=x, ticktext=[f"{g:,}" for g in x])
    fig.update_layout(
        height=400,
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
        yaxis_title="tokens/GPU/s",
        yaxis_rangemode="tozero",
        title={"text": f"{kind} scaling ({batch}): tokens/GPU/s", "font_size": 14},
        legend={"orientation": "h", "y": -0.25},
    )
    return fig
