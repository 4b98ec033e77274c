"""Plan diff by layers for the Compare page (no Streamlit here): which layer ranges moved to
which device, and how each device's load and peak memory changed, from
``octopipe_core.plan_diff``. Plans with different stage, chunk or device counts diff
meaningfully because both are mapped to layers first.

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> from octopipe_core.schedules import build_plan
>>> from octopipe_core.simulator import simulate
>>> prof = Profile.from_dict(example_profile_dict())
>>> a, b = (simulate(prof, build_plan(prof, s, 2, 4)) for s in ("1f1b", "zbv"))
>>> d = layer_diff(prof, a, b)
>>> d["summary"][0]
'2 layer ranges (2 of 4 layers) run on another device: layer 1: d0 -> d1; layer 3: d1 -> d0'
>>> list(d["devices"].columns)[:3]
['device', 'layers A', 'layers B']
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.components.palette import plan_colors
from octopipe_core.plan_diff import device_changes, layer_moves, moves_table
from octopipe_core.profile import Profile
from octopipe_core.simulator import SimResult

DEVICE_COLUMNS = {
    "device": "device",
    "layers_a": "layers A",
    "layers_b": "layers B",
    "load_a_ms": "load A (ms/micro-batch)",
    "load_b_ms": "load B (ms/micro-batch)",
    "load_delta_ms": "Δ load (ms)",
    "peak_a_gib": "peak A (GiB)",
    "peak_b_gib": "peak B (GiB)",
    "peak_delta_gib": "Δ peak (GiB)",
}
MOVE_COLUMNS = {
    "first_layer": "first layer",
    "last_layer": "last layer",
    "layers": "layers",
    "device_a": "device in A",
    "device_b": "device in B",
}
MAX_LISTED = 6  # moves named in the summary line


def layer_diff(profile: Profile, a: SimResult, b: SimResult) -> dict[str, Any]:
    """``{"summary": [str], "moves": DataFrame, "devices": DataFrame}`` of plans A and B."""
    n = profile.num_layers
    moves = layer_moves(a.plan, b.plan, n)
    moved = sum(m.last_layer - m.first_layer + 1 for m in moves)
    summary = []
    if moves:
        named = "; ".join(m.label() for m in moves[:MAX_LISTED])
        more = f"; and {len(moves) - MAX_LISTED} more" if len(moves) > MAX_LISTED else ""
        s = "" if len(moves) == 1 else "s"
        summary.append(
            f"{len(moves)} layer range{s} ({moved} of {n} layers) run on another device: "
            f"{named}{more}"
        )
    else:
        summary.append(f"every one of the {n} layers runs on the same device in A and B")
    if a.plan.num_stages != b.plan.num_stages:
        summary.append(
            f"stages: {a.plan.num_stages} in A, {b.plan.num_stages} in B (compared by layer, "
            "so different stage structures diff meaningfully)"
        )
    rows = device_changes(profile, a, b)
    devices = pd.DataFrame(rows).rename(columns=DEVICE_COLUMNS)
    worst_a = max((r["load_a_ms"] for r in rows), default=0.0)
    worst_b = max((r["load_b_ms"] for r in rows), default=0.0)
    summary.append(
        f"busiest device per micro-batch: {worst_a:,.2f} ms in A, {worst_b:,.2f} ms in B "
        f"({worst_b - worst_a:+,.2f} ms); highest peak memory {max(a.peak_memory_gib):.1f} "
        f"→ {max(b.peak_memory_gib):.1f} GiB"
    )
    table = moves_table(moves)
    mv = pd.DataFrame(table, columns=list(MOVE_COLUMNS)).rename(columns=MOVE_COLUMNS)
    for col in ("device in A", "device in B"):
        mv[col] = ["-" if pd.isna(d) else f"d{int(d)}" for d in mv[col]]
    return {"summary": summary, "moves": mv, "devices": devices}


def device_change_figure(devices: pd.DataFrame, names: tuple[str, str]) -> go.Figure:
    """Per device: compute load per micro-batch (ms) and peak memory (GiB), A beside B."""
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=["load per micro-batch (ms, F+B+W)", "peak memory (GiB)"],
        horizontal_spacing=0.08,
    )
    colors = plan_colors(2)
    for i, (side, name) in enumerate(zip(("A", "B"), names, strict=True)):
        for col, ycol in ((1, f"load {side} (ms/micro-batch)"), (2, f"peak {side} (GiB)")):
            fig.add_trace(
                go.Bar(
                    x=devices["device"],
                    y=devices[ycol],
                    name=f"{side}: {name}",
                    legendgroup=side,
                    showlegend=col == 1,
                    marker={"color": colors[i]},
                    hovertemplate=f"{side} %{{x}}: %{{y:,.2f}}<extra></extra>",
                ),
                row=1,
                col=col,
            )
    fig.update_yaxes(title_text="ms", row=1, col=1)
    fig.update_yaxes(title_text="GiB", row=1, col=2)
    fig.update_layout(
        barmode="group",
        height=320,
        margin={"l": 60, "r": 20, "t": 40, "b": 50},
        legend={"orientation": "h", "y": -0.25},
    )
    return fig
