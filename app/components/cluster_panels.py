"""Streamlit blocks of the Cluster page: upload, editor, where the layout puts each device, and
the current plan simulated on the cluster."""

from __future__ import annotations

import hashlib
import json

import streamlit as st

from app.components import analysis, charts, cluster_data, cluster_state, panels, state, uploads
from octopipe_core.cluster import Cluster, parse_cluster_bytes
from octopipe_core.errors import OctoPipeError

EDITOR_START = "16x8-h800-ib400"  # what the editor starts from when no cluster is picked


def upload() -> None:
    """Upload an ``octopipe.cluster/v1`` JSON; a bad file is reported in the page."""
    up = st.file_uploader(
        "upload a cluster (octopipe.cluster/v1 JSON)", type=["json"], key="cluster_upload"
    )
    if up is None:
        uploads.forget("cluster_upload")
        return
    c = uploads.parse_new(up, "cluster_upload", parse_cluster_bytes)
    if c is not None:
        cluster_state.set_custom(c)
        st.rerun()
    uploads.show_error("cluster_upload")


def editor(c: Cluster | None) -> None:
    """Nodes, GPUs per node, GPU memory and both links of ``c`` (or of a sample), applied as a
    custom cluster; bad values are reported in the page."""
    base = c if c is not None else cluster_state.cached_cluster_sample(EDITOR_START)
    ver = hashlib.sha1(cluster_data.cluster_key(base).encode()).hexdigest()[:8]
    values = cluster_data.cluster_fields(base)
    start = "" if c is not None else f" (starting from the {EDITOR_START} sample)"
    with st.form(f"cluster_editor_{ver}"):
        st.markdown(f"**Edit {base.name}{start}**")
        cols = st.columns(4)
        got: dict[str, float | int] = {}
        for i, (key, (label, integer)) in enumerate(cluster_data.FIELDS.items()):
            col = cols[i % 4]
            if integer:
                got[key] = col.number_input(label, 1, 1_000_000, int(values[key]), step=1,
                                            key=f"ce_{key}_{ver}")  # fmt: skip
            else:
                got[key] = col.number_input(label, 0.0, 1e6, float(values[key]),
                                            key=f"ce_{key}_{ver}")  # fmt: skip
        applied = st.form_submit_button("Apply as a custom cluster", key="ce_apply")
    if applied:
        try:
            new = cluster_data.edited_cluster(base, got)
        except OctoPipeError as e:
            st.error(str(e))
        else:
            cluster_state.set_custom(new)
            st.rerun()


def download(c: Cluster) -> None:
    st.download_button(
        "Download this cluster (JSON)",
        json.dumps(c.to_dict(), indent=1) + "\n",
        file_name=f"{c.name}.json",
        mime="application/json",
        on_click="ignore",
        key="cluster_dl",
    )


def layout_view() -> None:
    """The Plan page's plan on the cluster: metrics (against the same plan on the flat
    network), where each device runs, and the timeline with its comm and DP lanes."""
    prof = state.profile()
    cap = float(st.session_state["memory_gib"])
    dep = prof.deployment
    if dep is None:  # the layout does not fit: show_warnings says why
        return
    err = state.work_error()
    if err:
        st.error(err)
        return
    try:
        js = state.current_plan_js()
        sim = state.cached_sim(prof, js, cap)
        flat = state.cached_sim(state.base_profile(), js, cap)["metrics"]
    except OctoPipeError as e:
        st.error(str(e))
        return
    plan = state.cached_plan(js)
    m = sim["metrics"]
    st.subheader(f"{plan.name} on {dep.layout.label()}, {dep.cluster.name}")
    panels.metric_row(m)
    st.caption(
        f"The same plan on the flat network (the profile's {prof.device.p2p_gbps:g} GB/s link "
        f"between every pair of devices, no data parallelism): step "
        f"{flat['step_time_ms']:,.1f} ms, {flat['tokens_per_gpu_per_s']:,.0f} tokens/GPU/s. "
        "Tokens/GPU/s counts every GPU of the layout (replicas are identical). "
        f"Bubble: {analysis.BUBBLE_DEFINITION}."
    )
    with st.expander(f"Where each pipeline device runs ({dep.layout.order})"):
        panels.frame(cluster_data.placement_frame(dep))
    max_bars = charts.DEFAULT_MAX_BARS
    if len(sim["timeline"]) > max_bars:
        max_bars = panels.every_block_toggle("cluster_every_block")
    st.caption(
        "Each device: compute lane (the optimizer step at the end), then its transfers (dark "
        "colours: across nodes), then its data-parallel stream (gradient reductions and "
        "ZeRO-1 all-gathers). Change the plan on the Plan page, the layout in the sidebar."
    )
    items = ((plan.name, js),)
    panels.gantt(items, max_bars, key="cluster_gantt")
    panels.where_time(items, key="cluster_where")
