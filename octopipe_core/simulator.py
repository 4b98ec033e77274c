"""Simulate a plan: per-device timelines, memory curves and metrics.

The plan's DAG (see ``octopipe_core.graph`` for its networkx form) has compute nodes (F, B, W,
BW) on each device's compute stream, a send node on the producing device's communication stream
for every activation or gradient that crosses devices (it overlaps compute, runs in the order
its producers finish and holds the stream for ``size / bandwidth``), a receive node on the
consumer that adds the link latency (so a transfer takes ``p2p_latency + size / bandwidth``),
and memory events on the compute nodes (F allocates at its start, B/W/BW free at their end).
This module traverses that same DAG from flat arrays, which is what the tuner calls thousands
of times; ``graph.simulate_graph`` traverses the networkx form and tests check
that the two agree op for op.

Metric definitions (units in the names):

* ``step_time_ms``: makespan of one iteration, first operation to last on any device;
* ``bubble_ratio``: idle device time / (devices x step time) (the ZB "(p-1)/(m+p-1)" convention);
  ``bubble_ratio_vs_ideal`` is idle / busy (Megatron's "(p-1)/m" convention);
* ``comm_overlap_ratio``: share of transfer time during which the receiving device computes;
* ``lower_bound_ms``: total compute time over devices (no plan can be faster).

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> from octopipe_core.schedules import build_plan
>>> prof = Profile.from_dict(example_profile_dict())
>>> r = simulate(prof, build_plan(prof, "1f1b", devices=2, microbatches=4))
>>> round(r.step_time_ms, 3) > r.lower_bound_ms
True
"""

from __future__ import annotations

import bisect
import gc
from dataclasses import dataclass, field
from typing import Any

from octopipe_core.costs import StageCosts, stage_costs
from octopipe_core.dp_sync import TailOp, boundary_comm, tail_ops
from octopipe_core.errors import OctoPipeError
from octopipe_core.plan import Action, Plan, backward_kinds, find_order_cycle, producers
from octopipe_core.profile import Profile


@dataclass
class SimResult:
    """Everything a simulation produces; ``timeline()`` and ``memory_curves()`` build tables."""

    plan: Plan
    profile: Profile
    costs: StageCosts
    # per compute op, in the order of ``ops``
    ops: list[tuple[int, Action]]  # (device, action)
    start_ms: list[float]
    end_ms: list[float]
    # raw transfers: (producer op id, consumer op id, start, end) lists; see ``transfers``
    _xfers: tuple[list[int], list[int], list[float], list[float]]
    memory_cap_gib: float
    static_mib: list[float]
    peak_memory_gib: list[float]
    _transfers: list[tuple[int, int, Action, Action, float, float]] | None = field(
        default=None, repr=False
    )
    # with a deployment: gradient reductions, optimizer steps, parameter all-gathers
    tail: list[TailOp] = field(default_factory=list)

    @property
    def transfers(self) -> list[tuple[int, int, Action, Action, float, float]]:
        """Per transfer: (src device, dst device, producer, consumer, start_ms, end_ms)."""
        if self._transfers is None:
            ops = self.ops
            self._transfers = [
                (ops[i][0], ops[c][0], ops[i][1], ops[c][1], a, b)
                for i, c, a, b in zip(*self._xfers, strict=True)
            ]
        return self._transfers

    # ---- metrics --------------------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        return self.plan.num_devices

    @property
    def step_time_ms(self) -> float:
        """First operation to last, the cluster tail (reductions, optimizer) included."""
        if not self.end_ms:
            return 0.0
        end = max(self.end_ms)
        if self.tail:
            end = max(end, max(t.end_ms for t in self.tail))
        return end - min(self.start_ms)

    @property
    def compute_end_ms(self) -> float:
        """End of the last compute action (the step without its cluster tail)."""
        return max(self.end_ms, default=0.0) - min(self.start_ms, default=0.0)

    @property
    def exposed_tail_ms(self) -> float:
        """Time the step runs after its last compute action (reductions and optimizer)."""
        return self.step_time_ms - self.compute_end_ms

    @property
    def grad_sync_ms(self) -> float:
        """Total data-parallel reduction time over all devices' DP streams."""
        return sum(t.end_ms - t.start_ms for t in self.tail if t.kind == "grad_sync")

    def busy_ms(self) -> list[float]:
        busy = [0.0] * self.num_devices
        for (d, _), s, e in zip(self.ops, self.start_ms, self.end_ms, strict=True):
            busy[d] += e - s
        return busy

    @property
    def lower_bound_ms(self) -> float:
        return sum(self.busy_ms()) / max(1, self.num_devices)

    @property
    def bubble_ratio(self) -> float:
        total = self.step_time_ms * self.num_devices
        return 0.0 if total <= 0 else 1.0 - sum(self.busy_ms()) / total

    @property
    def bubble_ratio_vs_ideal(self) -> float:
        busy = sum(self.busy_ms())
        return 0.0 if busy <= 0 else (self.step_time_ms * self.num_devices - busy) / busy

    def device_spans_ms(self) -> list[float]:
        """Per device, time from its first operation's start to its last operation's end."""
        first = [float("inf")] * self.num_devices
        last = [0.0] * self.num_devices
        for (d, _), s, e in zip(self.ops, self.start_ms, self.end_ms, strict=True):
            first[d] = min(first[d], s)
            last[d] = max(last[d], e)
        return [
            max(0.0, b - a) if a != float("inf") else 0.0 for a, b in zip(first, last, strict=True)
        ]

    def device_idle_in_span_ms(self) -> list[float]:
        """Per device, idle time between its first and last operation."""
        busy = self.busy_ms()
        return [span - b for span, b in zip(self.device_spans_ms(), busy, strict=True)]

    @property
    def comm_time_ms(self) -> float:
        return sum(self._xfers[3]) - sum(self._xfers[2])

    @property
    def comm_overlap_ratio(self) -> float:
        """Share of transfer time hidden under compute on the receiving device (1.0 if none)."""
        total = self.comm_time_ms
        if total <= 0:
            return 1.0
        starts: list[list[float]] = [[] for _ in range(self.num_devices)]
        ends: list[list[float]] = [[] for _ in range(self.num_devices)]
        for (d, _), s, e in zip(self.ops, self.start_ms, self.end_ms, strict=True):
            starts[d].append(s)
            ends[d].append(e)
        hidden = 0.0
        for _, dst, _, _, a, b in self.transfers:
            st, en = starts[dst], ends[dst]  # sorted: a device runs its ops in order
            i = max(0, bisect.bisect_right(en, a))
            while i < len(st) and st[i] < b:
                hidden += max(0.0, min(b, en[i]) - max(a, st[i]))
                i += 1
        return hidden / total

    @property
    def fits_memory(self) -> bool:
        return all(p <= self.memory_cap_gib + 1e-9 for p in self.peak_memory_gib)

    @property
    def tokens_per_gpu_per_s(self) -> float:
        t = self.step_time_ms / 1000.0
        tokens = self.plan.num_microbatches * self.profile.tokens_per_microbatch
        gpus = self.num_devices * self.profile.device.gpus
        return 0.0 if t <= 0 else tokens / t / gpus

    def metrics(self) -> dict[str, Any]:
        """The JSON summary printed by ``octopipe simulate --json``."""
        return {
            "schedule": self.plan.name,
            "devices": self.num_devices,
            "stages": self.plan.num_stages,
            "microbatches": self.plan.num_microbatches,
            "step_time_ms": round(self.step_time_ms, 6),
            "lower_bound_ms": round(self.lower_bound_ms, 6),
            "bubble_ratio": round(self.bubble_ratio, 6),
            "bubble_ratio_definition": "idle device time / (devices x step time)",
            "bubble_ratio_vs_ideal": round(self.bubble_ratio_vs_ideal, 6),
            "comm_overlap_ratio": round(self.comm_overlap_ratio, 6),
            "comm_time_ms": round(self.comm_time_ms, 6),
            "peak_memory_gib": [round(x, 4) for x in self.peak_memory_gib],
            "memory_cap_gib": self.memory_cap_gib,
            "fits_memory": self.fits_memory,
            "tokens_per_gpu_per_s": round(self.tokens_per_gpu_per_s, 3),
            "max_device_span_ms": round(max(self.device_spans_ms(), default=0.0), 6),
            "partition": [list(r) for r in self.plan.partition],
            "placement": list(self.plan.placement),
            **self._cluster_metrics(),
        }

    def _cluster_metrics(self) -> dict[str, Any]:
        dep = self.profile.deployment
        if dep is None:
            return {}
        pl = self.plan.placement
        crossing = sum(
            1
            for b in range(self.plan.num_stages - 1)
            if pl[b] != pl[b + 1] and dep.crosses_nodes(pl[b], pl[b + 1])
        )
        return {
            "cluster": dep.cluster.name,
            "layout": dep.layout.to_dict(),
            "gpus": dep.layout.gpus,
            "global_batch_samples": dep.layout.dp * self.plan.num_microbatches,
            "inter_node_boundaries": crossing,
            "compute_end_ms": round(self.compute_end_ms, 6),
            "exposed_tail_ms": round(self.exposed_tail_ms, 6),
            "grad_sync_ms": round(self.grad_sync_ms, 6),
        }

    # ---- tables ---------------------------------------------------------------------------
    def timeline(self, include_comm: bool = True) -> Any:
        """A pandas DataFrame, one row per op: device, stream, kind, stage, mb, times, layers."""
        import numpy as np
        import pandas as pd

        labels = np.array([f"{lo}-{hi - 1}" for lo, hi in self.plan.partition], dtype=object)
        dev = [d for d, _ in self.ops]
        kind: list[str] = [str(a.kind) for _, a in self.ops]
        stage = [a.stage for _, a in self.ops]
        mb = [a.mb for _, a in self.ops]
        start, end = list(self.start_ms), list(self.end_ms)
        stream = ["compute"] * len(dev)
        layers = list(labels[np.asarray(stage, dtype=np.int64)]) if stage else []
        if include_comm:
            src, dst, xs, xe = self._xfers
            for i, c in zip(src, dst, strict=True):
                d, a = self.ops[i]
                dev.append(d)
                kind.append("send_F" if a.kind == "F" else "send_B")
                stage.append(a.stage)
                mb.append(a.mb)
                layers.append(f"to d{self.ops[c][0]}")
            start += xs
            end += xe
            stream += ["comm"] * len(src)
            dep = self.profile.deployment
            if dep is not None:
                for k in range(len(src)):
                    d_src, d_dst = dev[-len(src) + k], self.ops[dst[k]][0]
                    if dep.crosses_nodes(d_src, d_dst):
                        layers[-len(src) + k] += " (inter-node)"
            for t in self.tail:
                dev.append(t.device)
                kind.append(t.kind)
                stage.append(t.stage)
                mb.append(-1)
                layers.append("all stages" if t.stage < 0 else f"stage {t.stage}")
                start.append(t.start_ms)
                end.append(t.end_ms)
                stream.append("compute" if t.kind == "optimizer" else "dp")
        return pd.DataFrame(
            {
                "device": dev,
                "stream": stream,
                "kind": kind,
                "stage": stage,
                "mb": mb,
                "start_ms": start,
                "end_ms": end,
                "layers": layers,
            }
        )

    def device_op_ranges(self) -> list[tuple[int, int]]:
        """Per device, the index range of its ops in ``ops`` (device order, then its order)."""
        out, lo = [], 0
        for acts in self.plan.schedule:
            out.append((lo, lo + len(acts)))
            lo += len(acts)
        return out

    def memory_events(self, device: int) -> list[tuple[float, float]]:
        """``(time_ms, delta_mib)`` of ``device``'s activation memory, in time order: F
        allocates at its start, B/W/BW free at their end (``costs.OpTable``); a B or BW
        also holds its stage's working memory while it runs."""
        c = self.costs
        lo, hi = self.device_op_ranges()[device]
        out: list[tuple[float, float]] = []
        for i, (_, a) in enumerate(self.ops[lo:hi], start=lo):
            if a.kind == "F":
                out.append((self.start_ms[i], c.activation_mib[a.stage]))
                continue
            # the recomputed forward's activations and the working memory, while B runs
            t = c.ops
            up = t.alloc_mib[a.kind][a.stage] + t.hold_mib[a.kind][a.stage]
            if up:
                out.append((self.start_ms[i], up))
            out.append((self.end_ms[i], -t.free_mib[a.kind][a.stage] - t.hold_mib[a.kind][a.stage]))
        return out

    def memory_curves(self) -> Any:
        """A pandas DataFrame of step curves: device, time_ms, memory_gib (static included)."""
        import numpy as np
        import pandas as pd

        parts = []
        for d in range(self.num_devices):
            events = self.memory_events(d)
            t = np.fromiter((e[0] for e in events), float, len(events))
            delta = np.fromiter((e[1] for e in events), float, len(events))
            level = (self.static_mib[d] + np.concatenate(([0.0], np.cumsum(delta)))) / 1024
            times = np.concatenate(([0.0], t, [self.step_time_ms]))
            parts.append(
                pd.DataFrame(
                    {"device": d, "time_ms": times, "memory_gib": np.append(level, level[-1])}
                )
            )
        return pd.concat(parts, ignore_index=True)


def simulate(
    profile: Profile,
    plan: Plan,
    memory_cap_gib: float | None = None,
    *,
    check: bool = True,
    costs: StageCosts | None = None,
) -> SimResult:
    """Simulate ``plan`` on ``profile``; ``memory_cap_gib`` defaults to the device's memory.

    ``costs`` may pass ``stage_costs(profile, plan.partition)`` when the caller already has it
    (the tuner caches it per partition). Raises ``OctoPipeError`` if the device orders
    contradict the data dependencies.
    """
    if costs is None:
        costs = stage_costs(profile, plan.partition, plan.recompute)
    if profile.deployment is not None:
        profile.deployment.check(plan.num_devices, profile.device.gpus)
    cap = profile.device.memory_gib if memory_cap_gib is None else memory_cap_gib
    enabled = gc.isenabled()
    gc.disable()  # the traversal allocates many small objects and frees none of them
    try:
        return _simulate(profile, plan, costs, cap, check)
    finally:
        if enabled:
            gc.enable()


def _simulate(
    profile: Profile, plan: Plan, costs: StageCosts, cap: float, check: bool
) -> SimResult:
    S = plan.num_stages
    D = plan.num_devices
    placement = plan.placement
    table = costs.ops_on(placement)  # every op's time and memory (the one cost model)
    fms, bms, wms, bwms = (table.ms[k] for k in ("F", "B", "W", "BW"))
    wire, lat = boundary_comm(profile, plan, costs)

    # Flatten: one id per action. Every action has at most one data producer (F(s) <- F(s-1),
    # B(s) <- B(s+1) or F on the last stage, W(s) <- B(s)), so the DAG is stored as arrays.
    M = plan.num_microbatches
    ops: list[tuple[int, Action]] = [(d, a) for d, acts in enumerate(plan.schedule) for a in acts]
    n = len(ops)
    where = {"F": [-1] * (S * M), "B": [-1] * (S * M), "W": [-1] * (S * M), "BW": [-1] * (S * M)}
    for i, (_, a) in enumerate(ops):
        where[a.kind][a.stage * M + a.mb] = i
    idx_f, idx_b, idx_bw = where["F"], where["B"], where["BW"]
    dur = [0.0] * n
    prod = [-1] * n  # producer id
    xfer = [-1.0] * n  # wire time from the producer if it is on another device, else -1
    xlat = [0.0] * n  # link latency of that transfer
    rcons = [-1] * n  # the consumer on another device, if any
    for i, (d, a) in enumerate(ops):
        s, k, mb = a
        if k == "F":
            dur[i] = fms[s]
            if s == 0:
                continue
            ps = s - 1
            j = idx_f[ps * M + mb]
        elif k == "W":
            dur[i] = wms[s]
            ps = s
            j = idx_b[s * M + mb]
        else:
            dur[i] = bms[s] if k == "B" else bwms[s]
            if s == S - 1:
                ps = s
                j = idx_f[s * M + mb]
            else:
                ps = s + 1
                j = idx_b[ps * M + mb]
                if j < 0:
                    j = idx_bw[ps * M + mb]
        if j < 0:
            need = producers(a, S, backward_kinds(plan))[0]
            raise OctoPipeError(
                f"plan: field 'schedule': action {need} (needed by {a}) is missing; "
                "fix: every stage runs F and B+W (or BW) on every micro-batch"
            )
        prod[i] = j
        if placement[ps] != d:
            b = ps if ps < s else s
            xfer[i] = wire[b]
            xlat[i] = lat[b]
            rcons[j] = i

    start = [0.0] * n
    end = [0.0] * n
    done = [False] * n
    arrival = [0.0] * n
    x_src: list[int] = []
    x_dst: list[int] = []
    x_start: list[float] = []
    x_end: list[float] = []
    send_free = [0.0] * D
    dev_free = [0.0] * D
    pos = [0] * D
    lens = [len(x) for x in plan.schedule]
    base = [sum(lens[:d]) for d in range(D)]
    # Event-driven traversal: a device runs its list until the next op's producer is not done;
    # it then waits on that producer, and is woken when the producer completes. O(ops).
    waiter = [-1] * n
    ready = list(range(D - 1, -1, -1))
    remaining = n
    while ready:
        d = ready.pop()
        i = base[d] + pos[d]
        last = base[d] + lens[d]
        free = dev_free[d]
        sfree = send_free[d]
        while i < last:
            j = prod[i]
            t = free
            if j >= 0:
                if not done[j]:
                    waiter[j] = d
                    break
                at = end[j] if xfer[i] < 0 else arrival[i]
                if at > t:
                    t = at
            start[i] = t
            free = t + dur[i]
            end[i] = free
            done[i] = True
            ci = rcons[i]
            if ci >= 0:
                ts = free if free > sfree else sfree
                sfree = ts + xfer[ci]
                arrival[ci] = sfree + xlat[ci]
                x_src.append(i)
                x_dst.append(ci)
                x_start.append(ts)
                x_end.append(sfree + xlat[ci])
            w = waiter[i]
            if w >= 0:
                ready.append(w)
            i += 1
        remaining -= i - base[d] - pos[d]
        pos[d] = i - base[d]
        dev_free[d] = free
        send_free[d] = sfree
    if remaining:
        cyc = find_order_cycle(plan) if check else None
        path = " -> ".join(map(str, cyc)) if cyc else "unknown"
        raise OctoPipeError(
            f"plan: field 'schedule': the device orders contradict the data dependencies "
            f"(cycle {path}); fix: move one of these actions later on its device"
        )

    # Memory: each op allocates at its start, holds its working memory while it runs and frees
    # at its end (``costs.OpTable``). A device runs its ops one after another, so its list is
    # in time order.
    static = [0.0] * D
    dep = profile.deployment
    for s in range(S):
        static[placement[s]] += (
            costs.weight_mib[s] if dep is None else dep.static_mib(costs.weight_mib[s])
        )
    peaks = []
    alloc, hold, freed = table.alloc_mib, table.hold_mib, table.free_mib
    for d in range(D):
        level = peak = 0.0
        for i in range(base[d], base[d] + lens[d]):
            s, k = ops[i][1].stage, ops[i][1].kind
            level += alloc[k][s]
            if level + hold[k][s] > peak:
                peak = level + hold[k][s]
            level -= freed[k][s]
        peaks.append((static[d] + peak) / 1024.0)
    return SimResult(
        plan=plan,
        profile=profile,
        costs=costs,
        ops=ops,
        start_ms=start,
        end_ms=end,
        _xfers=(x_src, x_dst, x_start, x_end),
        memory_cap_gib=cap,
        static_mib=static,
        peak_memory_gib=peaks,
        tail=tail_ops(
            profile, plan, costs, lambda d, i: start[base[d] + i],
            [end[base[d] + lens[d] - 1] if lens[d] else 0.0 for d in range(D)],
        ) if dep is not None or profile.runtime.has_tail else [],
    )  # fmt: skip


def peak_inflight(result: SimResult, stage: int) -> int:
    """Peak number of micro-batches whose F of ``stage`` ran but whose memory is not yet freed."""
    ev = []
    for (_, a), s, e in zip(result.ops, result.start_ms, result.end_ms, strict=True):
        if a.stage != stage:
            continue
        if a.kind == "F":
            ev.append((s, 1))
        elif a.kind in ("W", "BW"):
            ev.append((e, -1))
    ev.sort()
    level = peak = 0
    for _, dlt in ev:
        level += dlt
        peak = max(peak, level)
    return peak
