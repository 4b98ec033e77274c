"""Layouts page: rank TP x PP x DP layouts of a GPU budget, and strong/weak scaling."""

from __future__ import annotations

import streamlit as st

from app.components import cluster_data, cluster_layouts, cluster_state, guard, state

st.title("Layouts")
state.show_warnings()
query = state.sync_query_params()
st.caption(f"Share this view: `/layouts?{query}`")
c = cluster_state.current()
if c is None:
    st.info(
        "Layouts split a GPU budget over a cluster: pick a cluster in the sidebar (or upload one "
        "on the Cluster page), then rank its TP × PP × DP layouts here."
    )
    st.stop()
st.caption(f"**{c.name}**: {cluster_data.describe(c)}. Profile: {state.base_profile().name}.")
try:
    guard.check_layers(state.base_profile().num_layers, "Layouts page")
except guard.OctoPipeError as e:
    st.error(str(e))
    st.stop()
view = st.segmented_control(
    "view", ["Rank layouts", "Scaling"], default="Rank layouts", key="layouts_view"
)
if (view or "Rank layouts") == "Rank layouts":
    cluster_layouts.rank_section(c)
else:
    cluster_layouts.scaling_section(c)
