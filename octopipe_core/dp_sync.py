"""Cluster terms of a simulation: link classes of stage boundaries and the end of the step
(data-parallel gradient reduction, optimizer step, ZeRO-1 parameter all-gather).

Gradient buckets: a stage's layers, from the last one back (the order a backward produces
their weight gradients), are grouped into buckets of at least ``layout.bucket_mib`` of
gradients (one bucket per stage when it is 0). A bucket is ready once the stage's last weight
gradient pass (its last W, or last fused BW) has gone through the bucket's layers: at that
action's start plus the W (or B+W) time of the layers from the stage's end down to the
bucket's first layer. Each device reduces its buckets on its own data-parallel stream, in the
order they become ready, overlapping later compute (``overlap_grad_reduce``; without it they
all wait for the device's last compute op). The optimizer step of a device starts once all its
reductions are done; under ZeRO-1 its parameter all-gathers follow. The step ends when every
device is done.

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> prof = Profile.from_dict(example_profile_dict())
>>> [(b.stage, b.ready_offset_ms, b.grad_mib) for b in stage_buckets(prof, 0, (0, 2), "W", 0)]
[(0, 2.0, 125.0)]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from octopipe_core.costs import StageCosts
from octopipe_core.layout import GRAD_FRACTION, Deployment
from octopipe_core.plan import Plan
from octopipe_core.profile import Profile


@dataclass(frozen=True)
class Bucket:
    """Gradients of some layers of ``stage``, ready ``ready_offset_ms`` after the start of the
    stage's last weight-gradient action."""

    stage: int
    ready_offset_ms: float
    grad_mib: float
    param_mib: float


@dataclass(frozen=True)
class TailOp:
    """One op after (or overlapping) the pipeline: ``grad_sync``, ``optimizer`` or
    ``param_gather`` on ``device``."""

    device: int
    kind: str
    stage: int  # -1 for the optimizer step
    start_ms: float
    end_ms: float


def boundary_comm(
    profile: Profile, plan: Plan, costs: StageCosts
) -> tuple[list[float], list[float]]:
    """Per stage boundary ``b`` (stage b -> b+1): wire time (holds the sender's stream) and
    latency, by the link class joining the two devices (the profile's flat link without a
    deployment)."""
    dep: Deployment | None = profile.deployment
    if dep is None:
        return costs.wire_ms, costs.latency_ms
    wire, lat = list(costs.wire_ms), list(costs.latency_ms)
    pl = plan.placement
    for b in range(plan.num_stages - 1):
        size = costs.output_mib[b]
        if size <= 0 or pl[b] == pl[b + 1]:
            continue
        link = dep.p2p_link(pl[b], pl[b + 1])
        wire[b], lat[b] = link.wire_ms(size), link.latency_us / 1e3
    return wire, lat


def stage_buckets(
    profile: Profile, stage: int, layers: tuple[int, int], kind: str, bucket_mib: float
) -> list[Bucket]:
    """The gradient buckets of ``stage`` (layers ``[lo, hi)``) whose last weight-gradient
    action is ``kind`` (``"W"`` or ``"BW"``), in the order they become ready."""
    lts = profile.layer_costs()
    lo, hi = layers
    out: list[Bucket] = []
    t = grad = param = 0.0
    for i in range(hi - 1, lo - 1, -1):
        lt = lts[i]
        t += lt.backward_weight_ms + (lt.backward_input_ms if kind == "BW" else 0.0)
        grad += lt.weight_mib * GRAD_FRACTION
        param += lt.weight_mib * GRAD_FRACTION  # bf16 parameters: as many bytes as gradients
        if (bucket_mib > 0 and grad >= bucket_mib) or i == lo:
            if grad > 0:
                out.append(Bucket(stage, round(t, 9), grad, param))
            grad = param = 0.0
    return out


def last_weight_actions(plan: Plan) -> dict[int, tuple[int, int]]:
    """Per stage: (device, index in the device's list) of its last W or BW."""
    last: dict[int, tuple[int, int]] = {}
    for d, acts in enumerate(plan.schedule):
        for i, a in enumerate(acts):
            if a.kind in ("W", "BW"):
                last[a.stage] = (d, i)
    return last


def device_buckets(profile: Profile, plan: Plan) -> list[list[tuple[int, Bucket]]]:
    """Per device, its gradient buckets as (index of the stage's last W/BW in the device's
    list, bucket), in the order they become ready (device order, then offset)."""
    lay = profile.deployment.layout
    per_dev: list[list[tuple[int, Bucket]]] = [[] for _ in range(plan.num_devices)]
    for s, (d, i) in last_weight_actions(plan).items():
        kind = plan.schedule[d][i].kind
        per_dev[d] += [
            (i, b) for b in stage_buckets(profile, s, plan.partition[s], kind, lay.bucket_mib)
        ]
    for items in per_dev:
        items.sort(key=lambda x: (x[0], x[1].ready_offset_ms))
    return per_dev


def tail_ops(
    profile: Profile,
    plan: Plan,
    costs: StageCosts,
    start_of: Any,
    device_end_ms: list[float],
) -> list[TailOp]:
    """Schedule the reductions, optimizer steps and all-gathers of every device.

    ``start_of(device, index)`` gives the start time of that compute action; ``device_end_ms``
    the end of each device's last compute action. A profile's runtime tail
    (``RuntimeCosts.step_tail_ms``: the step's small all-reduce, a barrier) delays every
    optimizer step to the slowest device's end plus that time; with
    ``optimizer_ms_per_mib`` the optimizer takes that per MiB of the device's weights.
    """
    dep: Deployment | None = profile.deployment
    rt = profile.runtime
    if dep is None and not rt.has_tail:
        return []
    ops: list[TailOp] = []
    per_dev = device_buckets(profile, plan) if dep is not None else [[]] * plan.num_devices
    ready: list[float] = []
    for d, items in enumerate(per_dev):
        free = 0.0
        if dep is not None and dep.layout.dp > 1:
            for i, b in items:
                at = start_of(d, i) + b.ready_offset_ms
                if not dep.layout.overlap_grad_reduce:
                    at = device_end_ms[d]
                st = max(at, free)
                free = st + dep.grad_sync_ms(d, b.grad_mib)
                ops.append(TailOp(d, "grad_sync", b.stage, st, free))
        ready.append(max(free, device_end_ms[d]))
    if rt.step_tail_ms > 0:
        ready = [max(ready) + rt.step_tail_ms] * len(ready)
    for d, items in enumerate(per_dev):
        st = ready[d]
        free = st + optimizer_ms(profile, device_weight_mib(plan, costs, d))
        ops.append(TailOp(d, "optimizer", -1, st, free))
        if dep is not None and dep.layout.zero1 and dep.layout.dp > 1:
            for _, b in items:
                st = free
                free = st + dep.param_gather_ms(d, b.param_mib)
                ops.append(TailOp(d, "param_gather", b.stage, st, free))
    return ops


def optimizer_ms(profile: Profile, weight_mib: float) -> float:
    """One device's optimizer step over ``weight_mib`` of weights: the profile's calibrated
    rate if it has one, else the deployment's memory-bound model (0 without either)."""
    rate = profile.runtime.optimizer_ms_per_mib
    if rate > 0 or profile.deployment is None:
        return rate * weight_mib
    dep: Deployment = profile.deployment
    return dep.optimizer_ms(weight_mib)


def device_weight_mib(plan: Plan, costs: StageCosts, device: int) -> float:
    """The profile's static memory (``weight_mib``) of the stages on ``device``."""
    return sum(costs.weight_mib[s] for s in plan.stages_on(device))
