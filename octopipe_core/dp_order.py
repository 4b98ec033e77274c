"""Order weight-gradient passes (W) so data-parallel reductions start early and overlap.

Zero-bubble schedules defer W to fill bubbles, so a stage's last W, and with it the start of
its gradient reduction, tends to sit at the very end of the step, where the reduction is fully
exposed. Two schedule moves fix that without touching partition or placement:

* ``tail``: the run of W-only actions that ends a device's list is reordered so that stages
  with the longest reduction finish their W first (any order of that run is valid: every B it
  needs is already done);
* ``early:<stage>``: the W actions of one stage that come after its last B move to right
  behind that B, so the stage's gradients are complete as early as its backward allows.

``order_w_for_dp`` applies the best move while the simulator says the step gets faster and
the plan still fits the memory cap.

>>> from octopipe_core.cluster import Cluster, example_cluster_dict
>>> from octopipe_core.layout import deploy
>>> from octopipe_core.profile import load_sample
>>> from octopipe_core.schedules import build_plan
>>> p = deploy(load_sample("nemotron-h-8b"), Cluster.from_dict(example_cluster_dict()), 4, dp=4)
>>> plan = build_plan(p, "zb-h1", 4, 8, partition="balanced")
>>> res = order_w_for_dp(p, plan)
>>> res.step_time_ms <= res.start_step_time_ms
True
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from octopipe_core.plan import Plan
from octopipe_core.profile import Profile
from octopipe_core.simulator import SimResult, simulate


@dataclass
class DpOrderResult:
    plan: Plan
    result: SimResult
    start_step_time_ms: float
    moves: list[str] = field(default_factory=list)

    @property
    def step_time_ms(self) -> float:
        return self.result.step_time_ms


def _sync_ms(profile: Profile, plan: Plan, stage: int) -> float:
    dep = profile.deployment
    if dep is None:
        return 0.0
    lts = profile.layer_costs()
    lo, hi = plan.partition[stage]
    grad = sum(lt.weight_mib for lt in lts[lo:hi]) * 2.0 / 16.0
    return dep.grad_sync_ms(plan.placement[stage], grad)


def dp_order_proposals(profile: Profile, plan: Plan) -> list[tuple[str, Plan]]:
    """Candidate plans (name, plan) from the two moves of the module docstring."""
    out: list[tuple[str, Plan]] = []
    for d, acts in enumerate(plan.schedule):
        k = len(acts)
        while k > 0 and acts[k - 1].kind == "W":
            k -= 1
        tail = acts[k:]
        if len(tail) > 1:
            order = sorted(
                tail, key=lambda a: (-_sync_ms(profile, plan, a.stage), a.stage, tail.index(a))
            )
            if order != tail:
                new = plan.copy()
                new.schedule[d] = acts[:k] + order
                out.append((f"d{d}:tail", new))
        for s in plan.stages_on(d):
            last_b = max((i for i, a in enumerate(acts) if a.stage == s and a.kind == "B"),
                         default=-1)  # fmt: skip
            if last_b < 0:
                continue
            late = [a for a in acts[last_b + 1 :] if a.stage == s and a.kind == "W"]
            if not late or acts[last_b + 1 : last_b + 1 + len(late)] == late:
                continue
            rest = [a for a in acts[last_b + 1 :] if a not in set(late)]
            new = plan.copy()
            new.schedule[d] = acts[: last_b + 1] + late + rest
            out.append((f"d{d}:early:{s}", new))
    return out


def order_w_for_dp(
    profile: Profile,
    plan: Plan,
    memory_cap_gib: float | None = None,
    max_rounds: int = 32,
    time_budget_s: float = 5.0,
) -> DpOrderResult:
    """Greedily apply the best W-order move while it shortens the step and fits the cap."""
    t_end = time.perf_counter() + time_budget_s
    best = simulate(profile, plan, memory_cap_gib)
    res = DpOrderResult(plan, best, best.step_time_ms)
    if profile.deployment is None:
        return res
    for _ in range(max_rounds):
        cands = []
        for name, p in dp_order_proposals(profile, res.plan):
            if time.perf_counter() > t_end:
                break
            r = simulate(profile, p, memory_cap_gib, check=False)
            if r.fits_memory >= res.result.fits_memory:
                cands.append((r.step_time_ms, name, p, r))
        cands.sort(key=lambda c: c[0])
        if not cands or cands[0][0] >= res.result.step_time_ms * (1 - 1e-9):
            break
        _, name, p, r = cands[0]
        res.plan, res.result = p, r
        res.moves.append(name)
    return res
