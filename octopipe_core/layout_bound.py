"""The least step time any schedule of one layout (partition and placement) can reach.

``bounds.py`` bounds every plan of a profile; this bounds every *schedule* of one plan's
layout. A plan's gap then splits into what its layout costs (this bound over the best bound)
and what its schedule costs (the step time over this bound).

With stage times ``f_s``, ``b_s``, ``w_s`` (ms, recomputation included), ``S`` stages, ``m``
micro-batches and ``h_s`` the transfer time (ms) between stages ``s`` and ``s + 1`` when they
sit on different devices (0 on the same device), every micro-batch's forward chain starts at
0 and crosses the same stages, so:

* **release** ``R_s = sum_{t < s} (f_t + h_t)``: no F, B or W of stage ``s`` starts before;
* **tail** ``D_s = sum_{t < s} (b_t + h_t) + w_0`` (``D_0 = 0``): after a B of stage ``s`` the
  gradient still runs down to stage 0, whose W follows;
* **turn** ``U_s = R_{S-1} + f_{S-1} + sum_{t > s} (b_t + h_{t-1})``: no B or W of stage ``s``
  starts before the first forward reaches the last stage and its gradient comes back;
* **forward tail** ``V_s``: after an F of stage ``s`` the forward runs up to the last stage
  and the whole backward down to stage 0 (transfers included), then stage 0's W.

One device runs one action at a time, so for each device and each stage ``s`` it holds
(``>= s``: its stages from ``s`` on, ``hi``: its last stage):

* ``T >= R_s + m x work(>= s)`` (``work = f + b + w``: its **work** after its release);
* ``T >= R_s + m x (f + b)(>= s) + D_s`` (**forwards and backwards** before the tail);
* ``T >= R_s + m x f(>= s) + V_hi`` (**forwards** before the forward tail);
* ``T >= U_hi + m x (b + w)(all its stages)`` (**backwards and weight gradients** after the
  turn).

The first form with the device's lowest stage only is the usual fill estimate; the others
matter when a device's heavy stages come late (a tiny embedding stage first, say): then its
work waits for the forward to reach them, whatever the schedule. Transfers are counted at
their own time (a shared send stream can only delay them), the memory cap is ignored.

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> from octopipe_core.schedules import build_plan
>>> from octopipe_core.simulator import simulate
>>> prof = Profile.from_dict(example_profile_dict())
>>> plan = build_plan(prof, "1f1b", 2, 4)
>>> lb = plan_layout_bound(prof, plan)
>>> lb.ms <= simulate(prof, plan).step_time_ms + 1e-9, lb.form in FORMS
(True, True)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import accumulate

from octopipe_core.costs import StageCosts, stage_costs
from octopipe_core.dp_sync import boundary_comm
from octopipe_core.plan import Plan
from octopipe_core.profile import Profile

FORMS = ("work", "forwards and backwards", "forwards", "backwards and weight gradients")


@dataclass(frozen=True)
class LayoutBound:
    """The layout bound (ms) and where it binds: ``device``, from its stage ``stage`` on, by
    the form ``form`` (one of ``FORMS``; module docstring)."""

    ms: float
    device: int
    stage: int
    form: str

    def describe(self) -> str:
        """One line: what any schedule of the layout needs, and why."""
        when = (
            "after the gradient first comes back to them"
            if self.form == FORMS[3]
            else "after the forward first reaches them"
        )
        return (
            f"any schedule of this layout needs >= {self.ms:,.1f} ms: the {self.form} of "
            f"device {self.device}'s stages from {self.stage} on, {when}"
        )

    def gap_pct(self, step_ms: float) -> float:
        """How far ``step_ms`` is above this bound, in %."""
        return 100.0 * (step_ms / self.ms - 1.0) if self.ms > 0 else 0.0


def layout_bound(costs: StageCosts, placement: list[int], microbatches: int) -> LayoutBound:
    """The bound of the module docstring for stages ``costs`` on devices ``placement``.

    Two stages on two devices, the first nearly free (1 us of F, B and W), the second
    1 ms each, 4 micro-batches, no transfer cost: the second device's 12 ms of work start
    after the first stage's forward:

    >>> c = StageCosts([1e-3, 1.0], [1e-3, 1.0], [1e-3, 1.0], [0.0] * 2, [0.0] * 2, [0.0] * 2,
    ...                [0.0] * 2, [0.0] * 2, [0.0] * 2, [0.0] * 2)
    >>> lb = layout_bound(c, [0, 1], 4)
    >>> round(lb.ms, 3), lb.device, lb.form
    (12.001, 1, 'work')
    """
    S, m = len(placement), microbatches
    f, b, w = costs.f_ms, costs.b_ms, costs.w_ms
    h = [
        costs.wire_ms[s] + costs.latency_ms[s] if placement[s + 1] != placement[s] else 0.0
        for s in range(S - 1)
    ] + [0.0]
    R = [0.0, *accumulate(f[s] + h[s] for s in range(S - 1))]
    down = [0.0, *accumulate(b[s] + h[s] for s in range(S - 1))]  # sum_{t<s} (b_t + h_t)
    D = [0.0] + [x + w[0] for x in down[1:]]
    fwd_top = R[S - 1] + f[S - 1]
    # U_s: the turn, then the gradient down from the last stage to s + 1
    U = [0.0] * S
    acc = fwd_top
    for s in range(S - 1, -1, -1):
        U[s] = acc
        acc += b[s] + (h[s - 1] if s > 0 else 0.0)
    back_all = down[S - 1] + b[S - 1] + w[0]  # the whole backward from the last stage, W_0
    V = [fwd_top - R[s] - f[s] + back_all for s in range(S)]  # after an F of stage s
    best = LayoutBound(0.0, 0, 0, FORMS[0])
    stages_of: dict[int, list[int]] = {}
    for s, d in enumerate(placement):
        stages_of.setdefault(d, []).append(s)
    for d, mine in stages_of.items():
        hi = mine[-1]
        work = fb = fw = 0.0
        for s in reversed(mine):  # suffix sums: this device's stages from s on
            work += f[s] + b[s] + w[s]
            fb += f[s] + b[s]
            fw += f[s]
            for form, v in (
                (FORMS[0], R[s] + m * work),
                (FORMS[1], R[s] + m * fb + D[s]),
                (FORMS[2], R[s] + m * fw + V[hi]),
            ):
                if v > best.ms:
                    best = LayoutBound(v, d, s, form)
        v = U[hi] + m * (work - fw)  # all its stages' B and W
        if v > best.ms:
            best = LayoutBound(v, d, mine[0], FORMS[3])
    return best


def plan_layout_bound(profile: Profile, plan: Plan) -> LayoutBound:
    """``layout_bound`` of ``plan``'s partition, placement and recomputed stages, with the
    transfer times the simulator uses (a cluster deployment's link classes included)."""
    costs = stage_costs(profile, plan.partition, plan.recompute)
    wire, lat = boundary_comm(profile, plan, costs)
    costs = replace(costs, wire_ms=list(wire), latency_ms=list(lat))
    return layout_bound(costs, list(plan.placement), plan.num_microbatches)
