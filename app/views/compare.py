"""Compare page: plans side by side, a sweep over sizes, a plan diff by layers, a run's
trace over the simulated timeline, and measured step times (verify) beside the plans."""

from __future__ import annotations

import streamlit as st

from app.components import compare_views, panels, state, verify_view
from app.components.compare_views import VIEWS
from octopipe_core.errors import OctoPipeError

ss = st.session_state
st.title("Compare")
state.show_warnings()
state.check_work()
try:
    choices = state.plan_choices()
except OctoPipeError as e:
    st.error(str(e))
    st.stop()
if not choices:
    st.error("No plan can be built for these settings; fix: use fewer devices.")
    st.stop()

picks = compare_views.url_picks(choices)
if picks is not None:
    ss["compare_plans"] = picks
url_view = state.url_extra("view")
if url_view in VIEWS:
    ss["compare_view"] = VIEWS[url_view]
compare_views.url_sweep()
if "compare_plans" in ss:
    ss["compare_plans"] = [p for p in ss["compare_plans"] if p in choices]
    picked = st.multiselect(
        "plans (the first is the reference for deltas)", list(choices), key="compare_plans"
    )
else:
    picked = st.multiselect(
        "plans (the first is the reference for deltas)",
        list(choices),
        compare_views.default_picks(choices),
        key="compare_plans",
    )
if "compare_view" in ss:  # set by a shared URL or an earlier run: no default beside it
    view = st.segmented_control("view", list(VIEWS.values()), key="compare_view")
else:
    view = st.segmented_control(
        "view", list(VIEWS.values()), default="Timelines", key="compare_view"
    )
view = view or "Timelines"
view_key = next(k for k, v in VIEWS.items() if v == view)
extra = {"plans": ",".join(picked), "view": view_key}
if view_key == "sweep":
    extra |= compare_views.sweep_query()
query = state.sync_query_params(extra)
panels.share_caption("compare", query)
if not picked and view_key not in ("executed", "verify"):
    st.info("Pick at least one plan.")
    st.stop()
plans = {k: choices[k] for k in picked}

if view_key == "timelines":
    compare_views.timelines(plans)
elif view_key == "sweep":
    compare_views.sweep()
elif view_key == "diff":
    compare_views.diff(choices, plans)
elif view_key == "verify":
    verify_view.view(choices, picked)
else:
    compare_views.executed(choices)
