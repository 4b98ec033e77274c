"""Cluster page: pick, upload or edit the cluster; the current plan on its layout."""

from __future__ import annotations

import streamlit as st

from app.components import cluster_data, cluster_panels, cluster_state, state

st.title("Cluster")
st.caption(
    "Nodes of GPUs joined by NVLink inside a node and one NIC per GPU across nodes. Pick a "
    "sample in the sidebar (with the layout: DP, ZeRO-1, rank order), upload a cluster file or "
    "edit one here; every page then simulates on it. 'none' keeps the flat network."
)
state.show_warnings()
query = state.sync_query_params()
st.caption(f"Share this view: `/cluster?{query}`")
c = cluster_state.current()
left, right = st.columns([1, 2])
with left:
    cluster_panels.upload()
with right:
    if c is None:
        st.info(
            "No cluster: one pipeline on the profile's flat link, no data parallelism (as "
            "without clusters). Pick a sample in the sidebar, upload one or edit one below."
        )
    else:
        st.markdown(f"**{c.name}**: {cluster_data.describe(c)}.")
        if st.session_state["cluster"] == cluster_data.CUSTOM:
            st.caption("A custom cluster is not carried by the URL: download it to share it.")
        cluster_panels.download(c)
cluster_panels.editor(c)
if c is not None:
    cluster_panels.layout_view()
