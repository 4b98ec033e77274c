"""Exhaustive optimum for tiny instances, to measure how far the tuner lands from it.

Search space (the tuner's, restricted only by size):

* every contiguous partition into ``S`` stages, for ``devices <= S <= max_stages_per_device x
  devices`` (and ``S <=`` layers);
* every placement of the stages on the devices that uses all devices, up to relabelling the
  (identical) devices;
* every schedule that runs each stage's F, B and W in micro-batch order, B and W split, within
  the memory cap. Schedules are enumerated by branch and bound as the sequence of actions in
  order of start time (each semi-active schedule exactly once); a branch is cut when a device's
  earliest start plus its remaining work cannot beat the best plan so far.

Timing and memory follow the simulator (one send stream per device, F allocates at its start,
B and W free at their end); the optimum found is re-simulated. Practical for about 2-3 devices,
6-8 layers and 2-4 micro-batches.

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> prof = Profile.from_dict(example_profile_dict())
>>> r = exact_optimum(prof, devices=2, microbatches=2)
>>> r.complete, round(r.step_time_ms, 3), r.plan.placement
(True, 14.137, [0, 1, 0])
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import combinations

from octopipe_core.costs import StageCosts, activation_budgets_mib, stage_costs
from octopipe_core.plan import Action, Plan
from octopipe_core.profile import Profile
from octopipe_core.simulator import SimResult, simulate

_EPS = 1e-9


@dataclass
class ExactResult:
    """The best plan found, its simulation, and whether the search finished in time."""

    plan: Plan | None
    result: SimResult | None
    layouts: int
    nodes: int
    complete: bool
    search_time_s: float

    @property
    def step_time_ms(self) -> float:
        return float("inf") if self.result is None else self.result.step_time_ms


def partitions(num_layers: int, num_stages: int) -> Iterator[list[tuple[int, int]]]:
    """All contiguous partitions of ``num_layers`` layers into ``num_stages`` stages.

    >>> list(partitions(3, 2))
    [[(0, 1), (1, 3)], [(0, 2), (2, 3)]]
    """
    for cuts in combinations(range(1, num_layers), num_stages - 1):
        b = [0, *cuts, num_layers]
        yield [(b[i], b[i + 1]) for i in range(num_stages)]


def placements(num_stages: int, devices: int, max_per_device: int) -> Iterator[list[int]]:
    """Stage-to-device maps using every device, devices numbered by first use.

    >>> list(placements(3, 2, 2))
    [[0, 0, 1], [0, 1, 0], [0, 1, 1]]
    """

    def rec(prefix: list[int], used: int) -> Iterator[list[int]]:
        if len(prefix) == num_stages:
            if used == devices:
                yield list(prefix)
            return
        for d in range(min(used + 1, devices)):
            if prefix.count(d) >= max_per_device:
                continue
            yield from rec([*prefix, d], max(used, d + 1))

    yield from rec([], 0)


class _BnB:
    """Branch and bound over the schedules of one layout."""

    def __init__(
        self, c: StageCosts, place: list[int], D: int, M: int, budget: list[float], ub: float
    ) -> None:
        self.c, self.place, self.D, self.M, self.budget = c, place, D, M, budget
        self.S = len(place)
        self.best = ub
        self.best_order: list[list[Action]] | None = None
        self.nodes = 0
        self.deadline = float("inf")
        self.aborted = False

    def run(self) -> None:
        S, D, M = self.S, self.D, self.M
        c = self.c
        left = [0.0] * D
        for s in range(S):
            left[self.place[s]] += (c.f_ms[s] + c.b_ms[s] + c.w_ms[s]) * M
        st = {
            "fn": [0] * S, "bn": [0] * S, "wn": [0] * S,
            "farr": {(0, i): 0.0 for i in range(M)}, "barr": {},
            "free": [0.0] * D, "send": [0.0] * D, "mem": [0.0] * D,
            "left": left, "order": [[] for _ in range(D)],
        }  # fmt: skip
        self._dfs(st, 0.0, -1, 0.0)

    def _cands(self, st: dict) -> list[tuple[float, int, str, int, int]]:
        out = []
        c, M = self.c, self.M
        for s in range(self.S):
            d = self.place[s]
            i = st["fn"][s]
            if (
                i < M
                and (s, i) in st["farr"]
                and st["mem"][d] + c.activation_mib[s] <= (self.budget[d] + _EPS)
            ):
                out.append((max(st["free"][d], st["farr"][(s, i)]), d, "F", s, i))
            i = st["bn"][s]
            if i < st["fn"][s] and (s, i) in st["barr"]:
                out.append((max(st["free"][d], st["barr"][(s, i)]), d, "B", s, i))
            i = st["wn"][s]
            if i < st["bn"][s]:
                out.append((st["free"][d], d, "W", s, i))
        return out

    def _dfs(self, st: dict, last_t: float, last_d: int, makespan: float) -> None:
        self.nodes += 1
        if self.nodes % 4096 == 0 and time.perf_counter() > self.deadline:
            self.aborted = True
        if self.aborted:
            return
        cands = self._cands(st)
        if not cands:
            if all(w == self.M for w in st["wn"]) and makespan < self.best - 1e-9:
                self.best = makespan
                self.best_order = [[Action._make(a) for a in row] for row in st["order"]]
            return
        # device bound: earliest possible start of each device's remaining work
        for d in range(self.D):
            if st["left"][d] > _EPS:
                t = min((x[0] for x in cands if x[1] == d), default=None)
                if t is None:
                    t = st["free"][d]
                if t + st["left"][d] >= self.best - 1e-9:
                    return
        cands.sort()
        for t, d, kind, s, i in cands:
            if t < last_t - _EPS or (abs(t - last_t) <= _EPS and d < last_d):
                continue  # not in canonical (start time, device) order
            self._apply(st, t, d, kind, s, i, makespan)

    def _apply(self, st: dict, t: float, d: int, kind: str, s: int, i: int, mk: float) -> None:
        c = self.c
        dur = c.f_ms[s] if kind == "F" else c.b_ms[s] if kind == "B" else c.w_ms[s]
        end = t + dur
        saved = (st["free"][d], list(st["send"]), st["mem"][d], st["left"][d])
        added: list[tuple[str, tuple[int, int]]] = []
        st["free"][d] = end
        st["left"][d] -= dur
        st["order"][d].append((s, kind, i))

        def deliver(key: str, dst: int, pair: tuple[int, int], boundary: int) -> None:
            if self.place[dst] == d:
                at = end
            else:
                ts = max(end, st["send"][d])
                st["send"][d] = ts + c.wire_ms[boundary]
                at = st["send"][d] + c.latency_ms[boundary]
            st[key][pair] = at
            added.append((key, pair))

        if kind == "F":
            st["mem"][d] += c.activation_mib[s]
            st["fn"][s] += 1
            if s < self.S - 1:
                deliver("farr", s + 1, (s + 1, i), s)
            else:
                st["barr"][(s, i)] = end
                added.append(("barr", (s, i)))
        elif kind == "B":
            st["mem"][d] -= c.activation_mib[s] - c.stash_mib[s]
            st["bn"][s] += 1
            if s > 0:
                deliver("barr", s - 1, (s - 1, i), s - 1)
        else:
            st["mem"][d] -= c.stash_mib[s]
            st["wn"][s] += 1
        self._dfs(st, t, d, max(mk, end))
        for key, pair in added:
            del st[key][pair]
        if kind == "F":
            st["fn"][s] -= 1
        elif kind == "B":
            st["bn"][s] -= 1
        else:
            st["wn"][s] -= 1
        st["order"][d].pop()
        st["free"][d], st["send"], st["mem"][d], st["left"][d] = saved


def exact_optimum(
    profile: Profile,
    devices: int,
    microbatches: int,
    memory_gib: float | None = None,
    max_stages_per_device: int = 2,
    upper_bound_ms: float | None = None,
    time_limit_s: float = 120.0,
) -> ExactResult:
    """The fastest plan in the space above (``complete`` is False if the time limit hit).

    ``upper_bound_ms`` (e.g. the tuner's result plus a little) only prunes the search.
    """
    t0 = time.perf_counter()
    cap = profile.device.memory_gib if memory_gib is None else memory_gib
    L = profile.num_layers
    best_ms = float("inf") if upper_bound_ms is None else upper_bound_ms
    best: tuple[list[tuple[int, int]], list[int], list[list[Action]]] | None = None
    nodes = layouts = 0
    complete = True
    for S in range(devices, min(L, max_stages_per_device * devices) + 1):
        for part in partitions(L, S):
            c = stage_costs(profile, part)
            for place in placements(S, devices, max_stages_per_device):
                layouts += 1
                budget = activation_budgets_mib(c, place, devices, cap * 1024.0)
                if min(budget) < 0:
                    continue
                bnb = _BnB(c, place, devices, microbatches, budget, best_ms)
                bnb.deadline = t0 + time_limit_s
                bnb.run()
                nodes += bnb.nodes
                if bnb.aborted:
                    complete = False
                if bnb.best_order is not None and bnb.best < best_ms - 1e-9:
                    best_ms = bnb.best
                    best = (part, place, bnb.best_order)
                if not complete:
                    break
            if not complete:
                break
        if not complete:
            break
    elapsed = time.perf_counter() - t0
    if best is None:
        return ExactResult(None, None, layouts, nodes, complete, elapsed)
    plan = Plan(microbatches, best[0], best[1], best[2], "exact-optimum", {"memory_cap_gib": cap})
    return ExactResult(plan, simulate(profile, plan, cap), layouts, nodes, complete, elapsed)
