"""Landing page: 1F1B against a better plan, as timelines, on the default sample."""

from __future__ import annotations

import streamlit as st

from app.components import panels, state
from octopipe_core.errors import OctoPipeError

st.title("OctoPipe")
st.markdown(
    "Co-optimizes the **partition**, **placement** and **schedule** of pipeline-parallel training "
    "for heterogeneous models (Mamba, attention, MoE layers of different costs). Below: Megatron's "
    "1F1B against a better plan on the same devices, simulated from the layer profile."
)
state.show_warnings()
prof, s = state.profile(), state.settings()
try:
    base = state.peer_plan_js("1f1b/uniform")
    other = state.challenger()
except OctoPipeError as e:
    st.error(str(e))
    st.stop()
plans = {"1F1B (uniform)": base}
if other is not None:
    plans[other[0]] = other[1]
metrics = {n: state.cached_sim(prof, js, s.memory_gib)["metrics"] for n, js in plans.items()}
names = list(plans)
if len(names) == 2:
    a, b = (metrics[n] for n in names)
    speed = a["step_time_ms"] / b["step_time_ms"]
    st.subheader(f"{names[1]} is {speed:.2f}× faster than 1F1B")
    st.caption(
        f"{prof.name}, {s.devices} devices, {s.microbatches} micro-batches, memory cap "
        f"{s.memory_gib:g} GiB. The challenger is your plan from the Tune page if you ran one, "
        f"else OctoPipe's tuner run for {state.AUTO_TUNE_BUDGET_S:g} s (workloads up to "
        f"{state.AUTO_TUNE_MAX_SIZE:,} devices × micro-batches), else the fastest peer schedule "
        "that fits the memory cap."
    )
    panels.metric_row(b, a)
if prof.deployment is not None:
    st.caption(panels.cluster_note(prof))
panels.comparison(plans, key="overview_every_block")
c1, c2, c3 = st.columns(3)
c1.page_link("views/plan.py", label="Edit a plan by hand", icon=":material/build:")
c2.page_link("views/tune.py", label="Tune a plan", icon=":material/tune:")
c3.page_link(
    "views/compare.py", label="Compare plans, sweep sizes, diff", icon=":material/compare_arrows:"
)
