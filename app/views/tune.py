"""Tune page: run the tuner with a time budget; cancelling keeps the best plan found."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from app.components import analysis, panels, state, tuning
from octopipe_core.errors import OctoPipeError

ss = st.session_state
st.title("Tune")
prof, s = state.profile(), state.settings()
st.caption(
    f"Searches partition, placement and schedule together for {prof.name} on {s.devices} "
    f"devices, {s.microbatches} micro-batches, memory cap {s.memory_gib:g} GiB (change them in "
    "the sidebar)."
)
state.show_warnings()
state.check_work()
if prof.deployment is not None:
    st.caption(panels.cluster_note(prof))
tune_fn, why = tuning.load_tuner()
if tune_fn is None:
    st.warning(
        f"Tuning is unavailable here: {why}. The other pages work without it; Compare and the "
        "Overview then show the best peer schedule instead of a tuned plan."
    )

too_long = tuning.too_long_to_tune(prof.num_layers)
if too_long:
    st.error(too_long)
c1, c2, c3 = st.columns([2, 1, 1])
budget = c1.slider("time budget (s)", 1, 120, 10, key="tune_budget")
seed = c2.number_input("seed", 0, 10_000, 0, key="tune_seed")
go = c3.button(
    "Run tuner", type="primary", disabled=tune_fn is None or bool(too_long), key="tune_go"
)

if go and tune_fn is not None:
    stop_slot = st.empty()
    stop_slot.button("Stop (keep best so far)", key="tune_stop")
    bar = st.progress(0.0, text="starting")
    ss["tune_running"] = True
    ss.pop("tune_partial", None)
    t0 = time.monotonic()
    last = [0.0]
    key = state.workload_key()

    def on_progress(p: tuning.Progress) -> None:
        if p.plan is not None:
            ss["tune_partial"] = {
                "key": key,
                "plan": analysis.plan_json(p.plan),
                "best_step_ms": p.best_step_ms,
            }
        now = time.monotonic()
        if now - last[0] < 0.1:
            return
        last[0] = now
        frac = p.fraction if p.fraction is not None else min(1.0, (now - t0) / budget)
        best = f"{p.best_step_ms:,.1f} ms" if p.best_step_ms is not None else "-"
        bar.progress(frac, text=f"phase: {p.phase or '…'} · best step time so far: {best}")

    try:
        result = tuning.call_tune(
            tune_fn, prof, s.devices, s.microbatches, state.memory_cap(), float(budget), int(seed),
            on_progress, chunks=s.chunks,
        )  # fmt: skip
        plan = tuning.result_plan(result)
        if plan is None:
            raise OctoPipeError("the tuner returned no plan; fix: report this tuner bug")
        analysis.validate(plan, prof.num_layers)
    except OctoPipeError as e:
        ss["tune_running"] = False
        st.error(f"Tuning failed: {e}")
    except Exception as e:  # a tuner bug must not take the page down
        ss["tune_running"] = False
        st.error(f"Tuning failed: {type(e).__name__}: {e}")
    else:
        ss["tune_running"] = False
        ss.pop("tune_partial", None)
        ss["tuned"] = {
            "key": key,
            "plan": analysis.plan_json(plan),
            "notes": tuning.result_notes(result),
            "history": tuning.result_history(result),
            "elapsed_s": round(time.monotonic() - t0, 2),
        }
        bar.progress(1.0, text=f"done in {time.monotonic() - t0:.1f} s")
    stop_slot.empty()

if ss.pop("tune_stopped_empty", False):
    st.info("Tuning was interrupted before it found a plan for the current settings.")
tuned_js = state.tuned_plan_js()
if tuned_js is None:
    st.info("No tuned plan for this workload yet: run the tuner.")
    st.stop()
t = ss["tuned"]
if t.get("note"):
    st.warning(t["note"])
for n in t.get("notes", []):
    st.caption(n)
if t.get("history"):
    with st.expander(f"Search history ({len(t['history'])} accepted moves)"):
        panels.frame(pd.DataFrame(t["history"]))
plan = analysis.plan_from_json(tuned_js)
st.subheader(f"Tuned plan: {plan.name or 'tuned'}")
base = state.peer_plan_js("1f1b/uniform")
cap = state.memory_cap()
m_t = state.cached_sim(prof, tuned_js, cap)["metrics"]
m_b = state.cached_sim(prof, base, cap)["metrics"]
st.caption(f"Deltas against 1F1B (uniform): {m_b['step_time_ms'] / m_t['step_time_ms']:.3f}× speed")
panels.metric_row(m_t, m_b)
panels.comparison({"1F1B (uniform)": base, "tuned": tuned_js}, key="tune_every_block")
c1, c2, c3 = st.columns(3)
with c1:
    panels.plan_download(tuned_js, "Download tuned plan (JSON)", key="tuned_dl")
if c2.button("Open in the Plan page (edit it, share it by link)", key="tuned_to_plan"):
    state.set_plan_edit(plan, source="the Tune page")
    st.switch_page("views/plan.py")
c3.page_link("views/compare.py", label="Compare with every peer", icon=":material/compare_arrows:")
