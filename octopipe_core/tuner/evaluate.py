"""Candidate plans and their evaluation: one simulator call decides every move.

A :class:`Candidate` is a complete plan plus its simulated step time and memory. The
:class:`Evaluator` builds candidates either from explicit device orders (peer schedules,
reordered schedules) or by running the list scheduler with some policies on a layout, and
ranks them: a plan that fits the memory cap beats one that does not; among plans that fit, the
faster wins; among plans that do not, the one with the smaller overflow wins.

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> prof = Profile.from_dict(example_profile_dict())
>>> ev = Evaluator(prof, devices=2, microbatches=4, cap_gib=80.0)
>>> c = ev.from_policies([(0, 2), (2, 4)], [0, 1], "example")
>>> c.fits, c.step_ms > 0
(True, True)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from octopipe_core.bounds import LayerTimes
from octopipe_core.costs import StageCosts, activation_budgets_mib, layer_times_ms, stage_costs
from octopipe_core.errors import OctoPipeError
from octopipe_core.fill_partition import FillModel, FillResult, solve_fill
from octopipe_core.plan import Action, Plan, TextEnum
from octopipe_core.profile import Profile
from octopipe_core.simulator import SimResult, simulate
from octopipe_core.tuner.assign import reassigned_layouts
from octopipe_core.tuner.layouts import DeviceFn, family_partition, finish_fn
from octopipe_core.tuner.list_scheduler import LEAN_POLICY, POLICIES, Policy, list_schedule
from octopipe_core.tuner.packed import spread_layouts

Partition = list[tuple[int, int]]
Rec = tuple[int, ...] | list[int]  # stages that recompute their forward in B


@dataclass
class Candidate:
    """A complete plan with its simulated step time (ms) and memory (GiB)."""

    plan: Plan
    result: SimResult
    origin: str
    policy: Policy | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def step_ms(self) -> float:
        return self.result.step_time_ms

    @property
    def peak_gib(self) -> list[float]:
        return self.result.peak_memory_gib

    @property
    def overflow_gib(self) -> float:
        cap = self.result.memory_cap_gib
        return max(0.0, max(p - cap for p in self.result.peak_memory_gib))

    @property
    def total_overflow_gib(self) -> float:
        cap = self.result.memory_cap_gib
        return sum(max(0.0, p - cap) for p in self.result.peak_memory_gib)

    @property
    def fits(self) -> bool:
        return self.result.fits_memory

    def key(self) -> tuple[float, float, float]:
        """Sort key: (max and total memory overflow in GiB, step time in ms); smaller first."""
        if self.fits:
            return (0.0, 0.0, self.step_ms)
        return (round(self.overflow_gib, 9), round(self.total_overflow_gib, 9), self.step_ms)


def better(a: Candidate | None, b: Candidate | None, rel: float = 1e-9) -> bool:
    """True if ``a`` should replace ``b``: it fits and is faster, or overflows less."""
    if a is None:
        return False
    if b is None:
        return True
    if b.fits:
        return a.fits and a.step_ms < b.step_ms * (1.0 - rel)
    if a.fits:
        return True
    ka = (round(a.overflow_gib, 9), round(a.total_overflow_gib, 9))
    kb = (round(b.overflow_gib, 9), round(b.total_overflow_gib, 9))
    if ka != kb:
        return ka < kb
    return a.step_ms < b.step_ms * (1.0 - rel)


REASSIGN_SHARE = 0.25  # of the time left, for one reassignment descent ...
REASSIGN_MAX_S = 30.0  # ... and at most this


class Evaluator:
    """Builds and simulates candidates for one (profile, devices, micro-batches, cap) problem."""

    def __init__(
        self,
        profile: Profile,
        devices: int,
        microbatches: int,
        cap_gib: float,
        deadline: float | None = None,
    ) -> None:
        self.profile = profile
        self.devices = devices
        self.microbatches = microbatches
        self.cap_gib = cap_gib
        self.deadline = deadline
        self.weights = layer_times_ms(profile)
        layers = profile.layer_costs()
        self.fwd_ms = [lt.forward_ms for lt in layers]
        self.hop_ms = [profile.device.transfer_ms(lt.output_mib) for lt in layers]
        self.evaluations = 0
        self._costs: dict[tuple[tuple[tuple[int, int], ...], tuple[int, ...]], StageCosts] = {}
        self._ls_cache: dict[tuple[Any, ...], float] = {}
        self._pruned: dict[tuple[Any, ...], float] = {}
        hops = sorted(self.hop_ms[:-1]) or [0.0]
        self.fill = FillModel.from_times(LayerTimes.of(profile), microbatches, hops[len(hops) // 2])
        self._fill_cache: dict[tuple[Any, ...], FillResult] = {}
        self._spread: dict[bool, list[tuple[str, Partition, list[int], float]]] = {}
        self._balanced: dict[str, Partition] = {}
        self._reassigned: dict[tuple[int, ...], list[tuple[Partition, list[int], float]]] = {}
        self.memory_tight = False  # set by the tuner when the cap binds the peers
        self.bound_ms = float("inf")  # list schedules slower than this are abandoned
        self.bound_fits = False  # whether the bound comes from a plan that fits
        self.pruned = 0

    # ---- helpers ------------------------------------------------------------------------
    def out_of_time(self) -> bool:
        return self.deadline is not None and time.perf_counter() > self.deadline

    def costs(self, partition: Partition, recompute: Rec = ()) -> StageCosts:
        """Stage costs of ``partition`` (``recompute``: stages that recompute their forward)."""
        key = (tuple(partition), tuple(recompute))
        c = self._costs.get(key)
        if c is None:
            if len(self._costs) > 4096:
                self._costs.clear()
            c = stage_costs(self.profile, partition, recompute)
            self._costs[key] = c
        return c

    def budgets_mib(self, costs: StageCosts, placement: list[int]) -> list[float]:
        """``costs.activation_budgets_mib`` under this problem's cap."""
        return activation_budgets_mib(costs, placement, self.devices, self.cap_gib * 1024.0)

    def finish_fn(self, placement: list[int]) -> DeviceFn:
        """Per-device finish estimate (first arrival + micro-batches x load) for a placement."""
        return finish_fn(
            self.weights, self.fwd_ms, self.hop_ms, placement, self.devices, self.microbatches
        )

    def fill_model(self, memory: bool = False, inflight: float = 1.0) -> FillModel:
        """The fill-aware partitioning model of this problem; with ``memory``, each device
        must also fit its weights plus ``inflight`` x the 1F1B depth of activations."""
        if not memory:
            return self.fill
        layers = self.profile.layer_costs()
        dep = self.profile.deployment
        wt = [lt.weight_mib if dep is None else dep.static_mib(lt.weight_mib) for lt in layers]
        act = [inflight * lt.activation_mib for lt in layers]
        return self.fill.with_memory(wt, act, self.cap_gib * 1024.0)

    def fill_partition(
        self,
        placement: list[int],
        start: Partition | None = None,
        memory: bool = False,
        inflight: float = 1.0,
    ) -> FillResult:
        """The fill-aware partition of ``placement`` (``fill_partition.solve_fill``): exact
        for nested placements (seq, V, folds), a descent from ``start`` otherwise. Cached."""
        key = (tuple(placement), memory, inflight, None if start is None else tuple(start))
        res = self._fill_cache.get(key)
        if res is None:
            res = solve_fill(self.fill_model(memory, inflight), placement, start)
            if res.exact:  # the answer does not depend on the start
                for k in (key, (*key[:3], None)):
                    self._fill_cache[k] = res
            else:
                self._fill_cache[key] = res
        return res

    def family_partition(self, family: str) -> Partition:
        """``layouts.family_partition`` of this problem's layer times (device-balanced).
        Cached: every placement phase proposes each family again."""
        if family not in self._balanced:
            self._balanced[family] = family_partition(self.weights, family, self.devices)
        return list(self._balanced[family])

    def reassigned(self, owner: list[int]) -> list[tuple[Partition, list[int], float]]:
        """``assign.reassigned_layouts`` from the layer-to-device map ``owner``, with at
        most ``REASSIGN_SHARE`` of the time left, and at most ``REASSIGN_MAX_S`` (no limit
        without a deadline). Cached per map: each placement phase of the same incumbent
        proposes them again."""
        key = tuple(owner)
        if key not in self._reassigned:
            until = None
            if self.deadline is not None:
                now = time.perf_counter()
                until = now + min(REASSIGN_MAX_S, REASSIGN_SHARE * max(0.0, self.deadline - now))
            self._reassigned[key] = reassigned_layouts(
                self.fill, owner, self.devices, deadline=until
            )
        return self._reassigned[key]

    def spread_layouts(self, memory: bool = False) -> list[tuple[str, Partition, list[int], float]]:
        """``packed.spread_layouts`` of this problem (name, partition, placement, fill-model
        need); with ``memory``, under the fill model's memory budget. Cached: the placement
        phase asks for them every time."""
        if memory not in self._spread:
            self._spread[memory] = spread_layouts(self.fill_model(memory), self.devices)
        return self._spread[memory]

    # ---- building candidates ------------------------------------------------------------
    def from_order(
        self,
        partition: Partition,
        placement: list[int],
        order: list[list[Action]],
        origin: str,
        policy: Policy | None = None,
        recompute: Rec = (),
    ) -> Candidate | None:
        """Simulate explicit device orders; ``None`` if they deadlock."""
        plan = Plan(self.microbatches, list(partition), list(placement), order, "octopipe-tuned")
        plan.recompute = sorted(recompute)
        self.evaluations += 1
        costs = self.costs(partition, plan.recompute)
        try:
            r = simulate(self.profile, plan, self.cap_gib, check=False, costs=costs)
        except (OctoPipeError, KeyError):
            return None
        return Candidate(plan, r, origin, policy)

    def from_policies(
        self,
        partition: Partition,
        placement: list[int],
        origin: str,
        policies: tuple[Policy, ...] | list[Policy] = POLICIES[:3],
        allow_overflow: bool = True,
        bound_ms: float | None = None,
        recompute: Rec = (),
    ) -> Candidate | None:
        """List-schedule a layout with each policy; simulate the fastest schedule that fits.

        When no policy fits the cap and ``allow_overflow`` is set, the layout is scheduled
        without a cap so that the search can still rank it by its overflow. ``bound_ms``
        (default: the evaluator's ``bound_ms``, the incumbent's step time) lets the scheduler
        give up early on plans that cannot beat it; those return ``None``. ``recompute``
        lists the stages that recompute their forward in B.
        """
        rec = tuple(sorted(recompute))
        if bound_ms is None:
            bound_ms = self.bound_ms if self.bound_fits else float("inf")
        bound = bound_ms
        costs = self.costs(partition, rec)
        budgets = self.budgets_mib(costs, placement)
        best = None
        lay = (tuple(partition), tuple(placement), rec)
        for pol in policies:
            ck = (*lay, pol)
            lim = bound if best is None else min(bound, best.makespan_ms)
            known = self._ls_cache.get(ck)
            if known is not None and (known == float("inf") or known >= lim * (1 - 1e-12)):
                continue  # stalls, or cannot beat the bound: no need to schedule it again
            if self._pruned.get(ck, -1.0) >= lim:
                continue  # already abandoned at a looser bound
            self.evaluations += 1
            r = list_schedule(costs, placement, self.devices, self.microbatches, budgets, pol, lim)
            if r is None and lim < float("inf"):
                self.pruned += 1
                self._pruned[ck] = lim
                continue  # worse than the bound (or stalled): retried only at a looser bound
            self._ls_cache[ck] = float("inf") if r is None else r.makespan_ms
            if r is not None and (best is None or r.makespan_ms < best.makespan_ms - 1e-9):
                best = r
        if best is None:
            if not allow_overflow or (self.bound_fits and bound < float("inf")):
                return None
            # nothing fits: the plan holding the fewest micro-batches, to rank by overflow
            best = list_schedule(
                costs, placement, self.devices, self.microbatches, None, LEAN_POLICY
            )
            if best is None:
                return None
        return self.from_order(partition, placement, best.order, origin, best.policy, rec)

    def seen_policy(
        self, partition: Partition, placement: list[int], policy: Policy, recompute: Rec = ()
    ) -> bool:
        """Whether this layout was already list-scheduled with ``policy``."""
        key = (tuple(partition), tuple(placement), tuple(sorted(recompute)), policy)
        return key in self._ls_cache


class Phase(TextEnum):
    """What a move fixes first: the partition, the placement, the schedule or memory."""

    PARTITION = "partition"
    PLACEMENT = "placement"
    SCHEDULE = "schedule"
    MEMORY = "memory"


class Move(TextEnum):
    """The kind of change a proposal makes; the search picks moves by kind, never by their
    descriptions."""

    REBALANCE = "rebalance"  # descent on device loads (or memory)
    FILL_PARTITION = "fill partition"  # exact fill-aware partition for the layout
    MIGRATE = "migrate"  # a boundary or chain move of layers between stages
    SWITCH_FAMILY = "switch family"  # another placement family (1f1b, v, fold, ...)
    SPLIT_STAGE = "split stage"
    MERGE_STAGES = "merge stages"
    SWAP = "swap"  # two stages trade devices
    REASSIGN = "reassign layers"  # any layer to any device, by a fill-model descent
    RELOCATE = "relocate"  # one stage moves to another device
    TRADE_LAYER = "trade layer"
    ADVANCE = "advance"  # an action moves earlier in its device's order
    DELAY = "delay"  # an action moves later
    POLICY = "policy"  # re-plan the order with a list-scheduling policy
    JUSTIFY = "justify"  # re-plan the order by forward-backward justification
    SPLIT_BACKWARD = "split backward"
    RECOMPUTE = "recompute"
    STOP_RECOMPUTE = "stop recompute"


@dataclass
class Proposal:
    """One move: its phase, its kind, a description and a thunk that builds (and simulates)
    it."""

    phase: Phase
    move: Move
    description: str
    build: Callable[[], Candidate | None]


def proposal(
    phase: Phase, move: Move, description: str, fn: Callable[[], Candidate | None]
) -> Proposal:
    """A :class:`Proposal` whose candidate is labelled with ``description``."""

    def run() -> Candidate | None:
        c = fn()
        if c is not None:
            c.origin = description
        return c

    return Proposal(phase, move, description, run)
