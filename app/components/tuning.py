"""Adapter between the Tune page and ``octopipe_core.tuner.tune`` (no Streamlit here).

It turns the tuner's ``TuneProgress`` reports into :class:`Progress` (phase, best step time,
share of the time budget used, and the best plan so far, which is what "Stop" keeps).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from octopipe_core.plan import Plan
from octopipe_core.profile import Profile


@dataclass
class Progress:
    phase: str = ""
    best_step_ms: float | None = None
    fraction: float | None = None
    plan: Plan | None = None
    message: str = ""


def load_tuner() -> tuple[Callable[..., Any] | None, str]:
    """``(tune, "")`` or ``(None, why)`` when the tuner cannot be imported."""
    try:
        from octopipe_core.tuner import tune
    except ImportError as e:
        return None, f"the tuner is not available ({e})"
    return tune, ""


def too_long_to_tune(num_layers: int) -> str | None:
    """Why the dashboard does not tune a profile this long (None: it does)."""
    from app.components import guard

    try:
        guard.check_layers(num_layers, "Tune page", guard.MAX_TUNE_LAYERS)
    except guard.OctoPipeError as e:
        return str(e)
    return None


def from_report(report: Any, budget_s: float) -> Progress:
    """One ``TuneProgress`` as a :class:`Progress` (the fraction is of the time budget)."""
    frac = None if budget_s <= 0 else max(0.0, min(1.0, report.elapsed_s / budget_s))
    return Progress(
        phase=report.phase,
        best_step_ms=float(report.best_step_time_ms),
        fraction=frac,
        plan=report.plan.copy() if report.plan is not None else None,
        message=report.move,
    )


def call_tune(
    tune: Callable[..., Any],
    profile: Profile,
    devices: int,
    microbatches: int,
    memory_gib: float,
    time_budget_s: float,
    seed: int,
    on_progress: Callable[[Progress], None],
    chunks: int | None = None,
    stop_at_convergence: bool = False,
) -> Any:
    """Run ``tune``; every progress report goes to ``on_progress`` as a :class:`Progress`.
    ``stop_at_convergence`` ends the search when its climbs converge instead of at the
    budget (quick runs)."""
    return tune(
        profile,
        devices,
        microbatches,
        memory_gib=memory_gib,
        time_budget_s=time_budget_s,
        seed=seed,
        progress=lambda r: on_progress(from_report(r, time_budget_s)),
        **({"chunks": chunks} if chunks else {}),
        **({"stop_at_convergence": True} if stop_at_convergence else {}),
    )


def result_plan(result: Any) -> Plan | None:
    """The tuned plan of a ``TuneResult``."""
    plan = getattr(result, "plan", None)
    return plan if isinstance(plan, Plan) else None


def result_notes(result: Any) -> list[str]:
    """Short facts about a result: why it stops where it does, then search statistics."""
    notes = [result.why] if getattr(result, "why", "") else []
    stats = [
        f"{result.iterations:g} iterations",
        f"{result.evaluations:g} plans simulated",
        f"searched {result.search_time_s:.1f} s",
        f"best found at {result.time_to_best_s:.1f} s",
        getattr(result, "stop_reason", "")
        or ("converged" if result.converged else "stopped at the time budget"),
    ]
    notes.append(" · ".join(stats))
    return notes


def result_history(result: Any) -> list[dict[str, Any]]:
    """The accepted moves of a ``TuneResult``."""
    return [dict(x) for x in getattr(result, "history", [])]
