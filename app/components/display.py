"""How charts are shown: the app's light or dark theme, and the download format.

Every chart goes through :func:`chart`: it is drawn in the app's theme (Streamlit follows the
system's light or dark setting; the ⋮ menu's Settings switches it), and its toolbar's camera
button downloads it as PNG or SVG (the sidebar's "chart downloads" setting; plotly.js writes
both in the browser, no server-side renderer is needed).

Streamlit learns the theme only with the next rerun, and picking another theme in the menu
starts none (Streamlit issues 15287, 11920): charts drawn dark on a dark system stayed dark on
a page switched to Light. :func:`follow_theme` mounts a few lines of the app's own script
that watch the page's painted background and ask for one rerun when it no longer matches the
theme the charts were drawn in.
"""

from __future__ import annotations

import functools
from typing import Any

import plotly.graph_objects as go
import streamlit as st

from app.components.palette import themed

IMAGE_FORMATS = ("svg", "png")

# Polls the painted background (the menu switch repaints it without a rerun) and triggers one
# rerun per change away from the theme the server drew with; once per painted theme, so a
# theme Streamlit cannot report (None on a first run) never loops.
_THEME_JS = """
export default function (component) {
  const { data, setTriggerValue } = component;
  const drawn = data && data.theme;
  const painted = () => {
    const app = document.querySelector("[data-testid='stApp']");
    const m = app && getComputedStyle(app).backgroundColor.match(/[0-9.]+/g);
    if (!m) return null;
    const [r, g, b] = m.map(Number);
    return 0.2126 * r + 0.7152 * g + 0.0722 * b < 128 ? "dark" : "light";
  };
  const w = window;
  if (w.__octopipeThemeTimer) clearInterval(w.__octopipeThemeTimer);
  w.__octopipeThemeTimer = setInterval(() => {
    const now = painted();
    if (!drawn || !now || now === drawn || now === w.__octopipeThemeAsked) return;
    w.__octopipeThemeAsked = now;
    setTriggerValue("changed", now);
  }, 400);
  return () => clearInterval(w.__octopipeThemeTimer);
}
"""


@functools.cache
def _theme_watcher() -> Any:
    """The watcher's mount command, registered once per process."""
    return st.components.v2.component("octopipe_theme_watcher", js=_THEME_JS)


def follow_theme() -> None:
    """Rerun once when the page's theme changes under charts drawn for the other one
    (module docstring); call once per run."""
    data = {"theme": getattr(st.context.theme, "type", None)}
    _theme_watcher()(key="_theme_watcher", data=data, on_changed_change=lambda: None)


def is_dark() -> bool:
    """Whether the app is drawn in a dark theme (as the browser last reported it)."""
    try:
        return getattr(st.context.theme, "type", None) == "dark"
    except Exception:  # no browser context (bare script runs)
        return False


def chart_config(name: str, fmt: str | None = None) -> dict[str, Any]:
    """Plotly config of a chart: no logo, and the camera button saving ``name``.svg/png.

    >>> chart_config("gantt", "svg")["toImageButtonOptions"]
    {'format': 'svg', 'filename': 'octopipe-gantt', 'scale': 1}
    """
    fmt = fmt or st.session_state.get("img_format", "svg")
    return {
        "displaylogo": False,
        "toImageButtonOptions": {
            "format": fmt,
            "filename": f"octopipe-{name}",
            "scale": 2 if fmt == "png" else 1,
        },
    }


def chart(fig: go.Figure, key: str, name: str | None = None) -> None:
    """Show ``fig`` in the app's theme, full width, downloadable as the sidebar's format."""
    st.plotly_chart(
        themed(fig, is_dark()), width="stretch", key=key, config=chart_config(name or key)
    )


def sidebar_controls() -> None:
    """The view settings of every page (call inside ``with st.sidebar``); the URL carries
    them as ``critical=1`` and ``img=png``."""
    ss = st.session_state
    for name in ("critical", "img_format"):
        ss.setdefault(f"_w_{name}", ss[name])
    st.toggle(
        "highlight the critical path",
        key="_w_critical",
        help="Outline the chain of ops and transfers that sets the step time on every "
        "timeline (the other ops are dimmed).",
    )
    ss["critical"] = bool(ss["_w_critical"])
    st.segmented_control(
        "chart downloads",
        IMAGE_FORMATS,
        format_func=str.upper,
        key="_w_img_format",
        help="What the camera button in a chart's toolbar saves: SVG (vector) or PNG.",
    )
    ss["img_format"] = ss["_w_img_format"] or "svg"
    st.caption(
        "Light or dark follows your system; switch it in the ⋮ menu → Settings. Charts follow."
    )
