"""The plan's DAG as a networkx graph: its public, inspectable form.

Nodes (tuples, all with a ``kind`` attribute):

* ``("compute", Action)``: F, B, W or BW on ``device``'s compute stream, with ``duration_ms``
  and memory events ``mem_alloc_mib`` (at its start) and ``mem_free_mib`` (at its end);
* ``("send", producer, consumer)``: the transfer on the producer device's comm stream, which
  it holds for ``duration_ms = size / bandwidth``;
* ``("recv", producer, consumer)``: its arrival on the consumer device, ``duration_ms`` = the
  link latency (so a transfer takes ``p2p_latency + size / bandwidth`` in all).

Edges carry ``dep``: ``"data"`` (same-device data dependency), ``"order"`` (per-device compute
order), ``"comm"`` (producer -> send -> recv -> consumer) and ``"stream"`` (per-device send
order: sends leave in the order their producers run).

``simulate_graph`` traverses it in topological order (start = latest predecessor end); tests
check that it agrees op for op with ``simulator.simulate``, the flat-array traversal.

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> from octopipe_core.schedules import build_plan
>>> prof = Profile.from_dict(example_profile_dict())
>>> g = build_graph(prof, build_plan(prof, "1f1b", devices=2, microbatches=2))
>>> sorted({k for _, k in g.nodes(data="kind")})
['compute', 'recv', 'send']
"""

from __future__ import annotations

from typing import Any

import networkx as nx

from octopipe_core.costs import stage_costs
from octopipe_core.dp_sync import boundary_comm, device_buckets, device_weight_mib, optimizer_ms
from octopipe_core.errors import OctoPipeError
from octopipe_core.plan import Action, Kind, Plan, backward_kinds, producers
from octopipe_core.profile import Profile


def build_graph(profile: Profile, plan: Plan) -> nx.DiGraph:
    """Build the DAG of compute, communication and memory events for ``plan``."""
    c = stage_costs(profile, plan.partition, plan.recompute)
    wire, lat = boundary_comm(profile, plan, c)
    S = plan.num_stages
    bkind = backward_kinds(plan)
    g = nx.DiGraph(profile=profile.name, plan=plan.name)
    for d, acts in enumerate(plan.schedule):
        prev = None
        for a in acts:
            s, k = a.stage, a.kind
            t = c.ops_on(plan.placement)  # the one cost model (``costs.OpTable``)
            dur = t.ms[k][s]
            hold = t.hold_mib[k][s]  # a backward's working memory, held while it runs
            alloc = t.alloc_mib[k][s] + hold
            free = t.free_mib[k][s] + hold
            node = ("compute", a)
            g.add_node(
                node, kind="compute", op=k, device=d, stage=s, mb=a.mb, duration_ms=dur,
                mem_alloc_mib=alloc, mem_free_mib=free,
            )  # fmt: skip
            if prev is not None:
                g.add_edge(prev, node, dep="order")
            prev = node
    last_send: dict[int, Any] = {}
    for d, acts in enumerate(plan.schedule):  # sends leave in producer order on each device
        for a in acts:
            for cons in _remote_consumers(a, plan, S, bkind):
                send = ("send", a, cons)
                recv = ("recv", a, cons)
                size_stage = min(a.stage, cons.stage)
                g.add_node(
                    send, kind="send", device=d, duration_ms=wire[size_stage],
                    size_mib=c.output_mib[size_stage],
                )  # fmt: skip
                g.add_node(
                    recv, kind="recv", device=plan.placement[cons.stage],
                    duration_ms=lat[size_stage],
                )  # fmt: skip
                g.add_edge(("compute", a), send, dep="comm")
                g.add_edge(send, recv, dep="comm")
                g.add_edge(recv, ("compute", cons), dep="comm")
                if d in last_send:
                    g.add_edge(last_send[d], send, dep="stream")
                last_send[d] = send
    for d, acts in enumerate(plan.schedule):
        for a in acts:
            for p in producers(a, S, bkind):
                if ("compute", p) not in g:
                    raise OctoPipeError(f"plan: action {p} (needed by {a}) is missing")
                if plan.placement[p.stage] == d:
                    g.add_edge(("compute", p), ("compute", a), dep="data")
    if profile.deployment is not None or profile.runtime.has_tail:
        _add_tail(g, profile, plan, c)
    return g


def _add_tail(g: nx.DiGraph, profile: Profile, plan: Plan, c: Any) -> None:
    """Gradient reductions, optimizer steps and ZeRO-1 all-gathers (see ``dp_sync``).

    A bucket is ready some time after its stage's last W/BW starts: a zero-length
    ``("wstart", action)`` node shares that action's predecessors and a ``("ready", ...)``
    node lasts the offset. Each device's DP stream is a chain of ``grad_sync`` nodes."""
    dep = profile.deployment
    dp = dep.layout.dp if dep is not None else 1
    zero1 = dep is not None and dep.layout.zero1
    overlap = dep is not None and dep.layout.overlap_grad_reduce
    per_dev = device_buckets(profile, plan) if dep is not None else [[]] * plan.num_devices
    sync_ms = profile.runtime.step_tail_ms  # the step's small all-reduce: a barrier
    if sync_ms > 0:
        g.add_node(("step_sync",), kind="marker", device=-1, duration_ms=sync_ms)
    ends: list[Any] = []
    for d, items in enumerate(per_dev):
        last = ("compute", plan.schedule[d][-1]) if plan.schedule[d] else None
        prev: Any = None
        for k, (i, b) in enumerate(items if dp > 1 else []):
            a = plan.schedule[d][i]
            ready = ("ready", d, b.stage, k)
            if overlap:
                ws = ("wstart", a)
                if ws not in g:
                    g.add_node(ws, kind="marker", device=d, duration_ms=0.0)
                    for p in list(g.predecessors(("compute", a))):
                        g.add_edge(p, ws, dep="marker")
                g.add_node(ready, kind="marker", device=d, duration_ms=b.ready_offset_ms)
                g.add_edge(ws, ready, dep="ready")
            else:
                g.add_node(ready, kind="marker", device=d, duration_ms=0.0)
                g.add_edge(last, ready, dep="ready")
            node = ("grad_sync", d, b.stage, k)
            dur = dep.grad_sync_ms(d, b.grad_mib)
            g.add_node(
                node, kind="grad_sync", device=d, stage=b.stage, duration_ms=dur,
                size_mib=b.grad_mib,
            )  # fmt: skip
            g.add_edge(ready, node, dep="ready")
            if prev is not None:
                g.add_edge(prev, node, dep="stream")
            prev = node
        ends.append([p for p in (prev, last) if p is not None])
    for d, items in enumerate(per_dev):
        opt = ("optimizer", d)
        g.add_node(opt, kind="optimizer", device=d,
                   duration_ms=optimizer_ms(profile, device_weight_mib(plan, c, d)))  # fmt: skip
        for p in ends[d]:
            g.add_edge(p, opt, dep="stream")
        if sync_ms > 0:
            for p in ends[d]:
                g.add_edge(p, ("step_sync",), dep="stream")
            g.add_edge(("step_sync",), opt, dep="stream")
        prev = opt
        for k, (_, b) in enumerate(items if zero1 and dp > 1 else []):
            node = ("param_gather", d, b.stage, k)
            g.add_node(node, kind="param_gather", device=d, stage=b.stage,
                       duration_ms=dep.param_gather_ms(d, b.param_mib))  # fmt: skip
            g.add_edge(prev, node, dep="stream")
            prev = node


def _remote_consumers(a: Action, plan: Plan, S: int, bkind: dict[tuple[int, int], Kind]) -> list:
    s, k, m = a
    out = []
    if k == "F" and s + 1 < S:
        out.append(Action(s + 1, Kind.F, m))
    elif k in ("B", "BW") and s > 0:
        out.append(Action(s - 1, bkind.get((s - 1, m), Kind.B), m))
    return [x for x in out if plan.placement[x.stage] != plan.placement[s]]


def simulate_graph(g: nx.DiGraph) -> dict[Any, tuple[float, float]]:
    """Start and end time (ms) of every node, by a longest-path pass in topological order.

    Raises ``OctoPipeError`` if the graph has a cycle (orders contradict dependencies).
    """
    times: dict[Any, tuple[float, float]] = {}
    try:
        order = list(nx.topological_sort(g))
    except nx.NetworkXUnfeasible:
        cyc = nx.find_cycle(g)
        path = " -> ".join(str(u[1]) if u[0] == "compute" else str(u) for u, _ in cyc)
        raise OctoPipeError(
            f"plan: field 'schedule': the device orders contradict the data dependencies "
            f"(cycle {path}); fix: move one of these actions later on its device"
        ) from None
    for n in order:
        start = max((times[p][1] for p in g.predecessors(n)), default=0.0)
        times[n] = (start, start + g.nodes[n]["duration_ms"])
    return times


def critical_path(g: nx.DiGraph) -> list[Any]:
    """The nodes of the longest (critical) path, weighted by duration."""
    times = simulate_graph(g)
    node = max(times, key=lambda n: times[n][1])
    path = [node]
    while True:
        preds = list(g.predecessors(node))
        if not preds:
            break
        node = max(preds, key=lambda p: times[p][1])
        path.append(node)
    return path[::-1]
