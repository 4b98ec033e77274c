"""Every peer schedule with each partition, simulated: the one peer table that ``octopipe
baselines``, ``octopipe tune``, the dashboard and the benchmarks share.

``run_peers`` builds and simulates each peer as a ``PeerRun`` (the plan and its simulation, or
why the peer could not be built: too few layers, too few micro-batches); ``PeerTable`` holds
their typed scores (``PeerScore``), keyed ``schedule/partition``.

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> table = peer_table(Profile.from_dict(example_profile_dict()), devices=2, microbatches=3)
>>> [s.key for s in table.values() if s.ok][:2], table["dualpipev/balanced"].ok
(['gpipe/uniform', 'gpipe/balanced'], False)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
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
# The short rows of ``TuneResult.to_dict`` and ``tune --json``.
TUNE_METRICS = ("step_time_ms", "fits_memory", "peak_memory_gib")

# How the tuner simulates a peer plan: its ``SimResult``, or None when the plan deadlocks.
Evaluate = Callable[[str, Plan], SimResult | None]


@dataclass(frozen=True)
class PeerScore:
    """One row of the peer table: a peer's metrics (rounded as in ``simulate --json``), or the
    ``error`` that stopped it (its metrics are then None, ``fits_memory`` False). The tuner's
    rows set only ``step_time_ms``, ``fits_memory`` and ``peak_memory_gib`` (``TUNE_METRICS``).

    >>> bad = PeerScore("zbv", "uniform", error="needs 4 layers")
    >>> bad.key, bad.ok, bad.row()
    ('zbv/uniform', False, {'error': 'needs 4 layers'})
    """

    schedule: str
    partition: str
    step_time_ms: float | None = None
    bubble_ratio: float | None = None
    comm_overlap_ratio: float | None = None
    peak_memory_gib: tuple[float, ...] = ()
    fits_memory: bool = False
    tokens_per_gpu_per_s: float | None = None
    lower_bound_ms: float | None = None
    error: str | None = None

    @classmethod
    def of(cls, schedule: str, partition: str, result: SimResult, detail: bool = True) -> PeerScore:
        """The score of a simulated peer. Without ``detail`` only the step time, the fit and
        the peaks are set (the tuner's table: the other metrics cost it half a simulation)."""
        if not detail:
            return cls(
                schedule,
                partition,
                step_time_ms=round(result.step_time_ms, 6),
                peak_memory_gib=tuple(round(x, 4) for x in result.peak_memory_gib),
                fits_memory=result.fits_memory,
            )
        m = result.metrics()
        return cls(
            schedule,
            partition,
            step_time_ms=m["step_time_ms"],
            bubble_ratio=m["bubble_ratio"],
            comm_overlap_ratio=m["comm_overlap_ratio"],
            peak_memory_gib=tuple(m["peak_memory_gib"]),
            fits_memory=m["fits_memory"],
            tokens_per_gpu_per_s=m["tokens_per_gpu_per_s"],
            lower_bound_ms=m["lower_bound_ms"],
        )

    @property
    def key(self) -> str:
        return f"{self.schedule}/{self.partition}"

    @property
    def ok(self) -> bool:
        """Whether the peer was built and simulated (then every metric is set)."""
        return self.error is None and self.step_time_ms is not None

    def row(self, fields: Sequence[str] = TABLE_METRICS) -> dict[str, Any]:
        """The JSON form: ``fields`` (default ``TABLE_METRICS``), or ``{"error": ...}``."""
        if not self.ok:
            return {"error": self.error or "not simulated"}
        out: dict[str, Any] = {}
        for f in fields:
            v = getattr(self, f)
            out[f] = list(v) if isinstance(v, tuple) else v
        return out


@dataclass(frozen=True)
class PeerTable(Mapping[str, PeerScore]):
    """Every peer's ``PeerScore``, keyed ``schedule/partition`` in registry order.

    >>> t = PeerTable((PeerScore("a", "u", 2.0, fits_memory=True), PeerScore("b", "u", 1.0),
    ...                PeerScore("c", "u", error="too few layers")))
    >>> t.best().key, t.best(fitting=False).key, t.best(exclude="a/u"), t.get("c/u").ok
    ('a/u', 'b/u', None, False)
    """

    scores: tuple[PeerScore, ...] = ()

    @classmethod
    def of(cls, runs: Sequence[PeerRun], detail: bool = True) -> PeerTable:
        """The table of ``run_peers`` (``detail``: see ``PeerScore.of``)."""
        return cls(tuple(r.score(detail) for r in runs))

    def __getitem__(self, key: str) -> PeerScore:
        for s in self.scores:
            if s.key == key:
                return s
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (s.key for s in self.scores)

    def __len__(self) -> int:
        return len(self.scores)

    def best(self, fitting: bool = True, exclude: str | None = None) -> PeerScore | None:
        """The fastest built peer (that fits the cap when ``fitting``), other than ``exclude``;
        None when there is none."""
        ok = [
            s for s in self.scores if s.ok and (s.fits_memory or not fitting) and s.key != exclude
        ]
        return min(ok, key=lambda s: s.step_time_ms or 0.0) if ok else None

    def step_ms(self, key: str) -> float | None:
        """A peer's step time, None if it is absent or could not be built."""
        s = self.get(key)
        return s.step_time_ms if s is not None and s.ok else None

    def to_json(self, fields: Sequence[str] = TABLE_METRICS) -> dict[str, dict[str, Any]]:
        """``{key: PeerScore.row(fields)}``: the ``baselines`` object of the JSON outputs."""
        return {s.key: s.row(fields) for s in self.scores}


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

    def score(self, detail: bool = True) -> PeerScore:
        """This peer's row of the ``PeerTable``."""
        if self.result is None:
            return PeerScore(self.schedule, self.partition, error=self.error or "not simulated")
        return PeerScore.of(self.schedule, self.partition, self.result, detail)


def run_peers(
    profile: Profile,
    devices: int,
    microbatches: int,
    chunks: int = 2,
    memory_gib: float | None = None,
    evaluate: Evaluate | None = None,
) -> list[PeerRun]:
    """Build and simulate every peer schedule with each partition, in registry order.

    ``evaluate(key, plan)`` replaces ``simulate`` (the tuner simulates with its own cost cache
    and keeps its candidates); it returns None for a plan that deadlocks.
    """
    runs = []
    for sched in SCHEDULES:
        for part in PARTITIONS:
            try:
                plan = build_plan(profile, sched, devices, microbatches, chunks, part)
                if evaluate is None:
                    res: SimResult | None = simulate(profile, plan, memory_gib)
                else:
                    res = evaluate(f"{sched}/{part}", plan)
            except OctoPipeError as e:
                runs.append(PeerRun(sched, part, error=str(e)))
                continue
            if res is None:
                runs.append(PeerRun(sched, part, error="deadlocks"))
                continue
            runs.append(PeerRun(sched, part, plan, res))
    return runs


def peer_table(
    profile: Profile,
    devices: int,
    microbatches: int,
    chunks: int = 2,
    memory_gib: float | None = None,
) -> PeerTable:
    """``run_peers`` as a typed ``PeerTable`` (what the dashboard shows)."""
    return PeerTable.of(run_peers(profile, devices, microbatches, chunks, memory_gib))


def baselines(
    profile: Profile,
    devices: int,
    microbatches: int,
    chunks: int = 2,
    memory_gib: float | None = None,
) -> dict[str, dict[str, Any]]:
    """``peer_table`` as a JSON-ready table keyed ``schedule/partition`` (see ``PeerScore.row``)."""
    return peer_table(profile, devices, microbatches, chunks, memory_gib).to_json()
