"""Plan page: build a peer plan, then edit it by hand; every change re-simulates at once."""

from __future__ import annotations

import hashlib

import streamlit as st

from app.components import analysis, charts, display, panels, plan_files, state
from octopipe_core.errors import OctoPipeError
from octopipe_core.schedules import PARTITIONS, SCHEDULES

ss = st.session_state
st.title("Plan")
state.show_warnings()
c1, c2, c3 = st.columns(3)
c1.selectbox("peer schedule", SCHEDULES, key=state.bound("schedule"))
state.commit("schedule")
c2.number_input(
    "chunks per device (interleaved)", *state.LIMITS["chunks"], key=state.bound("chunks"),
    disabled=ss["schedule"] != "interleaved",
)  # fmt: skip
state.commit("chunks")
c3.selectbox("partition", PARTITIONS, key=state.bound("partition"))
state.commit("partition")
if state.url_extra("memory") == "1":
    ss["plan_memory"] = True
query = state.sync_query_params({"memory": "1"} if ss.get("plan_memory") else None)
panels.share_caption("plan", query)
state.check_work()

prof, s = state.profile(), state.settings()
try:
    js = state.current_plan_js()
    sim = state.cached_sim(prof, js, state.memory_cap())
except OctoPipeError as e:
    st.error(str(e))
    st.stop()
plan = state.cached_plan(js)
ss["_plan_js_shown"] = js
edited = "plan_edit" in ss and ss["plan_edit"]["plan"] == js
ref = None
if edited:
    ref = state.cached_sim(prof, state.cached_peer(prof, s), state.memory_cap())["metrics"]
source = ss["plan_edit"].get("source") if edited else None
note = (
    f" (from {source}; deltas against the peer plan)"
    if source
    else " (hand-edited; deltas against the peer plan)"
)
st.subheader(f"{plan.name}" + (note if edited else ""))
kept = ss.get("plan_edit")
if kept and not edited:
    k = kept["settings"]
    st.info(
        f"Your hand-edited plan is kept ({k.schedule}/{k.partition}, {k.devices} devices, "
        f"{k.microbatches} micro-batches): set those again to see and edit it. A new hand edit "
        "here replaces it; download it first to keep both."
    )
panels.metric_row(sim["metrics"], ref)
if prof.deployment is not None:
    st.caption(panels.cluster_note(prof))
c1, c2 = st.columns(2)
max_bars = charts.DEFAULT_MAX_BARS
if len(sim["timeline"]) > max_bars:
    with c1:
        max_bars = panels.every_block_toggle("plan_every_block")
show_memory = c2.toggle("memory per device over time (GiB)", key="plan_memory")
items = ((plan.name, js),)
panels.gantt(items, max_bars, key="plan_gantt")
panels.where_time(items, key="plan_where")
if show_memory:
    display.chart(state.cached_memory(prof, items, state.memory_cap()), key="plan_memory_chart")

st.markdown("### Edit by hand")
ss.setdefault("edit_ver", 0)
if ss.get("stage_edit_error"):  # a refused edit: the grid was reverted, the error shows once
    st.error(ss.pop("stage_edit_error"))
# editor keys change with the plan, so an editor never carries edits over to another plan
ver = f"{ss['edit_ver']}_{hashlib.sha1(js.encode()).hexdigest()[:10]}"
ss["_edit_key"] = ver
left, right = st.columns([2, 3])
with left:
    st.markdown("**Stages**: move boundaries (first layer) and assign devices")
    stages = analysis.stages_frame(plan, prof)
    new_stages = st.data_editor(
        stages,
        key=f"stages_{ver}",
        hide_index=True,
        width="stretch",
        height=min(420, 38 + 35 * len(stages)),
        disabled=["stage", "last layer", "F+B+W (ms)", "layers"],
        column_config={
            "first layer": st.column_config.NumberColumn(min_value=0, step=1),
            "device": st.column_config.NumberColumn(min_value=0, max_value=s.devices - 1, step=1),
        },
    )
    if not new_stages[["first layer", "device"]].equals(stages[["first layer", "device"]]):
        try:
            new = analysis.edit_stages(
                plan,
                prof,
                [int(x) for x in new_stages["first layer"]],
                [int(x) for x in new_stages["device"]],
            )
        except (OctoPipeError, ValueError, TypeError) as e:
            ss["stage_edit_error"] = f"Edit not applied: {e}"
            ss["edit_ver"] += 1  # a new grid key: the grid shows the plan again
            st.rerun()
        else:
            state.set_plan_edit(new)
            ss["edit_ver"] += 1
            st.rerun()
with right:
    devs = ["all devices", *(f"d{d}" for d in range(plan.num_devices))]
    pick = st.selectbox(
        "per-device order (`<stage><F|B|W|BW><micro-batch>`, space-separated)",
        devs,
        index=0 if plan.num_devices <= 16 else 1,
        key=f"order_dev_{plan.num_devices}",
    )
    full = analysis.schedule_text(plan)
    lines = full.splitlines()
    shown = full if pick == "all devices" else lines[devs.index(pick) - 1]
    text = st.text_area(
        "actions, in the order the device runs them",
        shown,
        height=260,
        key=f"order_{ver}_{pick}",
    )
    if text.strip() != shown.strip():
        if pick != "all devices":
            d = devs.index(pick) - 1
            body = text.strip()
            if not body.startswith(f"d{d}:"):
                body = f"d{d}: {body}"
            lines[d] = body
            text = "\n".join(lines)
        try:
            new = analysis.apply_schedule_text(plan, text, prof.num_layers)
        except OctoPipeError as e:
            st.error(str(e))
        else:
            state.set_plan_edit(new)
            ss["edit_ver"] += 1
            st.rerun()
b1, b2 = st.columns([1, 3])
if edited and b1.button("Reset hand edits"):
    ss.pop("plan_edit", None)
    ss["edit_ver"] += 1
    st.rerun()
with b2:
    panels.plan_download(js, key="plan_dl")
plan_files.open_plan_file()
