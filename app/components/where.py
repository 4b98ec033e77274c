"""Where a simulated step's time goes, as the dashboard draws it (no Streamlit here).

:func:`analyse` turns a ``SimResult`` into plain data: the per-device breakdown of
``octopipe_core.breakdown.time_breakdown`` as a table, each device's peak memory (GiB) and the
critical path as ``charts.PathLink`` rows of the timeline.

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> from octopipe_core.schedules import build_plan
>>> from octopipe_core.simulator import simulate
>>> prof = Profile.from_dict(example_profile_dict())
>>> r = simulate(prof, build_plan(prof, "1f1b", 2, 4))
>>> a = analyse(r)
>>> list(a["frame"]["device"]), abs(a["bubble_ratio"] - r.bubble_ratio) < 1e-6
([0, 1], True)
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from app.components.charts import PathLink
from app.components.plots import TIME_PARTS, bubble_ratio
from octopipe_core.breakdown import critical_path, time_breakdown
from octopipe_core.layout_bound import plan_layout_bound
from octopipe_core.simulator import SimResult

TIME_DEFINITIONS = (
    "Each device's step splits into busy compute; fill (idle before its first op, the "
    "pipeline's start-up); waiting on transfers (idle while an activation or gradient it needs "
    "is on the wire); idle between ops for other reasons (waiting on another device's compute "
    "or a memory-gated order); and drain (idle after its last op until the step ends, the "
    "data-parallel tail included on a cluster). Bubble ratio = idle device time / (devices × "
    "step time), the zero-bubble paper's convention."
)


def analyse(result: SimResult) -> dict[str, Any]:
    """Breakdown frame (one row per device, ms), bubble ratio, peak memory per device (GiB),
    memory cap (GiB) and the critical path of ``result``."""
    rows = [r.to_dict() for r in time_breakdown(result)]
    cols = ["device", *(c for c, _, _ in TIME_PARTS), "bubble_ratio"]
    frame = pd.DataFrame(rows, columns=cols)
    path = [
        PathLink(p.kind, p.device, p.label, p.start_ms, p.end_ms, p.op)
        for p in critical_path(result)
    ]
    return {
        "frame": frame,
        "layout_bound": plan_layout_bound(result.profile, result.plan),
        "step_ms": float(result.step_time_ms),
        "bubble_ratio": bubble_ratio(frame),
        "peaks_gib": [float(x) for x in result.peak_memory_gib],
        "cap_gib": float(result.memory_cap_gib),
        "path": path,
    }


def layout_line(name: str, data: dict[str, Any]) -> str:
    """How far a plan's schedule is above its layout bound (``octopipe_core.layout_bound``).

    >>> from octopipe_core.layout_bound import LayoutBound
    >>> line = layout_line("x", {"layout_bound": LayoutBound(100, 2, 5, "work"), "step_ms": 103})
    >>> line.split("; ")[1], line.startswith("x: any schedule of its layout needs >= 100.0 ms")
    ('this schedule is +3.00%', True)
    """
    lb = data["layout_bound"]
    return (
        f"{name}: any schedule of its layout needs >= {lb.ms:,.1f} ms (device {lb.device}'s "
        f"stages from {lb.stage} on); this schedule is {lb.gap_pct(data['step_ms']):+.2f}%"
    )


def path_summary(path: list[PathLink]) -> str:
    """One line on a critical path: how many ops and transfers, and its devices.

    >>> path_summary([PathLink("op", 0, "0F0", 0, 1, 0), PathLink("transfer", 1, "0F0 -> d1",
    ...     1, 2, 3), PathLink("op", 1, "1F0", 2, 3, 3)])
    'critical path: 2 ops and 1 transfer over d0, d1, 0.0-3.0 ms'
    """
    ops = [p for p in path if p.kind == "op"]
    xfers = len(path) - len(ops)
    if not ops:
        return "critical path: empty"
    devs = ", ".join(f"d{d}" for d in sorted({p.device for p in ops}))
    s = "" if xfers == 1 else "s"
    return (
        f"critical path: {len(ops)} ops and {xfers} transfer{s} over {devs}, "
        f"{path[0].start_ms:.1f}-{path[-1].end_ms:.1f} ms"
    )
