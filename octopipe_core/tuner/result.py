"""What the tuner returns and reports: progress events, the result and its summary.

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> from octopipe_core.tuner import tune
>>> r = tune(Profile.from_dict(example_profile_dict()), 2, 4, time_budget_s=0.5)
>>> sorted(k for k in r.to_dict() if "bound" in k)[:3]
['best_bound', 'best_bound_ms', 'bounds']
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from octopipe_core.bounds import Bounds, plan_bounds
from octopipe_core.layout_bound import LayoutBound, plan_layout_bound
from octopipe_core.peers import TUNE_METRICS, PeerTable
from octopipe_core.plan import Plan
from octopipe_core.simulator import SimResult
from octopipe_core.tuner.diagnose import explain_gap
from octopipe_core.tuner.evaluate import Candidate, Evaluator
from octopipe_core.tuner.layouts import FAMILIES, device_loads, family_placement
from octopipe_core.tuner.list_scheduler import POLICIES, list_schedule
from octopipe_core.tuner.moves_placement import family_of


class TuneProgress(NamedTuple):
    """What the progress callback receives after each iteration (``move`` is the accepted
    move, '' if the phase found none; ``plan`` the best plan so far: read it, do not modify
    it; ``best_bound_ms`` the strongest lower bound, 0 if unknown). A callback that returns
    True stops the search, which returns its best plan."""

    iteration: int
    phase: str
    best_step_time_ms: float
    elapsed_s: float
    fits_memory: bool
    move: str
    plan: Plan | None = None
    best_bound_ms: float = 0.0


ProgressFn = Callable[[TuneProgress], Any]


@dataclass
class TuneResult:
    """The tuned plan, its simulation, the peers it was compared with and how it was found."""

    plan: Plan
    result: SimResult
    memory_cap_gib: float
    iterations: int
    evaluations: int
    search_time_s: float
    time_to_best_s: float
    converged: bool
    start: str
    start_step_time_ms: float
    baselines: PeerTable
    # the least step any schedule of the plan's layout reaches (``layout_bound.py``): the
    # step above it is the schedule's share of the gap
    layout_bound: LayoutBound
    history: list[dict[str, Any]] = field(default_factory=list)
    shortfall: dict[str, Any] | None = None
    why: str = ""
    balance_ms: float = 0.0
    granularity_ms: float = 0.0
    bounds: Bounds | None = None
    stop_reason: str = ""
    # the best plans of other layouts the climbs reached, fastest first (``search.runners_up``)
    runners_up: list[Plan] = field(default_factory=list)

    @property
    def step_time_ms(self) -> float:
        return self.result.step_time_ms

    @property
    def lower_bound_ms(self) -> float:
        return self.result.lower_bound_ms

    @property
    def best_bound_ms(self) -> float:
        """The strongest lower bound that holds for every plan (``bounds.py``)."""
        return self.bounds.best_ms if self.bounds is not None else self.lower_bound_ms

    @property
    def gap_to_best_bound_pct(self) -> float:
        """How far the tuned step is above ``best_bound_ms``, in %."""
        b = self.best_bound_ms
        return 100.0 * (self.step_time_ms / b - 1.0) if b > 0 else 0.0

    @property
    def fits_memory(self) -> bool:
        return self.result.fits_memory

    @property
    def peak_memory_gib(self) -> list[float]:
        return self.result.peak_memory_gib

    def best_peer(self, fitting: bool = True) -> tuple[str, float] | None:
        """The fastest peer plan (that fits the cap when ``fitting``), as (key, step ms)."""
        best = self.baselines.best(fitting)
        if best is None or best.step_time_ms is None:
            return None
        return best.key, best.step_time_ms

    def speedup_over(self, key: str) -> float | None:
        """Peer step time / tuned step time (None if the peer could not be built)."""
        peer_ms = self.baselines.step_ms(key)
        if peer_ms is None or self.step_time_ms <= 0:
            return None
        return peer_ms / self.step_time_ms

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (the ``octopipe tune --json`` object, minus the plan path)."""
        bp = self.best_peer()
        lb = self.layout_bound
        return {
            "step_time_ms": round(self.step_time_ms, 6),
            "lower_bound_ms": round(self.lower_bound_ms, 6),
            "gap_to_bound": round(self.step_time_ms / self.lower_bound_ms - 1, 6)
            if self.lower_bound_ms > 0
            else None,
            "best_bound_ms": round(self.best_bound_ms, 6),
            "best_bound": self.bounds.best_name if self.bounds is not None else "total",
            "gap_to_best_bound_pct": round(self.gap_to_best_bound_pct, 4),
            "bounds": self.bounds.to_dict() if self.bounds is not None else None,
            "layout_bound_ms": round(lb.ms, 6),
            "gap_to_layout_bound_pct": round(lb.gap_pct(self.step_time_ms), 4),
            "layout_bound": lb.describe(),
            "fits_memory": self.fits_memory,
            "memory_cap_gib": self.memory_cap_gib,
            "peak_memory_gib": [round(x, 4) for x in self.peak_memory_gib],
            "shortfall": self.shortfall,
            "search_time_s": round(self.search_time_s, 3),
            "time_to_best_s": round(self.time_to_best_s, 3),
            "iterations": self.iterations,
            "evaluations": self.evaluations,
            "converged": self.converged,
            "stop_reason": self.stop_reason,
            "start": self.start,
            "start_step_time_ms": round(self.start_step_time_ms, 6),
            "best_peer": bp[0] if bp else None,
            "speedup_vs_1f1b_uniform": _r(self.speedup_over("1f1b/uniform")),
            "speedup_vs_best_peer": _r(bp[1] / self.step_time_ms) if bp else None,
            "why": self.why,
            "balance_found_ms": round(self.balance_ms, 6),
            "granularity_bound_ms": round(self.granularity_ms, 6),
            "stages": self.plan.num_stages,
            "partition": [list(r) for r in self.plan.partition],
            "placement": list(self.plan.placement),
            "history": self.history,
            "baselines": self.baselines.to_json(TUNE_METRICS),
        }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def balance_bound(ev: Evaluator, plan: Plan | None = None) -> float:
    """Smallest busiest-device compute (ms) among the device-balanced partitions of every
    layout family (and ``plan``): how close indivisible layers let the load get to the mean."""
    best = float("inf")
    layouts = []
    for fam in FAMILIES:
        place = family_placement(fam, ev.devices)
        if len(place) <= ev.profile.num_layers:
            layouts.append((ev.family_partition(fam), place))
    if plan is not None:
        layouts.append((plan.partition, plan.placement))
    for part, place in layouts:
        best = min(best, max(device_loads(ev.weights, part, place, ev.devices)))
    return best * ev.microbatches


def _finish(
    ev: Evaluator,
    inc: Candidate,
    baselines: PeerTable,
    history: list[dict[str, Any]],
    iterations: int,
    search_time: float,
    t_best: float,
    converged: bool,
    start: str,
    start_ms: float,
    bounds: Bounds | None = None,
    stop_reason: str = "",
) -> TuneResult:
    """The :class:`TuneResult` of a search that ended on ``inc``."""
    plan = inc.plan.copy()
    plan.name = "octopipe-tuned"
    fam = family_of(plan.placement, ev.devices)
    plan.meta = {
        "memory_cap_gib": ev.cap_gib,
        "tuner": {
            "start": start,
            "layout": fam or "irregular",
            "policy": inc.policy.name if inc.policy else None,
            "iterations": iterations,
        },
    }
    r = inc.result
    r.plan = plan
    shortfall: dict[str, Any] | None = None
    if not inc.fits:
        d = max(range(ev.devices), key=lambda d: r.peak_memory_gib[d])
        shortfall = {
            "device": d,
            "gib": round(r.peak_memory_gib[d] - ev.cap_gib, 4),
            "message": f"no plan found fits {ev.cap_gib:g} GiB: device {d} needs "
            f"{r.peak_memory_gib[d]:.2f} GiB ({r.peak_memory_gib[d] - ev.cap_gib:.2f} GiB short)",
        }
    balance = balance_bound(ev, plan)
    unc = None
    if r.step_time_ms > r.lower_bound_ms * 1.05:  # explain_gap only explains such plans
        costs = ev.costs(plan.partition, plan.recompute)
        lr = list_schedule(costs, plan.placement, ev.devices, ev.microbatches, None, POLICIES[0])
        unc = None if lr is None else lr.makespan_ms
    if bounds is None:
        bounds = plan_bounds(ev.profile, ev.devices, ev.microbatches)
    gran = bounds.granularity_ms
    lb = plan_layout_bound(r.profile, plan)
    why = explain_gap(r, balance_ms=balance, granularity_ms=gran, uncapped_step_ms=unc, layout=lb)
    if shortfall:
        why = str(shortfall["message"]) + ("; " + why if why else "")
    return TuneResult(
        plan=plan,
        result=r,
        memory_cap_gib=ev.cap_gib,
        iterations=iterations,
        evaluations=ev.evaluations,
        search_time_s=search_time,
        time_to_best_s=t_best,
        converged=converged,
        start=start,
        start_step_time_ms=start_ms,
        baselines=baselines,
        layout_bound=lb,
        history=history,
        shortfall=shortfall,
        why=why,
        balance_ms=balance,
        granularity_ms=gran,
        bounds=bounds,
        stop_reason=stop_reason,
    )
