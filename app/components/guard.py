"""The work one dashboard request may do (no Streamlit here).

One Streamlit process serves every session, so a single heavy request (say 59 devices x
1,000 micro-batches, every peer simulated) slows every other session. Each page therefore
refuses, up front and with the figure that is too large, settings whose plans would pass
``octopipe_core.limits.MAX_DASHBOARD_OPS`` ops per simulation (a twentieth of what the
command line accepts). The worst plan a page builds at given settings has
``devices x max(2, chunks)`` stages (interleaved, or a V shape's two per device).

The layer count is capped too, lower than a profile file may hold (20,000): a balanced
partition costs time that grows faster than the square of the layer count (0.7 s for 1,000
layers on 8 devices, and every page builds up to seven of them), so plan pages take profiles
of up to :data:`MAX_LAYERS` layers; and the tuner overruns a short budget on long models
(3.9 s for a 3 s budget at 120 layers, 13 s at 200, 40 s at 300), so the Tune page and the
Overview's quick tune take up to :data:`MAX_TUNE_LAYERS`.

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

__all__ = [
    "MAX_DASHBOARD_OPS",
    "MAX_LAYERS",
    "MAX_TUNE_LAYERS",
    "OctoPipeError",
    "check_layers",
    "check_plan",
    "check_settings",
    "max_stages",
]


MAX_LAYERS = 1_000
MAX_TUNE_LAYERS = 200


def check_layers(num_layers: int, what: str = "plan pages", limit: int = MAX_LAYERS) -> None:
    """Refuse a profile longer than the dashboard's ``limit`` layers for ``what``.

    >>> check_layers(54)
    >>> try:
    ...     check_layers(19_999)
    ... except OctoPipeError as e:
    ...     print(str(e)[:72])
    profile: 19,999 layers is over the 1,000 the dashboard's plan pages take
    """
    if num_layers > limit:
        raise OctoPipeError(
            f"profile: {num_layers:,} layers is over the {limit:,} the dashboard's {what} take "
            "(balanced partitions and the tuner grow faster than the square of the layer "
            "count); fix: the command line (octopipe simulate/tune) takes up to 20,000, or "
            "merge repeated layers into blocks"
        )


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


def check_settings(s: Settings, num_layers: int | None = None) -> None:
    """Refuse settings whose largest plan is over the dashboard's work cap (and, given
    ``num_layers``, a profile over :data:`MAX_LAYERS`)."""
    if num_layers is not None:
        check_layers(num_layers)
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
