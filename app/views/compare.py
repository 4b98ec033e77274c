"""Compare page: plans side by side, a sweep over sizes, and a plan diff."""

from __future__ import annotations

import streamlit as st

from app.components import analysis, charts, panels, state
from octopipe_core.errors import OctoPipeError

ss = st.session_state
st.title("Compare")
state.show_warnings()
query = state.sync_query_params()
st.caption(f"Share this view: `/compare?{query}`")
prof, s = state.profile(), state.settings()
try:
    choices = state.plan_choices()
except OctoPipeError as e:
    st.error(str(e))
    st.stop()
if not choices:
    st.error("No plan can be built for these settings; fix: use fewer devices.")
    st.stop()

# Default pair: 1F1B against the session's tuned plan, else the schedule a shared URL names,
# else the quick tuned plan, else the best peer.
default = ["1f1b/uniform"] if "1f1b/uniform" in choices else [next(iter(choices))]
mine = next((k for k in choices if k.startswith("plan page")), None)
if "tuned" in choices:
    default.append("tuned")
elif ss["url_schedule"] not in (None, "1f1b") and mine:
    default.append(mine)
elif state.AUTO_TUNED in choices:
    default.append(state.AUTO_TUNED)
else:
    best = state.best_peer()
    if best and best[0] in choices and best[0] not in default:
        default.append(best[0])
picked = st.multiselect("plans (the first is the reference for deltas)", list(choices), default)
view = st.segmented_control(
    "view", ["Timelines", "Sweep", "Plan diff"], default="Timelines", key="compare_view"
)
view = view or "Timelines"
if not picked:
    st.info("Pick at least one plan.")
    st.stop()
plans = {k: choices[k] for k in picked}

if view == "Timelines":
    panels.comparison(plans, key="every_block")

elif view == "Sweep":
    c1, c2 = st.columns([1, 3])
    axis = c1.radio("vary", ["microbatches", "devices"], key="sweep_axis")
    peers = c2.multiselect(
        "schedules",
        state.peer_options(),
        ["1f1b/uniform", "interleaved/uniform", "zb-h1/uniform", "zbv/balanced"],
        key="sweep_peers",
    )
    if axis == "microbatches":
        values = tuple(v for v in (4, 8, 16, 32, 64, 128) if v >= 1)
    else:
        values = tuple(v for v in (1, 2, 4, 8, 16, 32) if v <= prof.num_layers)
    with st.spinner("simulating the sweep"):
        df = state.cached_sweep(prof, tuple(peers), axis, values, s)
    if df.empty:
        st.info("Nothing to sweep: pick schedules that fit this model.")
    else:
        st.plotly_chart(charts.sweep_figure(df, axis, s.memory_gib), width="stretch")
        st.caption(
            "Peer schedules only; sizes a schedule cannot run (e.g. DualPipeV below 2 "
            "micro-batches per device, more stages than layers) are left out. "
            f"Other settings as in the sidebar ({s.devices} devices, {s.microbatches} "
            "micro-batches)."
        )
        panels.frame(df.round(3).rename(columns=analysis.METRIC_COLUMNS))

else:
    names = list(plans) if len(plans) >= 2 else list(choices)
    c1, c2 = st.columns(2)
    a = c1.selectbox("plan A", names, index=0, key="diff_a")
    b = c2.selectbox("plan B", names, index=min(1, len(names) - 1), key="diff_b")
    diff = analysis.plan_diff(
        analysis.plan_from_json(choices[a]), analysis.plan_from_json(choices[b])
    )
    st.markdown("\n".join(f"- {line}" for line in diff["summary"]))
    st.markdown("**Stages: partition boundaries and placement**")
    panels.frame(diff["stages"])
    st.markdown("**Per-device orders**")
    panels.frame(diff["devices"])
