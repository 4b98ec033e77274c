"""Streamlit building blocks shared by several pages (kept out of the page files)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from app.components import analysis, charts, display, exporting, state, where
from octopipe_core.profile import Profile


def delta_text(m: dict[str, Any], ref: dict[str, Any] | None, key: str, fmt: str) -> str | None:
    """``m[key] - ref[key]`` formatted, or None without a reference. A difference that
    rounds to zero is "±0" (Streamlit colours any other text as a change).

    >>> delta_text({"x": 1.04}, {"x": 1.0}, "x", "+.1f"), delta_text({"x": 2.0}, None, "x", "+.1f")
    ('±0', None)
    """
    if ref is None or key not in ref or ref[key] is None:
        return None
    text = format(m[key] - ref[key], fmt)
    return "±0" if float(text.replace(",", "")) == 0 else text


def _metric(col: Any, label: str, value: str, delta: str | None, inverse: bool, **kw: Any) -> None:
    if delta == "±0":
        col.metric(label, value, delta, delta_color="off", delta_arrow="off", **kw)
    else:
        col.metric(label, value, delta, delta_color="inverse" if inverse else "normal", **kw)


def metric_row(m: dict[str, Any], ref: dict[str, Any] | None = None) -> None:
    """Headline numbers of one plan, with deltas against ``ref`` when given; a plan over the
    memory cap gets a line under the numbers saying which devices (never a cut-off value)."""
    cols = st.columns(5)
    _metric(
        cols[0], "step time (ms)", f"{m['step_time_ms']:,.1f}",
        delta_text(m, ref, "step_time_ms", "+,.1f"), True,
    )  # fmt: skip
    _metric(
        cols[1], "tokens/GPU/s", f"{m['tokens_per_gpu_per_s']:,.0f}",
        delta_text(m, ref, "tokens_per_gpu_per_s", "+,.0f"), False,
    )  # fmt: skip
    _metric(
        cols[2], "bubble ratio", f"{m['bubble_ratio']:.3f}",
        delta_text(m, ref, "bubble_ratio", "+.3f"), True, help=analysis.BUBBLE_DEFINITION,
    )  # fmt: skip
    _metric(
        cols[3], "comm overlap", f"{m['comm_overlap_ratio']:.2f}",
        delta_text(m, ref, "comm_overlap_ratio", "+.2f"), False,
        help=analysis.COMM_OVERLAP_DEFINITION,
    )  # fmt: skip
    _metric(
        cols[4], "peak memory (GiB)", f"{m['max_peak_memory_gib']:.1f}",
        delta_text(m, ref, "max_peak_memory_gib", "+.1f"), True,
        help=f"highest device peak; cap {m['memory_cap_gib']:g} GiB",
    )  # fmt: skip
    if not m["fits_memory"]:
        st.markdown(over_cap_line(m))
    cluster_metric_row(m, ref)


def over_cap_line(m: dict[str, Any]) -> str:
    """Which devices a plan's peak memory puts over the cap (a Markdown line).

    >>> over_cap_line({"max_peak_memory_gib": 92.44, "memory_cap_gib": 80.0,
    ...     "peak_memory_gib": [92.44, 70.0, 81.0]})
    ':red[**Over the memory cap:** peak 92.4 GiB against 80 GiB (d0, d2 over).]'
    """
    cap = m["memory_cap_gib"]
    over = [f"d{d}" for d, p in enumerate(m["peak_memory_gib"]) if p > cap + 1e-9]
    shown = ", ".join(over[:8]) + (f" and {len(over) - 8} more" if len(over) > 8 else "")
    return (
        f":red[**Over the memory cap:** peak {m['max_peak_memory_gib']:.1f} GiB against "
        f"{cap:g} GiB ({shown} over).]"
    )


def cluster_metric_row(m: dict[str, Any], ref: dict[str, Any] | None = None) -> None:
    """GPUs, exposed tail, gradient sync and inter-node boundaries of a plan on a cluster
    (nothing on the flat network)."""
    if "gpus" not in m:
        return
    ref = ref if ref is not None and "gpus" in ref else None
    lay = m["layout"]
    zero = " ZeRO-1" if lay["zero1"] else ""
    cols = st.columns(5)

    def delta(key: str, fmt: str) -> str | None:
        return delta_text(m, ref, key, fmt)

    cols[0].metric(
        "GPUs", f"{m['gpus']:,}",
        help=f"TP{lay['tp']} × PP{lay['pp']} × DP{lay['dp']}{zero} on {m['cluster']}, rank "
        f"order {lay['order']}",
    )  # fmt: skip
    cols[1].metric(
        "exposed tail (ms)", f"{m['exposed_tail_ms']:,.1f}", delta("exposed_tail_ms", "+,.1f"),
        delta_color="inverse",
        help="time the step runs after its last compute op: gradient reductions, optimizer "
        "step and ZeRO-1 all-gathers not hidden under compute",
    )  # fmt: skip
    cols[2].metric(
        "grad sync (ms, all devices)", f"{m['grad_sync_ms']:,.1f}",
        delta("grad_sync_ms", "+,.1f"), delta_color="inverse",
        help="data-parallel gradient reduction time, summed over the devices' DP streams",
    )  # fmt: skip
    cols[3].metric(
        "inter-node boundaries", f"{m['inter_node_boundaries']}",
        delta("inter_node_boundaries", "+d"), delta_color="inverse",
        help="stage boundaries whose transfer crosses nodes in some replica",
    )  # fmt: skip
    cols[4].metric(
        "compute end (ms)", f"{m['compute_end_ms']:,.1f}", delta("compute_end_ms", "+,.1f"),
        delta_color="inverse", help="end of the last compute op (the step without its tail)",
    )  # fmt: skip


def cluster_note(prof: Profile) -> str:
    """What a deployed profile simulates, and how its timeline reads."""
    dep = prof.deployment
    return (
        f"On {dep.cluster.name}: {dep.layout.label()}, rank order {dep.layout.order} (change it "
        "in the sidebar, see it on the Cluster page). Transfers cost by their link class; on "
        "the timeline dark transfers cross nodes and each device's third strip is its "
        "data-parallel stream (gradient reductions, ZeRO-1 all-gathers)."
    )


def comparison(plans: dict[str, str], *, key: str = "every_block") -> None:
    """Metrics table, Gantt timelines on a shared time axis, where the time goes, peak memory
    per device against the cap, and memory curves."""
    prof = state.profile()
    cap = float(st.session_state["memory_gib"])
    items = tuple(plans.items())
    sims = {n: state.cached_sim(prof, js, cap) for n, js in items}
    metrics = {n: s["metrics"] for n, s in sims.items()}
    metrics_table(metrics)
    st.caption(
        f"Deltas are against the first plan. {analysis.BUBBLE_DEFINITION} (the zero-bubble "
        f"paper's convention); {analysis.COMM_OVERLAP_DEFINITION} on the receiving device; "
        "peak memory is the highest device's, weights and optimizer state included."
    )
    max_bars = charts.DEFAULT_MAX_BARS
    if max(len(s["timeline"]) for s in sims.values()) > max_bars:
        max_bars = every_block_toggle(key)
    gantt(items, max_bars, key="gantt")
    where_time(items, key=f"{key}_where")
    display.chart(state.cached_memory(prof, items, cap), key="memory", name="memory")


def metrics_table(metrics: dict[str, dict[str, Any]]) -> None:
    """The metrics of several plans as a static table (full plan names and headers, never
    cut off), deltas against the first."""
    table = analysis.metrics_table(metrics)
    st.table(analysis.format_metrics_table(table))


def gantt(items: tuple[tuple[str, str], ...], max_bars: int, key: str) -> None:
    """The timelines of ``items`` (name, plan JSON), with the sidebar's critical-path toggle."""
    prof = state.profile()
    cap = float(st.session_state["memory_gib"])
    critical = bool(st.session_state.get("critical"))
    fig = state.cached_gantt(prof, items, cap, max_bars, critical)
    notes = []
    if fig.layout.meta and fig.layout.meta.get("raster"):
        notes.append(raster_note(max_bars))
    if critical:
        paths = [where.path_summary(state.cached_where(prof, js, cap)["path"]) for _, js in items]
        notes.append(
            "Outlined and joined by a line: the critical path, the chain of ops and transfers "
            "that sets the step time (lengthen any of them and the step grows); other ops "
            "dimmed. " + "; ".join(f"{n}: {p}" for (n, _), p in zip(items, paths, strict=True))
        )
    else:
        notes.append(
            "Hatched (or lighter): a stage that is its device's second chunk. Turn on "
            "'highlight the critical path' in the sidebar to see what sets the step time."
        )
    for n in notes:
        st.caption(n)
    display.chart(fig, key=key, name="timeline")


def where_time(items: tuple[tuple[str, str], ...], key: str) -> None:
    """Where the time goes (per device: busy, fill, transfer waits, other idle, drain) and
    peak memory per device against the cap, side by side."""
    prof = state.profile()
    cap = float(st.session_state["memory_gib"])
    time_fig, peak_fig = state.cached_where_figures(prof, items, cap)
    left, right = st.columns([3, 2])
    with left:
        st.markdown("**Where the time goes** (per device, ms)")
        display.chart(time_fig, key=f"{key}_time", name="where-the-time-goes")
    with right:
        st.markdown(f"**Peak memory per device** against the {cap:g} GiB cap")
        display.chart(peak_fig, key=f"{key}_peak", name="peak-memory")
    lines = [where.layout_line(n, state.cached_where(prof, js, cap)) for n, js in items]
    st.caption(
        "**Layout bound** (the least step any schedule of a plan's partition and placement "
        "reaches; the step above it is the schedule's share of the gap): " + "; ".join(lines)
    )
    st.caption(where.TIME_DEFINITIONS)


def raster_note(max_bars: int) -> str:
    return (
        f"Panels with more than {max_bars:,} blocks are drawn at screen resolution "
        f"({charts.DEFAULT_BINS:,} time columns per lane, each showing the op that ends there); "
        "hover still names stage, micro-batch and layers. Tick 'draw every block' for vector "
        "bars that stay sharp when zoomed (slower to draw)."
    )


def every_block_toggle(key: str) -> int:
    """The 'draw every block' checkbox; returns the ``max_bars`` to draw with."""
    every = st.checkbox(
        "draw every block",
        key=key,
        help="Vector bars instead of the screen-resolution raster: sharp when zoomed, "
        "but slow to draw beyond a few thousand blocks.",
    )
    return 10**9 if every else charts.DEFAULT_MAX_BARS


def plan_download(plan_js: str, label: str = "Download plan (JSON)", key: str = "dl") -> None:
    """The plan with its profile embedded (what ``octopipe simulate --plan`` reads)."""
    plan = state.cached_plan(plan_js)
    prof = state.profile()
    st.download_button(
        label,
        exporting.plan_file_json(plan, prof),
        file_name=exporting.safe_name(f"{prof.name}-{plan.name or 'plan'}") + ".json",
        mime="application/json",
        key=key,
        on_click="ignore",
    )


def frame(df: pd.DataFrame, **kw: Any) -> None:
    st.dataframe(df, width="stretch", hide_index=True, **kw)


def share_caption(page: str, query: str) -> None:
    """How to share this view: the URL (with the plan when it is a hand-edited or tuned one),
    or, for a plan too large for a link, the file to download and open."""
    how = state.plan_shared_by_link()
    if how is None:
        st.caption(f"Share this view: `/{page}?{query}`")
    elif how:
        st.caption(
            "Share this view: copy the address bar; besides the settings it carries your plan "
            f"(`plan=`, {len(query):,} characters of query in all)."
        )
    else:
        st.caption(
            "Your plan is too large for a link: download it (below) and open it with 'Open a "
            "plan file' on the Plan page; the address bar carries the other settings."
        )
