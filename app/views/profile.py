"""Profile page: pick a sample or upload one, inspect its layers, edit layer-type costs."""

from __future__ import annotations

import json

import streamlit as st

from app.components import analysis, charts, display, panels, state, uploads
from octopipe_core.errors import OctoPipeError
from octopipe_core.profile import list_samples, parse_profile_bytes, profile_to_csv

ss = st.session_state
st.title("Profile")
st.caption(
    "A profile lists what each layer costs on one device: forward (F), input-gradient backward "
    "(B) and weight-gradient backward (W) times in ms, and memory in MiB."
)
ss.setdefault("upload_ver", 0)


def use_sample(name: str) -> None:
    """Switch to a bundled sample and empty the uploader (a new key is a new, empty one)."""
    ss["sample"] = name
    state.set_profile(state.cached_sample(name), "sample")
    ss["upload_ver"] += 1
    ss.pop("upload_token", None)
    ss.pop("upload_error", None)


c1, c2 = st.columns([1, 2])
with c1:
    choice = st.selectbox("bundled sample", list_samples(), key=state.bound("sample"))
    back = ss["profile_origin"] != "sample" and choice == ss["sample"]
    if choice != ss["sample"] or (back and st.button(f"Back to sample {choice}")):
        use_sample(choice)
        st.rerun()
with c2:
    up = st.file_uploader(
        "or upload a profile (octopipe.profile/v1 JSON, or CSV with one row per layer)",
        type=["json", "csv"],
        key=f"upload_{ss['upload_ver']}",
    )
if up is not None:
    new = uploads.parse_new(up, "upload", parse_profile_bytes)
    if new is not None:
        state.set_profile(new, "upload")
    uploads.show_error("upload")
else:
    uploads.forget("upload")

prof = state.base_profile()
origin = {
    "sample": "bundled sample",
    "upload": "uploaded",
    "edited": "edited in place",
    "plan": "from a plan file",
}
st.subheader(f"{prof.name} ({origin[ss['profile_origin']]})")
st.caption(
    f"{prof.num_layers:,} layers of {len(prof.layer_types)} types; "
    f"{prof.tokens_per_microbatch:,} tokens per micro-batch. {analysis.provenance(prof)}"
)
layers = analysis.layers_frame(prof)
types = analysis.layer_types_frame(prof)
display.chart(charts.layer_cost_figure(layers, types), key="layer_chart", name="layer-costs")

st.markdown("**Layer types** (edit costs in place; every change re-validates and re-simulates)")
edited = st.data_editor(
    types,
    key=f"types_{ss['profile_version']}",
    hide_index=True,
    width="stretch",
    disabled=["type", "count"],
    column_config={
        "family": st.column_config.SelectboxColumn("family", options=list(analysis.families())),
        "forward_ms": st.column_config.NumberColumn("F (ms)", min_value=0.0, format="%.4f"),
        "backward_input_ms": st.column_config.NumberColumn("B (ms)", min_value=0.0, format="%.4f"),
        "backward_weight_ms": st.column_config.NumberColumn("W (ms)", min_value=0.0, format="%.4f"),
        "activation_mib": st.column_config.NumberColumn("activation (MiB)", min_value=0.0),
        "weight_mib": st.column_config.NumberColumn("weights (MiB)", min_value=0.0),
        "output_mib": st.column_config.NumberColumn("stage output (MiB)", min_value=0.0),
        "w_stash_mib": st.column_config.NumberColumn("kept for W (MiB)", min_value=0.0),
        "workspace_mib": st.column_config.NumberColumn("B workspace (MiB)", min_value=0.0),
    },
)
if not edited.equals(types):
    try:
        new = analysis.profile_with_types(prof, edited)
    except OctoPipeError as e:
        st.error(str(e))
    else:
        state.set_profile(new, "edited")
        st.rerun()

st.markdown(f"**Layers** ({prof.num_layers}, in model order)")
panels.frame(layers, height=280)
d1, d2 = st.columns(2)
d1.download_button(
    "Download profile (JSON)",
    json.dumps(prof.to_dict(), indent=1) + "\n",
    file_name=f"{prof.name}.json",
    mime="application/json",
    on_click="ignore",
)
d2.download_button(
    "Download profile (CSV)",
    profile_to_csv(prof),
    file_name=f"{prof.name}.csv",
    mime="text/csv",
    on_click="ignore",
)
