"""Session state, shareable query parameters and cached simulation for the dashboard pages.

State lives under a few plain keys of ``st.session_state``:

* ``profile`` (a frozen ``Profile``), ``profile_origin`` ("sample", "upload" or "edited") and
  ``profile_version`` (bumped on every change; plan caches key on it);
* ``sample``, ``devices``, ``microbatches``, ``memory_gib``, ``schedule``, ``chunks``,
  ``partition``: the settings, also carried by the URL's query parameters;
* ``plan_edit``: the hand-edited plan of the Plan page (JSON) with the settings it was made for;
* ``tuned``: the tuner's best plan (JSON) with the settings it was made for;
* ``cluster``, ``dp``, ``zero1``, ``order``: the cluster and layout (see ``cluster_state``);
  ``profile()`` is the session's profile deployed on them, ``base_profile()`` the profile itself;
* ``critical``, ``img_format``: view settings (highlight the critical path; chart downloads);
* ``url_extra``: a shared URL's page settings (Compare's plans and view), read by the pages.

The URL carries every setting a view depends on (see ``sync_query_params``), and a
hand-edited or tuned plan of the Plan page as ``plan=`` (``plan_link``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app.components import (
    analysis,
    charts,
    cluster_data,
    cluster_state,
    display,
    exporting,
    guard,
    plan_link,
    plots,
    tuning,
    where,
)
from app.components.analysis import Settings
from octopipe_core.errors import OctoPipeError
from octopipe_core.peers import PeerScore, PeerTable, peer_table
from octopipe_core.plan import Plan
from octopipe_core.profile import Profile, list_samples, load_sample
from octopipe_core.schedules import PARTITIONS, SCHEDULES
from octopipe_core.simulator import simulate

DEFAULT_SAMPLE = "nemotron-h-8b"
AUTO_TUNED = "OctoPipe (quick tune)"
DEFAULTS: dict[str, Any] = {
    "sample": DEFAULT_SAMPLE,
    "devices": 8,
    "microbatches": 32,
    "schedule": "1f1b",
    "chunks": 2,
    "partition": "uniform",
    "memory_gib": 80.0,
    "critical": False,
    "img_format": "svg",
    **cluster_state.DEFAULTS,
}
QUERY_KEYS = (
    "sample", "devices", "microbatches", "schedule", "chunks", "partition", "memory_gib",
    "critical", "img", *cluster_state.QUERY_KEYS,
)  # fmt: skip
STATE_KEY = {"img": "img_format"}  # URL parameter -> session key, where they differ
PAGE_KEYS = ("plans", "view", "sweep", "peers", "memory")  # read by the page that uses them
# Streamlit hashes a cached function's profile argument with this: a deployment memoises its
# links as it is used, which must not change the cache key.
HASH_FUNCS: dict[Any, Any] = {Profile: cluster_data.profile_cache_key}
LIMITS = {"devices": (1, 128), "microbatches": (1, 1024), "chunks": (1, 8)}


@st.cache_data(show_spinner=False, max_entries=16)
def cached_sample(name: str) -> Profile:
    return load_sample(name)


def init() -> None:
    """Fill defaults once per session, reading the URL's query parameters first."""
    ss = st.session_state
    if ss.get("_initialised"):
        return
    ss["_initialised"] = True
    warnings: list[str] = []
    values = dict(DEFAULTS)
    given: dict[str, Any] = {}
    qp = st.query_params
    for key in QUERY_KEYS:
        if key not in qp:
            continue
        raw = qp.get(key, "")
        try:
            values[STATE_KEY.get(key, key)] = given[key] = _parse_param(key, raw)
        except ValueError as e:
            warnings.append(f"URL parameter {key}={raw[:40]!r} ignored: {e}")
    for k, v in values.items():
        ss.setdefault(k, v)
    ss["qp_warnings"] = warnings
    ss["url_schedule"] = given.get("schedule")  # a shared URL's schedule, if valid
    ss["url_extra"] = {k: qp.get(k, "") for k in PAGE_KEYS if k in qp}
    try:
        set_profile(cached_sample(ss["sample"]), "sample")
    except OctoPipeError as e:
        ss["qp_warnings"].append(str(e))
        ss["sample"] = DEFAULT_SAMPLE
        set_profile(cached_sample(DEFAULT_SAMPLE), "sample")
    if "plan" in qp:
        _open_plan_link(qp.get("plan", ""))


def _open_plan_link(text: str) -> None:
    """Make a shared link's plan the Plan page's plan (its devices and micro-batches too)."""
    ss = st.session_state
    try:
        plan = plan_link.decode(text, base_profile().num_layers)
        guard.check_plan(plan)
    except OctoPipeError as e:
        ss["qp_warnings"].append(str(e))
        return
    ss["devices"], ss["microbatches"] = plan.num_devices, plan.num_microbatches
    set_plan_edit(plan, source="a shared link")


def url_extra(key: str) -> str | None:
    """A page setting a shared URL carried (``plans``, ``view``), once: later visits use the
    page's own widgets."""
    return st.session_state.get("url_extra", {}).pop(key, None)


def recover_interrupted_tune() -> None:
    """A tuner run stopped by a click (Stop, or another page) keeps its best plan so far."""
    ss = st.session_state
    if not ss.get("tune_running"):
        return
    ss["tune_running"] = False
    partial = ss.pop("tune_partial", None)
    if partial and partial["key"] == workload_key():
        ss["tuned"] = {**partial, "note": "Tuning stopped early: kept the best plan found so far."}
    else:
        ss["tune_stopped_empty"] = True


def _parse_param(key: str, raw: str) -> Any:
    if key in cluster_state.QUERY_KEYS:
        return cluster_state.parse_param(key, raw)
    if key == "sample":
        if raw not in list_samples():
            raise ValueError(f"use one of {', '.join(list_samples())}")
        return raw
    if key == "schedule":
        if raw not in SCHEDULES:
            raise ValueError(f"use one of {', '.join(SCHEDULES)}")
        return raw
    if key == "partition":
        if raw not in PARTITIONS:
            raise ValueError(f"use one of {', '.join(PARTITIONS)}")
        return raw
    if key == "memory_gib":
        v = float(raw)
        if not math.isfinite(v) or not 0 < v <= 4096:
            raise ValueError("use a number of GiB in (0, 4096]")
        return v
    if key == "critical":
        return cluster_data.parse_bool(raw)
    if key == "img":
        if raw not in display.IMAGE_FORMATS:
            raise ValueError(f"use one of {', '.join(display.IMAGE_FORMATS)}")
        return raw
    v = int(raw)
    lo, hi = LIMITS[key]
    if not lo <= v <= hi:
        raise ValueError(f"use {lo}..{hi}")
    return v


def show_warnings() -> None:
    for w in st.session_state.get("qp_warnings", []):
        st.warning(w)
    err = st.session_state.get("cluster_error")
    if err:
        st.error(f"Cluster layout: {err} (simulating on the flat network until it fits)")


def work_error() -> str | None:
    """Why the sidebar's settings are over the dashboard's work cap (None: they are not)."""
    try:
        guard.check_settings(settings(), base_profile().num_layers)
    except OctoPipeError as e:
        return str(e)
    return None


def check_work() -> None:
    """Stop a page that simulates the sidebar's settings when they are over the work cap,
    saying so in the page (instead of freezing every session for minutes)."""
    err = work_error()
    if err:
        st.error(err)
        st.stop()


def set_profile(profile: Profile, origin: str) -> None:
    ss = st.session_state
    ss["profile"] = profile
    ss["profile_origin"] = origin
    ss["profile_version"] = ss.get("profile_version", 0) + 1
    ss.pop("plan_edit", None)


def base_profile() -> Profile:
    """The session's profile as loaded or edited (no cluster)."""
    return st.session_state["profile"]


def profile() -> Profile:
    """The profile every page simulates: the session's, deployed on the picked cluster and
    layout (TP = device.gpus, PP = devices), or the session's as is on the flat network."""
    ss = st.session_state
    return cluster_state.deployed(ss["profile"], ss["profile_version"], int(ss["devices"]))


def settings(schedule: str | None = None, partition: str | None = None) -> Settings:
    ss = st.session_state
    return Settings(
        devices=int(ss["devices"]),
        microbatches=int(ss["microbatches"]),
        schedule=schedule or ss["schedule"],
        chunks=int(ss["chunks"]),
        partition=partition or ss["partition"],
        memory_gib=float(ss["memory_gib"]),
    )


def memory_cap() -> float:
    """The sidebar's memory cap (GiB per device)."""
    return float(st.session_state["memory_gib"])


def workload_key() -> tuple[Any, ...]:
    """What a tuned plan depends on: the profile, the workload size and the cluster layout."""
    ss = st.session_state
    key = (ss["profile_version"], int(ss["devices"]), int(ss["microbatches"]))
    lk = cluster_state.layout_key()
    return key if lk is None else (*key, lk)


def bound(name: str) -> str:
    """Widget key for persistent setting ``name`` (widget state is dropped on page switch)."""
    wk = f"_w_{name}"
    if wk not in st.session_state:
        st.session_state[wk] = st.session_state[name]
    return wk


def commit(name: str) -> None:
    st.session_state[name] = st.session_state[f"_w_{name}"]


def sidebar(page: str = "") -> None:
    """The workload controls shared by every page (the entrypoint draws them, with the
    page's URL path): profile, devices, micro-batches, memory cap, cluster, view settings;
    a refused upload and settings over the work cap are reported here on every page."""
    ss = st.session_state
    cluster_state.apply_pending()
    with st.sidebar:
        origins = {"sample": "sample", "upload": "uploaded", "edited": "edited", "plan": "plan"}
        origin = origins[ss["profile_origin"]]
        prof = base_profile()
        st.markdown(f"**Model:** {prof.name} ({origin}, {prof.num_layers} layers)")
        if ss.get("upload_error") and page != "profile":
            st.error(f"Profile upload refused: {ss['upload_error']} (pages use {prof.name})")
        st.number_input("devices", *LIMITS["devices"], key=bound("devices"), step=1)
        commit("devices")
        st.number_input("micro-batches", *LIMITS["microbatches"], key=bound("microbatches"))
        commit("microbatches")
        st.number_input(
            "memory cap (GiB per device)", 1.0, 4096.0, key=bound("memory_gib"), step=8.0
        )
        commit("memory_gib")
        gpus = "" if prof.device.gpus == 1 else f", {prof.device.gpus} GPUs per device (TP)"
        st.caption(
            f"{prof.device.name}: {prof.device.memory_gib:g} GiB, "
            f"{prof.device.p2p_gbps:g} GB/s links{gpus}; {prof.tokens_per_microbatch:,} tokens "
            "per micro-batch."
        )
        cluster_state.sidebar(prof, int(ss["devices"]))
        profile()  # checks the layout against this run's settings (sets ``cluster_error``)
        if ss.get("cluster_error"):
            st.error(ss["cluster_error"])
        err = work_error()
        if err and page in ("export", "layouts", "profile", "cluster"):  # pages that go on
            st.warning(err)
        st.divider()
        display.sidebar_controls()


def sync_query_params(extra: dict[str, str] | None = None) -> str:
    """Write the shareable settings (and a page's ``extra`` ones) into the URL; returns the
    query string, e.g. ``sample=nemotron-h-8b&devices=8&...``."""
    ss = st.session_state
    want = {
        "devices": str(ss["devices"]),
        "microbatches": str(ss["microbatches"]),
        "schedule": ss["schedule"],
        "chunks": str(ss["chunks"]),
        "partition": ss["partition"],
        "memory_gib": f"{float(ss['memory_gib']):g}",
    }
    if ss["profile_origin"] == "sample":
        want = {"sample": ss["sample"], **want}
    want |= cluster_state.query_values()
    if ss.get("critical"):
        want["critical"] = "1"
    if ss.get("img_format", "svg") != "svg":
        want["img"] = ss["img_format"]
    want |= extra or {}
    link = plan_link_text()
    if link:
        want["plan"] = link
    current = {k: st.query_params.get(k) for k in st.query_params}
    if current != want:
        st.query_params.from_dict(want)
    return "&".join(f"{k}={v}" for k, v in want.items())


def plan_link_text() -> str | None:
    """The ``plan=`` text of the Plan page's plan when it is a hand edit or a tuned plan
    (a peer plan needs none: its settings rebuild it), and the link is short enough."""
    ss = st.session_state
    if not _plan_is_edit():
        return None
    js = ss["plan_edit"]["plan"]
    hit = ss.get("_plan_link")
    if hit is None or hit[0] != js:
        hit = (js, plan_link.link_or_none(cached_plan(js)))
        ss["_plan_link"] = hit
    return hit[1]


def plan_shared_by_link() -> bool | None:
    """None: the Plan page's plan is a peer plan (the settings rebuild it); True: the URL
    carries it; False: too large for a link (share the file)."""
    if not _plan_is_edit():
        return None
    return plan_link_text() is not None


def _plan_is_edit() -> bool:
    """Whether the Plan page shows the session's hand-edited (or opened, or tuned) plan."""
    edit = st.session_state.get("plan_edit")
    return bool(
        edit
        and edit["settings"] == _plan_shape(settings())
        and edit["profile_version"] == st.session_state["profile_version"]
    )


# --------------------------------------------------------------------------------------------
# Cached computations (keyed on plain data: frozen profile, JSON plan, numbers)
@st.cache_data(show_spinner=False, max_entries=64, hash_funcs=HASH_FUNCS)
def _cached_peer(profile: Profile, s: Settings) -> str:
    guard.check_settings(s, profile.num_layers)
    return analysis.plan_json(analysis.peer_plan(profile, s))


def cached_peer(profile: Profile, s: Settings) -> str:
    """A peer plan as JSON (cached; the memory cap does not change a plan's shape)."""
    return _cached_peer(profile, _plan_shape(s))


@st.cache_resource(show_spinner=False, max_entries=24, hash_funcs=HASH_FUNCS)
def cached_sim(profile: Profile, plan_js: str, cap: float) -> dict[str, Any]:
    """Metrics, timeline and ``SimResult`` of a plan: one shared object per key, so
    **read-only** (a cached copy of a 65k-row timeline would cost more than the redraw
    budget)."""
    plan = cached_plan(plan_js)
    guard.check_plan(plan)
    res = simulate(profile, plan, cap)
    return {"metrics": analysis.summary_metrics(res), "timeline": res.timeline(), "result": res}


@st.cache_resource(show_spinner=False, max_entries=24)
def cached_plan(plan_js: str) -> Plan:
    """The parsed plan (shared: callers copy before changing it, as the edit helpers do)."""
    return analysis.plan_from_json(plan_js)


@st.cache_data(show_spinner=False, max_entries=24, hash_funcs=HASH_FUNCS)
def cached_memory_curves(profile: Profile, plan_js: str, cap: float) -> pd.DataFrame:
    """Memory (GiB) per device over time; computed only when a page shows it."""
    return cached_sim(profile, plan_js, cap)["result"].memory_curves()


@st.cache_data(show_spinner=False, max_entries=32, hash_funcs=HASH_FUNCS)
def cached_metrics(profile: Profile, plan_js: str, cap: float) -> dict[str, Any]:
    return cached_sim(profile, plan_js, cap)["metrics"]


@st.cache_data(show_spinner=False, max_entries=32, hash_funcs=HASH_FUNCS)
def cached_where(profile: Profile, plan_js: str, cap: float) -> dict[str, Any]:
    """Where the time goes (per-device breakdown frame), peak memory per device (GiB) and the
    critical path of a plan (see ``where``)."""
    return where.analyse(cached_sim(profile, plan_js, cap)["result"])


# The figure caches share one object per key, **read-only** (``display.chart`` draws a dark
# copy): a cached copy is a pickle and a re-validated figure on every rerun (0.05 s for a
# small chart, more than the redraw for a large Gantt).
@st.cache_resource(show_spinner=False, max_entries=32, hash_funcs=HASH_FUNCS)
def cached_where_figures(
    profile: Profile, plans: tuple[tuple[str, str], ...], cap: float
) -> tuple[go.Figure, go.Figure]:
    """Where the time goes, and peak memory per device against the cap, of ``plans``."""
    data = {n: cached_where(profile, js, cap) for n, js in plans}
    return (
        plots.where_time_figure({n: d["frame"] for n, d in data.items()}),
        plots.peak_memory_figure({n: d["peaks_gib"] for n, d in data.items()}, cap),
    )


@st.cache_resource(show_spinner=False, max_entries=32, hash_funcs=HASH_FUNCS)
def cached_gantt(
    profile: Profile,
    plans: tuple[tuple[str, str], ...],
    cap: float,
    max_bars: int,
    critical: bool = False,
) -> go.Figure:
    """The timelines of ``plans`` on one time axis: every device a lane (idle ones too), a
    device's later chunks hatched, and with ``critical`` the critical path highlighted."""
    sims = {name: cached_sim(profile, js, cap) for name, js in plans}
    x_max = max(float(s["metrics"]["step_time_ms"]) for s in sims.values())
    titled: dict[str, pd.DataFrame] = {}
    devices: dict[str, int] = {}
    paths: dict[str, list[charts.PathLink]] = {}
    for (name, js), s in zip(plans, sims.values(), strict=True):
        title = f"{name}: step {s['metrics']['step_time_ms']:,.1f} ms"
        plan = cached_plan(js)
        titled[title] = charts.with_chunks(s["timeline"], plan.placement)
        devices[title] = plan.num_devices
        if critical:
            paths[title] = cached_where(profile, js, cap)["path"]
    return charts.compare_gantt_figure(
        titled, max_bars=max_bars, x_max_ms=x_max, devices=devices, critical=paths
    )


@st.cache_resource(show_spinner=False, max_entries=32, hash_funcs=HASH_FUNCS)
def cached_memory(profile: Profile, plans: tuple[tuple[str, str], ...], cap: float) -> go.Figure:
    sims = {name: cached_sim(profile, js, cap) for name, js in plans}
    x_max = max(float(s["metrics"]["step_time_ms"]) for s in sims.values())
    curves = {name: cached_memory_curves(profile, js, cap) for name, js in plans}
    return charts.memory_figure(curves, cap, x_max_ms=x_max)


@st.cache_data(show_spinner=False, max_entries=32, hash_funcs=HASH_FUNCS)
def cached_baselines(
    profile: Profile, devices: int, mbs: int, chunks: int, cap: float
) -> PeerTable:
    guard.check_settings(
        Settings(devices=devices, microbatches=mbs, chunks=chunks), profile.num_layers
    )
    return peer_table(profile, devices, mbs, chunks, cap)


@st.cache_data(show_spinner=False, max_entries=16, hash_funcs=HASH_FUNCS)
def cached_sweep(
    profile: Profile, peers: tuple[str, ...], axis: str, values: tuple[int, ...], base: Settings
) -> pd.DataFrame:
    rows = []
    for key in peers:
        sched, part = analysis.split_peer_key(key)
        for v in values:
            try:  # a sweep over devices keeps the cluster layout (PP = v)
                prof_v = cluster_data.redeploy(profile, v) if axis == "devices" else profile
            except OctoPipeError:
                continue
            s = Settings(
                devices=v if axis == "devices" else base.devices,
                microbatches=v if axis == "microbatches" else base.microbatches,
                schedule=sched,
                chunks=base.chunks,
                partition=part,
                memory_gib=base.memory_gib,
            )
            try:
                guard.check_settings(s)  # points over the work cap are left out
                res = simulate(prof_v, analysis.peer_plan(prof_v, s), base.memory_gib)
            except OctoPipeError:
                continue
            m = analysis.summary_metrics(res)
            rows.append({"plan": key, axis: v, **{k: m[k] for k in analysis.METRIC_COLUMNS}})
    return pd.DataFrame(rows)


@st.cache_data(show_spinner=False, max_entries=8, hash_funcs=HASH_FUNCS)
def cached_job(profile: Profile, plan_js: str, folder: str) -> tuple[bytes, list[str]]:
    """The runnable job of a plan, zipped (see ``exporting.job_zip``)."""
    return exporting.job_zip(analysis.plan_from_json(plan_js), profile, folder)


# --------------------------------------------------------------------------------------------
# The plans a page can show
def peer_plan_js(key: str) -> str:
    """A peer plan (``schedule/partition``) at the current settings, as JSON."""
    sched, part = analysis.split_peer_key(key)
    return cached_peer(profile(), settings(sched, part))


def current_plan() -> Plan:
    """The Plan page's plan: the hand-edited one if it matches the settings, else the peer."""
    js = current_plan_js()
    return analysis.plan_from_json(js)


def current_plan_js() -> str:
    ss = st.session_state
    s = settings()
    edit = ss.get("plan_edit")
    if (
        edit
        and edit["settings"] == _plan_shape(s)
        and edit["profile_version"] == ss["profile_version"]
    ):
        return edit["plan"]
    return cached_peer(profile(), s)


def _plan_shape(s: Settings) -> Settings:
    """The settings a plan's shape depends on (the memory cap only changes its metrics)."""
    return dataclasses.replace(s, memory_gib=None)


def set_plan_edit(plan: Plan, source: str | None = None) -> None:
    """Make ``plan`` the Plan page's plan for the current settings (``source`` names where it
    came from when not from a hand edit)."""
    ss = st.session_state
    ss["plan_edit"] = {
        "settings": _plan_shape(settings()),
        "profile_version": ss["profile_version"],
        "plan": analysis.plan_json(plan),
        **({"source": source} if source else {}),
    }


def tuned_plan_js() -> str | None:
    t = st.session_state.get("tuned")
    if t and t["key"] == workload_key():
        return t["plan"]
    return None


def best_peer() -> PeerScore | None:
    """The fastest peer that fits the memory cap (or the fastest at all), by ``peer_table``."""
    s = settings()
    table = cached_baselines(profile(), s.devices, s.microbatches, s.chunks, memory_cap())
    return table.best() or table.best(fitting=False)


def fitting_peer(exclude: str | None = None) -> str | None:
    """The fastest peer (``schedule/partition``) that fits the memory cap, other than
    ``exclude``; None when none fits."""
    s = settings()
    table = cached_baselines(profile(), s.devices, s.microbatches, s.chunks, memory_cap())
    best = table.best(exclude=exclude)
    return best.key if best is not None else None


AUTO_TUNE_BUDGET_S = 3.0
AUTO_TUNE_MAX_SIZE = 16 * 64  # devices x micro-batches tuned on a first visit


@st.cache_data(show_spinner="tuning a plan (up to 3 s)…", max_entries=16, hash_funcs=HASH_FUNCS)
def cached_auto_tune(profile: Profile, devices: int, mbs: int, cap: float) -> str | None:
    """A quick tuner run (fixed seed and budget) for the landing page; None if unavailable."""
    tune, _ = tuning.load_tuner()
    if tune is None:
        return None
    try:
        res = tuning.call_tune(
            tune, profile, devices, mbs, cap, AUTO_TUNE_BUDGET_S, 0, lambda _p: None,
            stop_at_convergence=True,
        )  # fmt: skip
        plan = tuning.result_plan(res)
        if plan is None:
            return None
        analysis.validate(plan, profile.num_layers)
    except Exception:  # a failing tuner falls back to the best peer
        return None
    return analysis.plan_json(plan)


def auto_tuned_js() -> str | None:
    """The landing page's quick tuned plan, for workloads small enough to tune in seconds."""
    s = settings()
    if s.devices * s.microbatches > AUTO_TUNE_MAX_SIZE:
        return None
    if base_profile().num_layers > guard.MAX_TUNE_LAYERS:
        return None
    return cached_auto_tune(profile(), s.devices, s.microbatches, memory_cap())


def challenger() -> tuple[str, str] | None:
    """The plan shown against 1F1B by default: the session's tuned plan, else a quick tuned
    plan, else the best peer by ``peer_table``."""
    js = tuned_plan_js()
    if js:
        return "tuned", js
    js = auto_tuned_js()
    if js:
        return AUTO_TUNED, js
    best = best_peer()
    if best is None:
        return None
    return f"best peer: {best.key}", peer_plan_js(best.key)


def plan_choices() -> dict[str, str]:
    """Every plan the Compare and Export pages offer, name -> JSON (those that build)."""
    guard.check_settings(settings(), base_profile().num_layers)
    out: dict[str, str] = {}
    tuned = tuned_plan_js()
    if tuned:
        out["tuned"] = tuned
    auto = auto_tuned_js()
    if auto:
        out[AUTO_TUNED] = auto
    try:
        cur = current_plan_js()
        name = json.loads(cur).get("name", "")
        out[f"plan page: {name}"] = cur
    except OctoPipeError:
        pass
    for key in analysis.peer_keys():
        try:
            out[key] = peer_plan_js(key)
        except OctoPipeError:
            continue
    return out


def plan_metrics(plan_js: str) -> dict[str, Any]:
    return cached_metrics(profile(), plan_js, float(st.session_state["memory_gib"]))


def peer_options() -> list[str]:
    return [f"{s}/{p}" for s in SCHEDULES for p in PARTITIONS]
