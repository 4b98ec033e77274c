"""Where the time goes in a simulated step: per-device idle split by cause, and the critical
path.

Every device's step (first op of the step to its end, the cluster tail included) splits into:

* ``busy_ms``: its own compute (F, B, W, BW);
* ``fill_ms``: idle before its first op (the pipeline's start-up);
* ``wait_transfer_ms``: idle between two ops while an activation or gradient it needs was on
  the wire (the gap overlaps an incoming transfer that ends when the next op starts);
* ``idle_between_ms``: other idle between its first and last op (waiting on another device's
  compute, or on a memory-gated order);
* ``drain_ms``: idle after its last op until the step ends (the pipeline's drain, and the
  data-parallel tail when the plan has a cluster layout).

The four idle parts add up to the device's bubble; ``bubble_ratio`` per device is
idle / step time, the same definition as the simulator's ``bubble_ratio``.

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> from octopipe_core.schedules import build_plan
>>> from octopipe_core.simulator import simulate
>>> prof = Profile.from_dict(example_profile_dict())
>>> r = simulate(prof, build_plan(prof, "1f1b", 2, 4))
>>> rows = time_breakdown(r)
>>> all(abs(x.busy_ms + x.idle_ms - r.step_time_ms) < 1e-6 for x in rows)
True
>>> path = critical_path(r)
>>> abs(path[-1].end_ms - max(r.end_ms)) < 1e-9
True
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from octopipe_core.simulator import SimResult

EPS_MS = 1e-6


@dataclass(frozen=True)
class DeviceTime:
    """One device's step split by cause (all in ms); see the module docstring."""

    device: int
    busy_ms: float
    fill_ms: float
    wait_transfer_ms: float
    idle_between_ms: float
    drain_ms: float

    @property
    def idle_ms(self) -> float:
        return self.fill_ms + self.wait_transfer_ms + self.idle_between_ms + self.drain_ms

    def to_dict(self) -> dict[str, Any]:
        total = self.busy_ms + self.idle_ms
        return {**asdict(self), "bubble_ratio": 0.0 if total <= 0 else self.idle_ms / total}


def _incoming(result: SimResult) -> dict[int, list[tuple[float, float, int]]]:
    """Per consumer op: its incoming transfers as (start_ms, end_ms, producer op)."""
    src, dst, xs, xe = result._xfers
    inc: dict[int, list[tuple[float, float, int]]] = {}
    for i, c, a, b in zip(src, dst, xs, xe, strict=True):
        inc.setdefault(c, []).append((a, b, i))
    return inc


def time_breakdown(result: SimResult) -> list[DeviceTime]:
    """Per device: busy, fill, waiting on transfers, other idle and drain time (ms)."""
    t0 = min(result.start_ms, default=0.0)
    t_end = t0 + result.step_time_ms
    inc = _incoming(result)
    rows = []
    for d, (lo, hi) in enumerate(result.device_op_ranges()):
        if lo == hi:
            rows.append(DeviceTime(d, 0.0, 0.0, 0.0, 0.0, result.step_time_ms))
            continue
        busy = sum(result.end_ms[i] - result.start_ms[i] for i in range(lo, hi))
        wait = between = 0.0
        for i in range(lo + 1, hi):
            g0, g1 = result.end_ms[i - 1], result.start_ms[i]
            if g1 - g0 <= EPS_MS:
                continue
            on_wire = max(
                (
                    min(g1, b) - max(g0, a)
                    for a, b, _ in inc.get(i, [])
                    if abs(b - g1) <= EPS_MS and b > g0
                ),
                default=0.0,
            )
            wait += on_wire
            between += (g1 - g0) - on_wire
        fill = result.start_ms[lo] - t0
        drain = t_end - result.end_ms[hi - 1]
        rows.append(DeviceTime(d, busy, fill, wait, between, drain))
    return rows


@dataclass(frozen=True)
class PathStep:
    """One link of the critical path: a compute op or the transfer that fed the next op."""

    kind: str  # "op" or "transfer"
    device: int  # the op's device; for a transfer, the receiving device
    label: str  # e.g. "2F5", or "2F5 -> d3"
    start_ms: float
    end_ms: float
    op: int  # index into result.ops (for a transfer: its consumer)


def critical_path(result: SimResult) -> list[PathStep]:
    """The chain of ops and transfers that sets the step's compute time, first to last.

    Starting from the op that ends last, each step goes back to what it waited for: the
    transfer that arrived as it started (and that transfer's producer), else the previous op
    on its device. Where nothing ended at its start (it was free to run earlier but gated by
    memory or order) the path stops there. Lengthening any op on the path lengthens the step.
    """
    if not result.ops:
        return []
    inc = _incoming(result)
    prev = {}
    for lo, hi in result.device_op_ranges():
        for i in range(lo + 1, hi):
            prev[i] = i - 1
    cur = max(range(len(result.ops)), key=lambda i: result.end_ms[i])
    path: list[PathStep] = []
    while True:
        d, a = result.ops[cur]
        s = result.start_ms[cur]
        path.append(PathStep("op", d, str(a), s, result.end_ms[cur], cur))
        arrived = [x for x in inc.get(cur, []) if abs(x[1] - s) <= EPS_MS]
        if arrived:
            xa, xb, producer = max(arrived, key=lambda x: x[0])
            path.append(PathStep("transfer", d, f"{result.ops[producer][1]} -> d{d}", xa, xb, cur))
            cur = producer
            continue
        p = prev.get(cur)
        if p is not None and abs(result.end_ms[p] - s) <= EPS_MS:
            cur = p
            continue
        break
    path.reverse()
    return path
