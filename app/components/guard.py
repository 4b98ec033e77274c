"""The work one dashboard request may do (no Streamlit here).

One Streamlit process serves every session, so a single heavy request (say 59 devices x
1,000 micro-batches, every peer simulated) slows every other session. Each page therefore
refuses, up front and with the figure that is too large, settings whose plans would pass
``octopipe_core.limits.MAX_DASHBOARD_OPS`` ops per simulation (a twentieth of what the
command line accepts). The worst plan a page builds at given settings has
``devices x max(2, chunks)`` stages (interleaved, or a V shape's two per device).

>>> from app.components.analysis import Settings
>>> check_settings(Settings(devices=8, microbatches=32))
>>> try:
...     check_settings(Settings(devices=59, microbatches=1000))
... except OctoPipeError as e:
...     print(str(e)[:63])
these settings: 118 stages x 1,000 micro-batches is 590,000 ops
"""

from __future__ import annotations

from app.components.analysis import Settings
from octopipe_core.errors import OctoPipeError
from octopipe_core.limits import MAX_DASHBOARD_OPS, MAX_SIMULATE_OPS, check_size
from octopipe_core.plan import Plan

__all__ = ["MAX_DASHBOARD_OPS", "OctoPipeError", "check_plan", "check_settings", "max_stages"]


def max_stages(s: Settings) -> int:
    """Stages of the largest plan a page builds at settings ``s``."""
    return s.devices * max(2, s.chunks)


def _fix(stages: int, devices: int) -> str:
    fit = max(1, MAX_DASHBOARD_OPS // (5 * stages))
    return (
        f"at most {fit:,} micro-batches at {devices} devices here (the dashboard serves every "
        f"session from one process), or the command line (octopipe simulate/tune, up to "
        f"{MAX_SIMULATE_OPS:,} ops)"
    )


def check_settings(s: Settings) -> None:
    """Refuse settings whose largest plan is over the dashboard's work cap."""
    stages = max_stages(s)
    check_size(
        stages,
        s.microbatches,
        "these settings",
        limit=MAX_DASHBOARD_OPS,
        fix=_fix(stages, s.devices),
    )


def check_plan(plan: Plan) -> None:
    """Refuse a plan (tuned, hand-edited, opened from a file or a link) over the cap."""
    check_size(
        plan.num_stages,
        plan.num_microbatches,
        f"plan {plan.name or '(unnamed)'}",
        limit=MAX_DASHBOARD_OPS,
        fix=_fix(plan.num_stages, plan.num_devices),
    )
