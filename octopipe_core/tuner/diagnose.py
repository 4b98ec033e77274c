"""Where the step time goes: the gap to the lower bound split by the phase that can cut it.

With ``busy_d`` the compute time of device ``d`` and ``d*`` the busiest device,
``step - lower_bound = (busy_d* - mean busy) + idle_d*`` exactly. The tuner reads:

* **imbalance** ``busy_d* - mean busy``: the partition phase's target;
* **boundary** idle of ``d*`` before its first and after its last action (start-up and drain
  bubbles): the placement phase's target;
* **interior** idle of ``d*`` between its actions: the schedule phase's target; the part of it
  spent waiting for a transfer is reported as **comm**.

``explain_gap`` turns the same numbers into a one-line "why" for plans far from the bound.

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> from octopipe_core.schedules import build_plan
>>> from octopipe_core.simulator import simulate
>>> prof = Profile.from_dict(example_profile_dict())
>>> b = bubble_breakdown(simulate(prof, build_plan(prof, "1f1b", 2, 4)))
>>> sorted(b)
['boundary', 'comm', 'imbalance', 'interior']
"""

from __future__ import annotations

from octopipe_core.bounds import granularity_bound
from octopipe_core.layout_bound import LayoutBound
from octopipe_core.plan import Action
from octopipe_core.simulator import SimResult

__all__ = ["bubble_breakdown", "explain_gap", "granularity_bound"]


def bubble_breakdown(r: SimResult) -> dict[str, float]:
    """Split ``step - lower_bound`` (ms) into imbalance, boundary and interior idle, and comm."""
    D = r.num_devices
    busy = r.busy_ms()
    mean = sum(busy) / max(1, D)
    dstar = max(range(D), key=lambda d: busy[d])
    t0 = min(r.start_ms) if r.start_ms else 0.0
    step = r.step_time_ms
    starts = [s for (d, _), s in zip(r.ops, r.start_ms, strict=True) if d == dstar]
    ends = [e for (d, _), e in zip(r.ops, r.end_ms, strict=True) if d == dstar]
    acts = [a for d, a in r.ops if d == dstar]
    if not starts:
        return {"imbalance": busy[dstar] - mean, "boundary": step, "interior": 0.0, "comm": 0.0}
    boundary = (starts[0] - t0) + (t0 + step - ends[-1])
    interior = step - busy[dstar] - boundary
    arrive: dict[Action, tuple[float, float]] = {}
    for _src, dst, _p, cons, ts, te in r.transfers:
        if dst == dstar:
            arrive[cons] = (ts, te)
    comm = 0.0
    for k in range(1, len(starts)):
        gap = starts[k] - ends[k - 1]
        if gap > 1e-9 and acts[k] in arrive:
            ts, te = arrive[acts[k]]
            if abs(te - starts[k]) < 1e-9:
                comm += min(gap, te - ts)
    return {
        "imbalance": max(0.0, busy[dstar] - mean),
        "boundary": max(0.0, boundary),
        "interior": max(0.0, interior),
        "comm": comm,
    }


def explain_gap(
    r: SimResult,
    *,
    balance_ms: float | None = None,
    granularity_ms: float | None = None,
    uncapped_step_ms: float | None = None,
    layout: LayoutBound | None = None,
    threshold: float = 0.05,
) -> str:
    """A short "why" for a plan more than ``threshold`` above the lower bound ('' otherwise).

    ``balance_ms`` is the smallest busiest-device compute of the device splits the tuner
    found (layers are indivisible, so the bound may be out of reach), ``granularity_ms`` the
    proven floor of ``granularity_bound``; ``uncapped_step_ms`` the best step time found for
    the same layout without a memory cap; ``layout`` the layout bound (no schedule of the
    plan's partition and placement does better, ``layout_bound.py``): the step above it is
    the schedule's share.
    """
    lb, step = r.lower_bound_ms, r.step_time_ms
    if lb <= 0 or step <= lb * (1 + threshold):
        return ""
    b = bubble_breakdown(r)
    gap = step - lb
    parts = []
    if b["imbalance"] > 0.2 * gap:
        busiest = lb + b["imbalance"]
        if balance_ms is not None and busiest <= balance_ms * 1.002 + 1e-6:
            proven = ""
            if granularity_ms is not None and granularity_ms > lb * 1.001:
                proven = (
                    f" (any split needs >= {granularity_ms:.0f} ms, "
                    f"+{100 * (granularity_ms / lb - 1):.1f}%)"
                )
            parts.append(
                f"granularity: layers are indivisible; the best device split found puts "
                f"{balance_ms:.0f} ms of compute on the busiest device, "
                f"{100 * (balance_ms / lb - 1):.1f}% over the mean{proven}"
            )
        else:
            parts.append(
                f"imbalance: the busiest device has {b['imbalance']:.0f} ms more compute than "
                f"the mean"
            )
    fill = b["boundary"]
    if fill > 0.2 * gap:
        parts.append(f"fill/drain: {fill:.0f} ms idle at start-up and drain on the busiest device")
    if b["interior"] > 0.2 * gap:
        parts.append(f"bubbles: {b['interior']:.0f} ms idle between actions")
    if b["comm"] > 0.1 * gap:
        parts.append(f"communication: {b['comm']:.0f} ms waiting on transfers")
    if layout is not None and layout.ms > 0:
        pct = layout.gap_pct(step)
        above = "the" if pct < 0.05 else f"{pct:.1f}% above the"
        parts.append(
            f"schedule: {above} least step any schedule of this layout reaches ({layout.ms:.0f} ms)"
        )
    if uncapped_step_ms is not None and uncapped_step_ms < step * 0.99:
        parts.append(
            f"memory: without the {r.memory_cap_gib:g} GiB cap the same layout reaches "
            f"{uncapped_step_ms:.0f} ms"
        )
    elif max(r.peak_memory_gib) > 0.97 * r.memory_cap_gib:
        parts.append(f"memory: peak {max(r.peak_memory_gib):.1f} GiB at the cap")
    return "; ".join(parts) or f"{100 * (step / lb - 1):.1f}% over the bound"
