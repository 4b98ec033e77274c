"""The session's cluster and layout: state keys, URL parameters and the sidebar controls.

Keys of ``st.session_state``:

* ``cluster``: ``"none"`` (flat network, the default: every page behaves as without clusters),
  a bundled sample's name, or ``"custom"`` (then ``cluster_custom`` holds the uploaded or
  edited ``Cluster``);
* ``dp``, ``zero1``, ``order``: the layout beside the sidebar's devices (PP) and the profile's
  ``device.gpus`` (TP);
* ``cluster_error``: why the layout does not fit (pages then simulate the flat network).

The URL carries ``cluster`` (a sample), ``dp``, ``zero1`` and ``order``.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from app.components import cluster_data
from app.components.cluster_data import CUSTOM, NONE
from octopipe_core.cluster import Cluster, list_cluster_samples, load_cluster_sample
from octopipe_core.errors import OctoPipeError
from octopipe_core.layout import ORDERS
from octopipe_core.profile import Profile

DEFAULTS: dict[str, Any] = {"cluster": NONE, "dp": 1, "zero1": False, "order": ORDERS[0]}
QUERY_KEYS = ("cluster", "dp", "zero1", "order")


@st.cache_data(show_spinner=False, max_entries=8)
def cached_cluster_sample(name: str) -> Cluster:
    return load_cluster_sample(name)


def parse_param(key: str, raw: str) -> Any:
    """One URL parameter's value; ValueError (with the fix) when it is not usable."""
    if key == "cluster":
        names = list_cluster_samples()
        if raw != NONE and raw not in names:
            raise ValueError(f"use {NONE} or one of {', '.join(names)}")
        return raw
    if key == "zero1":
        return cluster_data.parse_bool(raw)
    if key == "order":
        if raw not in ORDERS:
            raise ValueError(f"use one of {', '.join(ORDERS)}")
        return raw
    v = int(raw)
    if not 1 <= v <= cluster_data.MAX_DP:
        raise ValueError(f"use 1..{cluster_data.MAX_DP}")
    return v


def current() -> Cluster | None:
    """The picked cluster, or None for the flat network."""
    ss = st.session_state
    name = ss.get("cluster", NONE)
    if name == NONE:
        return None
    if name == CUSTOM:
        c: Cluster | None = ss.get("cluster_custom")
        return c
    return cached_cluster_sample(name)


def set_custom(c: Cluster) -> None:
    """Use an uploaded or edited cluster (then ``st.rerun()``, or call it in a callback)."""
    ss = st.session_state
    ss["cluster_custom"] = c
    set_value("cluster", CUSTOM)


def set_value(name: str, value: Any) -> None:
    """Set a sidebar setting from a page: the sidebar widget takes it at its next draw (so
    follow with ``st.rerun()``, or call it in a callback)."""
    st.session_state[name] = value
    st.session_state.setdefault("_pending", {})[name] = value


def apply_pending() -> None:
    """Give the sidebar widgets the values pages set (before the widgets are drawn)."""
    ss = st.session_state
    for name, value in ss.pop("_pending", {}).items():
        ss[f"_w_{name}"] = value


def layout_key() -> tuple[Any, ...] | None:
    """What a simulation depends on beyond the profile and the plan (None: flat network)."""
    ss = st.session_state
    c = current()
    if c is None:
        return None
    return (cluster_data.cluster_key(c), int(ss["dp"]), bool(ss["zero1"]), ss["order"])


def deployed(base: Profile, version: int, devices: int) -> Profile:
    """``base`` on the picked cluster and layout (memoised per session); ``base`` itself for
    the flat network or when the layout does not fit (``cluster_error`` then says why)."""
    ss = st.session_state
    lk = layout_key()
    if lk is None:
        ss.pop("cluster_error", None)
        return base
    key = (version, devices, lk)
    hit = ss.get("_deployed")
    if hit is None or hit[0] != key:
        c = current()
        assert c is not None
        try:
            prof = cluster_data.deployed(base, c, devices, lk[1], lk[2], lk[3])
            err = None
        except OctoPipeError as e:
            prof, err = base, str(e)
        hit = (key, prof, err)
        ss["_deployed"] = hit
    if hit[2]:
        ss["cluster_error"] = hit[2]
    else:
        ss.pop("cluster_error", None)
    return hit[1]  # type: ignore[no-any-return]


def query_values() -> dict[str, str]:
    """The URL parameters of the cluster and layout (none for the flat network or a custom
    cluster, which a URL cannot carry)."""
    ss = st.session_state
    name = ss.get("cluster", NONE)
    if name in (NONE, CUSTOM):
        return {}
    return {
        "cluster": name,
        "dp": str(int(ss["dp"])),
        "zero1": "1" if ss["zero1"] else "0",
        "order": ss["order"],
    }


def _labels(options: list[str]) -> dict[str, str]:
    custom = st.session_state.get("cluster_custom")
    names = {NONE: "none (flat network)", CUSTOM: f"custom: {getattr(custom, 'name', '')}"}
    return {o: names.get(o, o) for o in options}


def sidebar(profile: Profile, devices: int) -> None:
    """The cluster picker and the layout (DP, ZeRO-1, rank order), under devices and
    micro-batches. Call inside ``with st.sidebar``."""
    ss = st.session_state
    options = [NONE, *list_cluster_samples()]
    if ss.get("cluster_custom") is not None:
        options.append(CUSTOM)
    for name in ("cluster", "dp", "zero1", "order"):
        ss.setdefault(f"_w_{name}", ss[name])
    if ss["_w_cluster"] not in options:
        ss["_w_cluster"] = NONE
    labels = _labels(options)
    st.selectbox(
        "cluster",
        options,
        format_func=labels.__getitem__,
        key="_w_cluster",
        help="Upload or edit a cluster on the Cluster page. 'none' plans one pipeline on the "
        "profile's flat link.",
    )
    ss["cluster"] = ss["_w_cluster"]
    c = current()
    if c is None:
        return
    tp = profile.device.gpus
    st.number_input(
        "DP (pipeline replicas)", 1, cluster_data.MAX_DP, key="_w_dp", step=1,
        help="Identical pipelines; each stage's gradients are reduced over its DP group.",
    )  # fmt: skip
    ss["dp"] = int(ss["_w_dp"])
    st.checkbox(
        "ZeRO-1 (optimizer state sharded over DP)",
        key="_w_zero1",
        help="Reduce-scatter of gradients, then all-gather of parameters; optimizer memory / DP.",
    )
    ss["zero1"] = bool(ss["_w_zero1"])
    st.selectbox(
        "rank order",
        list(ORDERS),
        format_func=lambda o: cluster_data.ORDER_LABELS[o],
        key="_w_order",
    )
    ss["order"] = ss["_w_order"]
    gpus = tp * devices * int(ss["dp"])
    st.caption(
        f"TP {tp} (the profile's device.gpus, read-only) × PP {devices} (devices) × DP "
        f"{ss['dp']} = {gpus:,} of {c.total_gpus:,} GPUs."
    )
