"""The Compare page's views: timelines, a sweep over sizes, the plan diff by layers, and the
simulated timeline against a trace recorded by ``octopipe run``."""

from __future__ import annotations

import hashlib

import streamlit as st

from app.components import (
    analysis,
    charts,
    display,
    layer_diff,
    panels,
    state,
    trace_overlay,
)
from octopipe_core.errors import OctoPipeError

VIEWS = {
    "timelines": "Timelines",
    "sweep": "Sweep",
    "diff": "Plan diff",
    "executed": "Simulated vs executed",
    "verify": "Measured (verify)",  # app/components/verify_view.py
}
SWEEP_AXES = ("microbatches", "devices")
SWEEP_PEERS = ["1f1b/uniform", "interleaved/uniform", "zb-h1/uniform", "zbv/balanced"]


def url_sweep() -> None:
    """A shared URL's sweep axis and schedules (``sweep=``, ``peers=``), once."""
    ss = st.session_state
    axis = state.url_extra("sweep")
    if axis in SWEEP_AXES:
        ss["sweep_axis"] = axis
    raw = state.url_extra("peers")
    if raw is not None:
        peers = [p for p in raw.split(",") if p in state.peer_options()]
        if peers:
            ss["sweep_peers"] = peers


def sweep_query() -> dict[str, str]:
    """The sweep's settings for the URL."""
    ss = st.session_state
    peers = ss.get("sweep_peers", SWEEP_PEERS)
    return {"sweep": ss.get("sweep_axis", "microbatches"), "peers": ",".join(peers)}


def default_picks(choices: dict[str, str]) -> list[str]:
    """1F1B against the session's tuned plan, else the schedule a shared URL names, else the
    quick tuned plan, else the best peer."""
    ss = st.session_state
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
        if best and best.key in choices and best.key not in default:
            default.append(best.key)
    return default


def url_picks(choices: dict[str, str]) -> list[str] | None:
    """The plans a shared URL picked (those that exist here), once."""
    raw = state.url_extra("plans")
    if raw is None:
        return None
    picks = [p for p in raw.split(",") if p in choices]
    if not picks:
        st.warning(f"URL parameter plans={raw[:60]!r} names no plan available here: ignored.")
        return None
    return picks


def timelines(plans: dict[str, str]) -> None:
    panels.comparison(plans, key="every_block")


def sweep() -> None:
    """Peer schedules over micro-batches or devices; points over the memory cap marked."""
    prof, s = state.profile(), state.settings()
    c1, c2 = st.columns([1, 3])
    axis = c1.radio("vary", SWEEP_AXES, key="sweep_axis")
    if "sweep_peers" in st.session_state:  # from a shared URL or an earlier run
        peers = c2.multiselect("schedules", state.peer_options(), key="sweep_peers")
    else:
        peers = c2.multiselect("schedules", state.peer_options(), SWEEP_PEERS, key="sweep_peers")
    if axis == "microbatches":
        values = tuple(v for v in (4, 8, 16, 32, 64, 128) if v >= 1)
    else:
        values = tuple(v for v in (1, 2, 4, 8, 16, 32) if v <= prof.num_layers)
    with st.spinner("simulating the sweep"):
        df = state.cached_sweep(prof, tuple(peers), axis, values, s)
    if df.empty:
        st.info("Nothing to sweep: pick schedules that fit this model.")
        return
    cap = state.memory_cap()
    display.chart(charts.sweep_figure(df, axis, cap), key="sweep_chart", name="sweep")
    over = int((~df["fits_memory"]).sum())
    st.caption(
        f"Red crosses: {over} of {len(df)} points do not fit the {cap:g} GiB memory "
        "cap. Peer schedules only; sizes a schedule cannot run (e.g. DualPipeV below 2 "
        "micro-batches per device, more stages than layers) or over the dashboard's work cap "
        f"are left out. Other settings as in the sidebar ({s.devices} devices, "
        f"{s.microbatches} micro-batches)."
    )
    panels.frame(analysis.format_metrics_table(df.rename(columns=analysis.METRIC_COLUMNS)))


def diff(choices: dict[str, str], plans: dict[str, str]) -> None:
    """Which layer ranges moved to which device, and each device's load and peak memory."""
    prof = state.profile()
    cap = float(st.session_state["memory_gib"])
    names = list(plans) if len(plans) >= 2 else list(choices)
    c1, c2 = st.columns(2)
    a = c1.selectbox("plan A", names, index=0, key="diff_a")
    b = c2.selectbox("plan B", names, index=min(1, len(names) - 1), key="diff_b")
    ra = state.cached_sim(prof, choices[a], cap)["result"]
    rb = state.cached_sim(prof, choices[b], cap)["result"]
    d = layer_diff.layer_diff(prof, ra, rb)
    st.markdown("\n".join(f"- {line}" for line in d["summary"]))
    st.markdown("**Layer ranges that run on another device**")
    if len(d["moves"]):
        panels.frame(d["moves"])
    else:
        st.caption("None: both plans put every layer on the same device.")
    st.markdown("**Per device: layers, load per micro-batch and peak memory, A → B**")
    panels.frame(d["devices"])
    fig = layer_diff.device_change_figure(d["devices"], (a, b))
    display.chart(fig, key="diff_chart", name="plan-diff")
    with st.expander("By stage index and per-device order"):
        old = analysis.plan_diff(state.cached_plan(choices[a]), state.cached_plan(choices[b]))
        st.markdown("\n".join(f"- {line}" for line in old["summary"]))
        panels.frame(old["stages"])
        panels.frame(old["devices"])


def executed(choices: dict[str, str]) -> None:
    """Upload ``trace_executed.json`` of a plan run with ``octopipe run`` and see it under
    the simulated timeline of that plan."""
    ss = st.session_state
    prof = state.profile()
    cap = float(ss["memory_gib"])
    names = list(choices)
    prefer = [n for n in names if n == "tuned" or n.startswith("plan page")]
    pick = st.selectbox(
        "plan that was run", names, index=names.index(prefer[0]) if prefer else 0, key="exec_plan"
    )
    up = st.file_uploader(
        "trace recorded by `octopipe run` (trace_executed.json in the job folder)",
        type=["json"],
        key="exec_trace",
    )
    st.caption(
        "Export the plan (Export page or `octopipe export`), run it with `octopipe run JOB`, "
        "then upload the job's trace_executed.json here."
    )
    if up is None:
        return
    raw = up.getvalue()
    token = hashlib.sha1(raw).hexdigest() + up.name
    if ss.get("exec_token") != token:
        ss["exec_token"] = token
        try:
            ss["exec_trace_df"] = trace_overlay.parse_trace(raw, up.name)
            ss.pop("exec_error", None)
        except OctoPipeError as e:
            ss["exec_error"] = str(e)
        except Exception as e:  # never a traceback for a user's file
            ss["exec_error"] = f"{up.name}: could not read it ({type(e).__name__}: {e})"
    if ss.get("exec_error"):
        st.error(ss["exec_error"])
        return
    trace = ss["exec_trace_df"]
    plan = state.cached_plan(choices[pick])
    all_steps = trace_overlay.steps(trace)
    lay = trace_overlay.layout_of(trace)
    c1, c2, c3 = st.columns(3)
    step = c1.selectbox("step", all_steps, index=len(all_steps) - 1, key="exec_step")
    replica = 0
    if lay.dp > 1:
        replica = int(c3.selectbox("replica", list(range(lay.dp)), key="exec_replica"))
    try:
        run = trace_overlay.match_plan(trace, plan, up.name, int(step), replica)
    except OctoPipeError as e:
        st.error(str(e))
        return
    sim = state.cached_sim(prof, choices[pick], cap)
    sim_ms = float(sim["metrics"]["step_time_ms"])
    run_ms = float(run.attrs["step_ms"])
    align = c2.radio(
        "time axis",
        ["scale the run to the simulated step", "real time"],
        key="exec_align",
        horizontal=True,
    )
    scale = sim_ms / run_ms if align.startswith("scale") and run_ms > 0 else 1.0
    where = f", replica {replica} of {lay.label()}" if lay.dp > 1 else ""
    st.caption(
        f"Step {step}{where}: executed {run_ms:,.2f} ms, simulated {sim_ms:,.1f} ms "
        f"({sim_ms / run_ms if run_ms else 0:,.2f}× the run). "
        + (f"Executed times × {scale:,.3g} to share the axis. " if scale != 1.0 else "")
        + "Upper half of each lane: simulated; lower half (outlined): executed, grey where it "
        "waited for an input, blue for its DP reductions, step sync and optimizer step."
    )
    fig = trace_overlay.overlay_figure(sim["timeline"], run, plan, scale)
    display.chart(fig, key="exec_chart", name="simulated-vs-executed")
    st.markdown("**Predicted (simulated) vs measured (executed), per device and the whole step**")
    panels.frame(trace_overlay.compare_frame(sim["timeline"], run, plan, sim_ms))
    peaks = trace_overlay.replica_peaks(trace, replica)
    if any(g is not None for g in peaks):
        panels.frame(trace_overlay.peak_frame(sim["result"].peak_memory_gib, peaks))
        st.caption(
            "Peak memory per device: simulated, and measured by the run (the CUDA allocator's "
            "largest allocation total, `torch.cuda.max_memory_allocated`)."
        )
