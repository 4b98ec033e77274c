"""Every peer schedule with each partition, simulated: the table that ``octopipe baselines``,
the dashboard and the benchmarks share.

Each entry is a typed ``PeerRun``: the plan and its metrics, or why the peer could not be built
(too few layers, too few micro-batches).

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> runs = run_peers(Profile.from_dict(example_profile_dict()), devices=2, microbatches=3)
>>> [r.key for r in runs if r.ok][:2], runs[-1].key, runs[-1].error is not None
(['gpipe/uniform', 'gpipe/balanced'], 'dualpipev/balanced', True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from octopipe_core.errors import OctoPipeError
from octopipe_core.plan import Plan
from octopipe_core.profile import Profile
from octopipe_core.schedules import PARTITIONS, SCHEDULES, build_plan
from octopipe_core.simulator import SimResult, simulate

# Metrics kept per peer in the JSON table (``baselines --json`` and the dashboard).
TABLE_METRICS = (
    "step_time_ms",
    "bubble_ratio",
    "comm_overlap_ratio",
    "peak_memory_gib",
    "fits_memory",
    "tokens_per_gpu_per_s",
    "lower_bound_ms",
)


@dataclass(frozen=True)
class PeerRun:
    """One peer (``schedule/partition``): its plan and simulation, or the error that stopped it."""

    schedule: str
    partition: str
    plan: Plan | None = None
    result: SimResult | None = None
    error: str | None = None

    @property
    def key(self) -> str:
        return f"{self.schedule}/{self.partition}"

    @property
    def ok(self) -> bool:
        return self.result is not None

    def row(self) -> dict[str, Any]:
        """The JSON form: the ``TABLE_METRICS``, or ``{"error": ...}``."""
        if self.result is None:
            return {"error": self.error or "not simulated"}
        m = self.result.metrics()
        return {k: m[k] for k in TABLE_METRICS}


def run_peers(
    profile: Profile,
    devices: int,
    microbatches: int,
    chunks: int = 2,
    memory_gib: float | None = None,
) -> list[PeerRun]:
    """Build and simulate every peer schedule with each partition, in registry order."""
    runs = []
    for sched in SCHEDULES:
        for part in PARTITIONS:
            try:
                plan = build_plan(profile, sched, devices, microbatches, chunks, part)
                res = simulate(profile, plan, memory_gib)
            except OctoPipeError as e:
                runs.append(PeerRun(sched, part, error=str(e)))
                continue
            runs.append(PeerRun(sched, part, plan, res))
    return runs


def baselines(
    profile: Profile,
    devices: int,
    microbatches: int,
    chunks: int = 2,
    memory_gib: float | None = None,
) -> dict[str, dict[str, Any]]:
    """``run_peers`` as a JSON-ready table keyed ``schedule/partition`` (see ``PeerRun.row``)."""
    return {r.key: r.row() for r in run_peers(profile, devices, microbatches, chunks, memory_gib)}
