"""Open a plan file on the Plan page: the download-and-open way to share a tuned or
hand-edited plan (the other is a link, ``plan_link``).

A plan file (``octopipe.plan/v1``, as the Plan, Tune and Export pages download it or
``octopipe tune --out`` writes it) usually embeds its profile; the profile then becomes the
session's, and the plan's devices and micro-batches the sidebar's. A file without a profile
opens on the session's profile when its layers fit. Every problem is one line in the page.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from app.components import cluster_state, guard, state, uploads
from octopipe_core.jsonio import loads_checked
from octopipe_core.plan import Plan, plan_from_dict, validate_plan
from octopipe_core.profile import Profile


def read_plan_file(raw: bytes, name: str, fallback: Profile) -> tuple[Plan, Profile | None]:
    """The plan of an uploaded file and its embedded profile (None: use ``fallback``), both
    validated; OctoPipeError (one line) otherwise."""
    data: Any = loads_checked(raw, name)
    plan = plan_from_dict(data, name)
    prof = None
    if isinstance(data, dict) and "profile" in data:
        prof = Profile.from_dict(data["profile"], f"{name}#profile")
    validate_plan(plan, (prof or fallback).num_layers, src=name)
    guard.check_plan(plan)
    if plan.deployment is not None:
        plan.deployment.check(plan.num_devices, (prof or fallback).device.gpus, f"{name}#layout")
    return plan, prof


def _apply(plan: Plan, prof: Profile | None, name: str) -> None:
    ss = st.session_state
    if prof is not None:
        state.set_profile(prof, "plan")
    for key, value in (("devices", plan.num_devices), ("microbatches", plan.num_microbatches)):
        cluster_state.set_value(key, value)
    cap = plan.meta.get("memory_cap_gib")
    if cap is not None:
        cluster_state.set_value("memory_gib", float(cap))
    dep = plan.deployment
    if dep is not None:
        cluster_state.set_custom(dep.cluster)
        for key, value in (("dp", dep.layout.dp), ("zero1", dep.layout.zero1)):
            cluster_state.set_value(key, value)
        cluster_state.set_value("order", dep.layout.order)
    elif ss.get("cluster") != "none":
        cluster_state.set_value("cluster", "none")
    state.set_plan_edit(plan, source=f"file {name}")


def open_plan_file() -> None:
    """The uploader; a good file becomes the Plan page's plan, a bad one a one-line error."""
    ss = st.session_state
    with st.expander("Open a plan file (a plan someone shared, or one you downloaded)"):
        up = st.file_uploader(
            "plan JSON (octopipe.plan/v1, profile embedded or not)",
            type=["json"],
            key=f"plan_upload_{ss.get('plan_upload_ver', 0)}",
        )
        if up is None:
            uploads.forget("plan_upload")
            return
        got = uploads.parse_new(
            up, "plan_upload", lambda raw, name: read_plan_file(raw, name, state.base_profile())
        )
        if got is not None:
            _apply(*got, up.name)
            ss["plan_upload_ver"] = ss.get("plan_upload_ver", 0) + 1
            ss.pop("plan_upload_token", None)
            st.rerun()
        uploads.show_error("plan_upload")
