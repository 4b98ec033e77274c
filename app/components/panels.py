"""Streamlit building blocks shared by several pages (kept out of the page files)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from app.components import analysis, charts, exporting, state
from octopipe_core.profile import Profile


def metric_row(m: dict[str, Any], ref: dict[str, Any] | None = None) -> None:
    """Headline numbers of one plan, with deltas against ``ref`` when given."""
    cols = st.columns(5)

    def delta(key: str, fmt: str) -> str | None:
        if ref is None or not ref.get(key):
            return None
        d = m[key] - ref[key]
        return format(d, fmt)

    cols[0].metric(
        "step time (ms)", f"{m['step_time_ms']:,.1f}", delta("step_time_ms", "+,.1f"),
        delta_color="inverse",
    )  # fmt: skip
    cols[1].metric(
        "tokens/GPU/s", f"{m['tokens_per_gpu_per_s']:,.0f}", delta("tokens_per_gpu_per_s", "+,.0f")
    )
    cols[2].metric(
        "bubble ratio", f"{m['bubble_ratio']:.3f}", delta("bubble_ratio", "+.3f"),
        delta_color="inverse", help=analysis.BUBBLE_DEFINITION,
    )  # fmt: skip
    cols[3].metric(
        "comm overlap", f"{m['comm_overlap_ratio']:.2f}", delta("comm_overlap_ratio", "+.2f"),
        help=analysis.COMM_OVERLAP_DEFINITION,
    )  # fmt: skip
    fits = "" if m["fits_memory"] else " (over cap!)"
    cols[4].metric(
        "peak memory (GiB)", f"{m['max_peak_memory_gib']:.1f}{fits}",
        delta("max_peak_memory_gib", "+.1f"), delta_color="inverse",
        help=f"highest device peak; cap {m['memory_cap_gib']:g} GiB",
    )  # fmt: skip
    cluster_metric_row(m, ref)


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
        return None if ref is None else format(m[key] - ref[key], fmt)

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
    """Gantt timelines on a shared time axis, memory curves and the metrics table."""
    prof = state.profile()
    cap = float(st.session_state["memory_gib"])
    items = tuple(plans.items())
    sims = {n: state.cached_sim(prof, js, cap) for n, js in items}
    metrics = {n: s["metrics"] for n, s in sims.items()}
    table = analysis.metrics_table(metrics)
    st.dataframe(
        table.style.format(
            {
                "step time (ms)": "{:,.1f}",
                "tokens/GPU/s": "{:,.0f}",
                "bubble ratio": "{:.3f}",
                "comm overlap": "{:.2f}",
                "peak memory (GiB)": "{:.1f}",
                "Δ step time (%)": "{:+.1f}",
                "speedup (×)": "{:.3f}",
                "Δ tokens/GPU/s (%)": "{:+.1f}",
                "Δ peak memory (GiB)": "{:+.1f}",
            }
        ),
        width="stretch",
    )
    st.caption(
        f"Deltas are against the first plan. {analysis.BUBBLE_DEFINITION} (the zero-bubble "
        f"paper's convention); {analysis.COMM_OVERLAP_DEFINITION} on the receiving device; "
        "peak memory is the highest device's, weights and optimizer state included."
    )
    max_bars = charts.DEFAULT_MAX_BARS
    if max(len(s["timeline"]) for s in sims.values()) > max_bars:
        max_bars = every_block_toggle(key)
    fig = state.cached_gantt(prof, items, cap, max_bars)
    if fig.layout.meta and fig.layout.meta.get("raster"):
        st.caption(raster_note(max_bars))
    st.plotly_chart(fig, width="stretch", key="gantt", config={"displaylogo": False})
    st.plotly_chart(
        state.cached_memory(prof, items, cap),
        width="stretch",
        key="memory",
        config={"displaylogo": False},
    )


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
