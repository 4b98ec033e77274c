"""Landing page: 1F1B (or, when it does not fit, the fastest peer that does) against a better
plan, as timelines, on the default sample."""

from __future__ import annotations

import streamlit as st

from app.components import analysis, guard, panels, state
from octopipe_core.errors import OctoPipeError

st.title("OctoPipe")
st.markdown(
    "Co-optimizes the **partition**, **placement** and **schedule** of pipeline-parallel training "
    "for heterogeneous models (Mamba, attention, MoE layers of different costs). Below: Megatron's "
    "1F1B against a better plan on the same devices, simulated from the layer profile."
)
state.show_warnings()
state.check_work()
prof, s = state.profile(), state.settings()
BASE = "1F1B (uniform)"
try:
    base = state.peer_plan_js("1f1b/uniform")
    other = state.challenger()
    m_base = state.cached_sim(prof, base, state.memory_cap())["metrics"]
    plans = {BASE: base}
    ref_name = BASE
    if not m_base["fits_memory"]:
        mine = other[0].removeprefix("best peer: ") if other else None
        fit = state.fitting_peer(exclude=mine)
        if fit is not None:  # the reference first: the table's deltas are against it
            ref_name = fit
            plans = {fit: state.peer_plan_js(fit), BASE: base}
    if other is not None:
        plans[other[0]] = other[1]
    cap = state.memory_cap()
    metrics = {n: state.cached_sim(prof, js, cap)["metrics"] for n, js in plans.items()}
except OctoPipeError as e:
    st.error(str(e))
    st.stop()
if other is not None:
    m_ref, m_c = metrics[ref_name], metrics[other[0]]
    st.subheader(analysis.headline(other[0], m_c, ref_name, m_ref))
    if ref_name != BASE:
        st.info(
            f"1F1B (uniform) does not fit the {s.memory_gib:g} GiB cap (peak "
            f"{m_base['max_peak_memory_gib']:.1f} GiB), so the headline compares with "
            f"{ref_name}, the fastest peer schedule that fits."
        )
    elif not m_base["fits_memory"]:
        st.warning(
            f"No peer schedule fits the {s.memory_gib:g} GiB cap at these settings: the "
            "headline compares with 1F1B (uniform), which does not fit either. Raise the cap, "
            "or use more devices or a memory-lean schedule."
        )
    st.caption(
        f"{prof.name}, {s.devices} devices, {s.microbatches} micro-batches, memory cap "
        f"{s.memory_gib:g} GiB. The challenger is your plan from the Tune page if you ran one, "
        f"else OctoPipe's tuner run for {state.AUTO_TUNE_BUDGET_S:g} s (workloads up to "
        f"{state.AUTO_TUNE_MAX_SIZE:,} devices × micro-batches and {guard.MAX_TUNE_LAYERS} "
        "layers), else the fastest peer schedule "
        "that fits the memory cap. Deltas below are against the reference."
    )
    panels.metric_row(m_c, m_ref)
if prof.deployment is not None:
    st.caption(panels.cluster_note(prof))
panels.comparison(plans, key="overview_every_block")
c1, c2, c3 = st.columns(3)
c1.page_link("views/plan.py", label="Edit a plan by hand", icon=":material/build:")
c2.page_link("views/tune.py", label="Tune a plan", icon=":material/tune:")
c3.page_link(
    "views/compare.py", label="Compare plans, sweep sizes, diff", icon=":material/compare_arrows:"
)
