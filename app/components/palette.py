"""Colours, labels and the light/dark look shared by every dashboard figure (no Streamlit).

F, B, W and BW keep one colour each on every chart; a stage that is a device's second (or
later) chunk, as in a V shape or an interleaved schedule, keeps its kind's colour and is
hatched (bars) or lighter (raster) so that a V's two legs read apart.

Figures are built light; :func:`themed` turns a copy dark when the app runs in dark mode.
The light template is plotly's default once this module is imported: a figure gets it when
it is made, already validated, where naming it in ``update_layout`` validates a copy of it
each time (28 ms a figure, measured; a page draws up to six).

>>> lighter("#000000", 0.5)
'#808080'
>>> len(set(device_colors(16)))
16
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from plotly.colors import sample_colorscale

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
CHUNK_PATTERN = "/"  # hatch of a stage that is its device's second (or later) chunk
CHUNK_LABEL = "hatched / lighter: the device's 2nd chunk (V, interleaved)"
CAP_COLOR = "#C00000"
TEMPLATE = "plotly_white"
pio.templates.default = TEMPLATE  # every app figure starts light (module docstring)
LIGHT_BG = "#FFFFFF"
DARK_BG = "#171614"  # Streamlit's dark background
DARK_FG = "#FAFAFA"
# ``meta`` of traces drawn in the background colour (the raster's lane separators) and of
# highlights drawn in the foreground colour (the critical path): ``themed`` recolours both
MASK = "mask"
OUTLINE = "outline"
OUTLINE_LIGHT = "#111111"


def lighter(color: str, amount: float = 0.45) -> str:
    """``color`` (``#RRGGBB``) blended towards white by ``amount`` (0..1)."""
    rgb = [int(color[i : i + 2], 16) for i in (1, 3, 5)]
    mixed = [round(c + (255 - c) * amount) for c in rgb]
    return "#" + "".join(f"{c:02X}" for c in mixed)


def device_colors(n: int) -> list[str]:
    """``n`` distinct colours in device order, from a sequential scale (never repeating)."""
    if n <= 1:
        return sample_colorscale("Viridis", [0.0])
    return sample_colorscale("Viridis", [0.92 * i / (n - 1) for i in range(n)])


def plan_colors(n: int) -> list[str]:
    """Categorical colours for up to a few plans (those of the sweep and the memory bars)."""
    base = ["#4C78A8", "#F58518", "#54A24B", "#B279A2", "#72B7B2", "#9D755D", "#E45756"]
    return [base[i % len(base)] for i in range(n)]


def themed(fig: go.Figure, dark: bool) -> go.Figure:
    """``fig`` as drawn in the app's theme: a dark copy in dark mode, ``fig`` itself in light.

    Traces whose ``meta`` is :data:`MASK` paint the background colour; they follow it.
    """
    if not dark:
        return fig
    out = go.Figure(fig)
    out.update_layout(
        template="plotly_dark",
        paper_bgcolor=DARK_BG,
        plot_bgcolor=DARK_BG,
        font={"color": DARK_FG},
    )
    for t in out.data:
        meta = getattr(t, "meta", None)
        if meta == MASK and getattr(t, "colorscale", None):
            t.colorscale = [[v, DARK_BG if c.upper() == LIGHT_BG else c] for v, c in t.colorscale]
        elif meta == OUTLINE:
            if t.type == "scatter":
                t.line.color = DARK_FG
            else:
                t.marker.line.color = DARK_FG
    return out


def legend_stub(name: str, color: str, legendgroup: str | None = None, **marker: Any) -> go.Bar:
    """An empty bar that only adds ``name`` to the legend (``marker`` adds to its marker)."""
    return go.Bar(
        x=[None],
        y=[None],
        name=name,
        legendgroup=legendgroup or name,
        showlegend=True,
        marker={"color": color, **marker},
    )
