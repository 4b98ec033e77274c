"""Streamlit blocks of the Layouts page: rank TP x PP x DP layouts of a GPU budget
(``cluster_plan.rank_layouts``) and strong/weak scaling (``scaling.scaling_study``).

The core does the work; these blocks bound it (GPU budget, time budget, layouts tuned, GPU
counts), show its progress callback as a progress bar and keep the result in the session.
"""

from __future__ import annotations

import time
from typing import Any

import streamlit as st

from app.components import (
    analysis,
    cluster_charts,
    cluster_data,
    cluster_state,
    display,
    panels,
    state,
)
from octopipe_core.cluster import Cluster
from octopipe_core.cluster_plan import rank_layouts
from octopipe_core.errors import OctoPipeError
from octopipe_core.scaling import scaling_study

MAX_RANK_GPUS = 8192
MAX_RANK_BUDGET_S = 60
MAX_TUNED = 6
MAX_SCALING_POINTS = 5
MAX_SCALING_GPUS = 1024
MAX_POINT_BUDGET_S = 10
RANK_SOURCE = "the layout ranking"


def _result_key(c: Cluster) -> tuple[Any, ...]:
    return (st.session_state["profile_version"], cluster_data.cluster_key(c))


def _tps(other_tp: bool) -> list[int] | None:
    """TP degrees to try: the profile's own (read-only), or also those ``tp_scaling`` derives."""
    return None if other_tp else [state.base_profile().device.gpus]


def rank_section(c: Cluster) -> None:
    """Inputs, the Rank button with its progress bar, and the last ranking's table and chart."""
    ss = st.session_state
    if ss.pop("_goto_plan", False):  # set by "Open the best plan"
        st.switch_page("views/plan.py")
    prof = state.base_profile()
    tp = prof.device.gpus
    top = max(tp, min(c.total_gpus, MAX_RANK_GPUS))
    cols = st.columns(4)
    gpus = cols[0].number_input(
        "GPU budget", tp, top, min(top, max(tp, 16)), step=tp, key=f"rank_gpus_{top}",
        help=f"GPUs to split into TP × PP × DP (at most the cluster's {c.total_gpus:,}).",
    )  # fmt: skip
    batch = cols[1].number_input(
        "global batch (sequences)", 1, 1 << 20, 64, key="rank_batch",
        help=f"Sequences per step; one sequence is one micro-batch of "
        f"{prof.tokens_per_microbatch:,} tokens, so micro-batches = batch / DP.",
    )  # fmt: skip
    budget = cols[2].slider("time budget (s)", 1, MAX_RANK_BUDGET_S, 4, key="rank_budget")
    tuned = cols[3].number_input("layouts tuned", 1, MAX_TUNED, 2, key="rank_tuned")
    other_tp = st.checkbox(
        f"also try TP degrees other than the profile's ({tp}): times and memory scaled by "
        "tp_scaling",
        key="rank_other_tp",
    )
    if st.button("Rank layouts", type="primary", key="rank_go"):
        bar = st.progress(0.0, text="enumerating layouts")

        def on_progress(message: str, fraction: float) -> None:
            bar.progress(min(1.0, max(0.0, fraction)), text=message)

        try:
            res = rank_layouts(
                prof, c, int(batch), gpus=int(gpus), time_budget_s=float(budget),
                tps=_tps(other_tp), max_tuned=int(tuned), progress=on_progress,
            )  # fmt: skip
        except OctoPipeError as e:
            bar.empty()
            st.error(str(e))
            ss.pop("cluster_rank", None)
        else:
            bar.progress(1.0, text=f"ranked {len(res.rows)} layouts in {res.search_time_s:.1f} s")
            ss["cluster_rank"] = _rank_record(c, res, float(budget))
    rec = ss.get("cluster_rank")
    if rec is None or rec["key"] != _result_key(c):
        st.info("Set a GPU budget and a global batch, then rank the layouts.")
        return
    _show_ranking(c, rec)


def _rank_record(c: Cluster, res: Any, budget: float) -> dict[str, Any]:
    best = res.best
    rec: dict[str, Any] = {
        "key": _result_key(c),
        "rows": [r.to_dict() for r in res.rows],
        "notes": list(res.notes),
        "gpus": res.gpus,
        "global_batch": res.global_batch,
        "search_time_s": res.search_time_s,
        "budget_s": budget,
        "memory_gib": c.gpu_memory_gib,
        "best": None,
    }
    if best is not None and best.plan is not None and best.profile is not None:
        own = state.base_profile().device.gpus
        rec["best"] = {
            "plan": analysis.plan_json(best.plan),
            "layout": best.layout.to_dict(),
            "microbatches": best.microbatches,
            "step_time_ms": best.step_time_ms,
            # a best layout at another TP degree runs on the profile scaled to it
            "profile": None if best.layout.tp == own else best.profile.with_deployment(None),
        }
    return rec


def _show_ranking(c: Cluster, rec: dict[str, Any]) -> None:
    rows = rec["rows"]
    n_fit = sum(1 for r in rows if r["fits_memory"] and r["step_time_ms"] is not None)
    st.caption(
        f"{len(rows)} layouts of {rec['gpus']:,} GPUs on {c.name} for a global batch of "
        f"{rec['global_batch']:,} sequences ({n_fit} fit), ranked in {rec['search_time_s']:.1f} s "
        f"(budget {rec['budget_s']:g} s): each layout screened with peer schedules, the most "
        "promising tuned. Tokens/GPU/s at the layout's best plan counts every GPU; memory cap: "
        f"the cluster's {rec['memory_gib']:g} GiB per GPU. Fitting layouts first."
    )
    if rec["best"] is not None:
        b = rec["best"]
        lay = b["layout"]
        st.button(
            f"Open the best plan in the Plan page (TP{lay['tp']} × PP{lay['pp']} × "
            f"DP{lay['dp']}{' ZeRO-1' if lay['zero1'] else ''}, {b['microbatches']} "
            "micro-batches)",
            key="rank_open",
            on_click=_open_best,
        )
    else:
        st.warning("No layout fits the memory cap: see the 'why' column.")
    panels.frame(
        cluster_data.rank_frame(rows).style.format(
            {"step time (ms)": "{:,.1f}", "tokens/GPU/s": "{:,.0f}", "peak memory (GiB)": "{:.1f}"},
            na_rep="-",
        ),
        key="rank_table",
    )
    display.chart(cluster_charts.rank_figure(rows), key="rank_chart", name="layouts")
    if rec["notes"]:
        with st.expander(f"Search notes ({len(rec['notes'])})"):
            st.markdown("\n".join(f"- {n}" for n in rec["notes"]))


def _open_best() -> None:
    """Callback: the best plan's layout and size into the sidebar, the plan into the Plan page."""
    ss = st.session_state
    b = ss["cluster_rank"]["best"]
    lay = b["layout"]
    if b["profile"] is not None:
        state.set_profile(b["profile"], "edited")
    for name, value in (
        ("devices", int(lay["pp"])),
        ("microbatches", int(b["microbatches"])),
        ("dp", int(lay["dp"])),
        ("zero1", bool(lay["zero1"])),
        ("order", lay["order"]),
        ("memory_gib", float(ss["cluster_rank"]["memory_gib"])),
    ):
        cluster_state.set_value(name, value)
    state.set_plan_edit(analysis.plan_from_json(b["plan"]), source=RANK_SOURCE)
    ss["_goto_plan"] = True


# --------------------------------------------------------------------------------------------
def scaling_section(c: Cluster) -> None:
    """Strong or weak scaling over a few GPU counts (the cluster's node type, resized)."""
    ss = st.session_state
    prof = state.base_profile()
    choices = cluster_data.gpu_choices(c.gpus_per_node, MAX_SCALING_GPUS)
    c1, c2, c3 = st.columns([1, 3, 2])
    kind = c1.radio("scaling", ["strong", "weak"], key="scale_kind")
    gpus = c2.multiselect(
        f"GPU counts (at most {MAX_SCALING_POINTS})", choices, default=choices[:3],
        max_selections=MAX_SCALING_POINTS, key=f"scale_gpus_{c.gpus_per_node}",
    )  # fmt: skip
    if kind == "strong":
        batch = c3.number_input("global batch (sequences)", 1, 1 << 20, 64, key="scale_batch")
        per_gpu = 0.5
    else:
        per_gpu = c3.number_input(
            "sequences per GPU", 0.125, 64.0, 4.0, step=0.5, key="scale_per_gpu"
        )
        batch = 1024
    budget = st.slider(
        "time budget per GPU count (s)", 1, MAX_POINT_BUDGET_S, 1, key="scale_budget"
    )
    other_tp = st.checkbox("also try TP degrees other than the profile's", key="scale_other_tp")
    st.caption(
        f"Each GPU count uses {c.name}'s nodes and links, resized to that many nodes; the best "
        "layout for it is found and tuned as on the ranking view, and 1F1B and the best peer are "
        "simulated at that layout. GPU counts where no layout fits are left out."
    )
    if st.button("Run scaling study", type="primary", key="scale_go", disabled=not gpus):
        bar = st.progress(0.0, text=f"{kind} scaling over {len(gpus)} GPU counts")
        t0 = time.monotonic()

        def on_progress(message: str, fraction: float) -> None:
            bar.progress(min(1.0, max(0.0, fraction)), text=message)

        try:
            pts = scaling_study(
                prof, c, kind, sorted(int(g) for g in gpus), global_batch=int(batch),
                sequences_per_gpu=float(per_gpu), time_budget_s=float(budget), max_tuned=1,
                tps=_tps(other_tp), progress=on_progress,
            )  # fmt: skip
        except OctoPipeError as e:
            bar.empty()
            st.error(str(e))
            ss.pop("cluster_scaling", None)
        else:
            bar.progress(1.0, text=f"done in {time.monotonic() - t0:.1f} s")
            ss["cluster_scaling"] = {
                "key": _result_key(c),
                "kind": kind,
                "points": [p.to_dict() for p in pts],
            }
    rec = ss.get("cluster_scaling")
    if rec is None or rec["key"] != _result_key(c):
        st.info("Pick GPU counts, then run the scaling study.")
        return
    if not rec["points"]:
        st.warning("No GPU count had a layout that fits: try a larger global batch or budget.")
        return
    display.chart(
        cluster_charts.scaling_figure(rec["points"], rec["kind"]), key="scaling_chart",
        name="scaling",
    )  # fmt: skip
    panels.frame(cluster_data.scaling_frame(rec["points"]).round(2), key="scaling_table")
