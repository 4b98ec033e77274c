"""Forward-backward improvement of list schedules (double justification, as in project
scheduling).

The greedy rules of ``list_scheduler`` (oldest B first, then the oldest F, W in gaps) look
only at the device that is free; on layouts where several devices are nearly critical they
leave 3-6 % idle (nemotron-h-56b, 32 devices, V layout: 1,950 ms against a fill estimate of
1,830). Here every action instead gets a priority from a whole schedule:

1. **backward pass**: schedule the reversed dependency graph (an action is ready once every
   action that needs it is done, plus the transfer between them), each device taking the ready
   action that ended *last* in the previous forward schedule; reversing its times gives every
   action a latest start in a right-justified schedule;
2. **forward pass**: schedule the real graph with the simulator's timing (transfers share each
   device's send stream), each device taking the ready action with the *earliest* latest start;
   an F waits while the device's activation memory after it (plus one micro-batch of each
   later stage of the device) would exceed its budget.

The first backward pass starts from micro-batch order (F, then B, then W of each micro-batch);
``passes`` rounds of both are run and the best forward schedule is kept. With ``lookahead``,
a device about to start an action waits instead when an action of better priority arrives
within ``lookahead`` x that action's duration. Its makespan equals ``simulate(...)``'s step.

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> from octopipe_core.costs import stage_costs
>>> prof = Profile.from_dict(example_profile_dict())
>>> r = justified_schedule(stage_costs(prof, [(0, 2), (2, 4)]), [0, 1], 2, 4, None, passes=2)
>>> r is not None and len(r[0][0]) == 12
True
"""

from __future__ import annotations

import heapq
import time

from octopipe_core.costs import StageCosts
from octopipe_core.plan import Action, Kind

_EPS = 1e-9
_KINDS = (Kind.F, Kind.B, Kind.W)
Edges = list[list[tuple[int, float]]]


class Graph:
    """The F/B/W dependency graph of one layout: action ``k * S * M + s * M + i`` is kind
    ``k`` (F, B, W) of stage ``s`` on micro-batch ``i``; edges carry the transfer time (ms)
    between devices, and each stage runs its micro-batches in order."""

    def __init__(self, costs: StageCosts, placement: list[int], microbatches: int) -> None:
        S, M = len(placement), microbatches
        SM = S * M
        self.S, self.M, self.N = S, M, 3 * SM
        hop = [costs.wire_ms[s] + costs.latency_ms[s] for s in range(S)]
        preds: Edges = [[] for _ in range(self.N)]
        for s in range(S):
            for i in range(M):
                f = s * M + i
                b, w = SM + f, 2 * SM + f
                if s > 0:
                    far = placement[s - 1] != placement[s]
                    preds[f].append(((s - 1) * M + i, hop[s - 1] if far else 0.0))
                if i > 0:
                    preds[f].append((f - 1, 0.0))
                    preds[b].append((b - 1, 0.0))
                if s < S - 1:
                    far = placement[s + 1] != placement[s]
                    preds[b].append((SM + (s + 1) * M + i, hop[s] if far else 0.0))
                else:
                    preds[b].append((f, 0.0))
                preds[w].append((b, 0.0))
        succs: Edges = [[] for _ in range(self.N)]
        for a in range(self.N):
            for p, delay in preds[a]:
                succs[p].append((a, delay))
        self.preds, self.succs = preds, succs
        self.device = [placement[(a % SM) // M] for a in range(self.N)]
        ms = costs.ops_on(placement).ms  # the one cost model (``costs.OpTable``)
        per_stage = (ms["F"], ms["B"], ms["W"])
        self.dur = [x for arr in per_stage for x in arr for _ in range(M)]


def backward_pass(g: Graph, devices: int, end_ms: list[float]) -> list[float]:
    """Latest start (ms) of every action in a right-justified schedule of the reversed graph,
    each device taking first the ready action with the largest ``end_ms``."""
    N, dur, dev = g.N, g.dur, g.device
    cnt = [len(x) for x in g.succs]
    ready = [0.0] * N
    rend = [0.0] * N
    future: list[list[tuple[float, int]]] = [[] for _ in range(devices)]
    avail: list[list[tuple[float, int]]] = [[] for _ in range(devices)]
    free = [0.0] * devices
    events = [(0.0, d) for d in range(devices)]
    for a in range(N):
        if cnt[a] == 0:
            heapq.heappush(future[dev[a]], (0.0, a))
    while events:
        t, d = heapq.heappop(events)
        if t < free[d] - _EPS:
            continue
        fu, av = future[d], avail[d]
        while fu and fu[0][0] <= t + _EPS:
            a = heapq.heappop(fu)[1]
            heapq.heappush(av, (-end_ms[a], a))
        if not av:
            if fu:
                heapq.heappush(events, (fu[0][0], d))
            continue
        a = heapq.heappop(av)[1]
        e = t + dur[a]
        rend[a] = free[d] = e
        heapq.heappush(events, (e, d))
        for p, delay in g.preds[a]:
            ready[p] = max(ready[p], e + delay)
            cnt[p] -= 1
            if cnt[p] == 0:
                dp = dev[p]
                heapq.heappush(future[dp], (ready[p], p))
                if dp != d:
                    heapq.heappush(events, (max(ready[p], free[dp]), dp))
    top = max(rend)
    return [top - x for x in rend]


def forward_pass(
    g: Graph,
    costs: StageCosts,
    placement: list[int],
    devices: int,
    prio: list[float],
    budget_mib: list[float] | None,
    lookahead: float = 0.0,
) -> tuple[list[list[Action]], float, list[float]] | None:
    """Orders, makespan (ms) and per-action end times (ms) of the forward list schedule by
    ``prio`` (smallest first); ``None`` if memory stalls it."""
    S, M, N = g.S, g.M, g.N
    SM = S * M
    dur, dev = g.dur, g.device
    table = costs.ops  # the one cost model: what each F, B and W leaves allocated (memory)
    act = table.alloc_mib["F"]
    net = [[table.net_mib(k, s) for s in range(S)] for k in _KINDS]
    wire, lat = costs.wire_ms, costs.latency_ms
    stages_of: list[list[int]] = [[] for _ in range(devices)]
    for s, d in enumerate(placement):
        stages_of[d].append(s)
    reserve = [sum(act[t] for t in stages_of[placement[s]] if t > s) for s in range(S)]
    budget = [float("inf")] * devices if budget_mib is None else list(budget_mib)
    cnt = [len(x) for x in g.preds]
    ready = [0.0] * N
    end = [0.0] * N
    future: list[list[tuple[float, int]]] = [[] for _ in range(devices)]
    avail: list[list[int]] = [[] for _ in range(devices)]
    w_heap: list[list[tuple[float, int]]] = [[] for _ in range(devices)]
    free, send_free = [0.0] * devices, [0.0] * devices
    mem = [0.0] * devices
    order: list[list[Action]] = [[] for _ in range(devices)]
    events = [(0.0, d) for d in range(devices)]
    for a in range(N):
        if cnt[a] == 0:
            heapq.heappush(future[dev[a]], (0.0, a))
    done = 0
    while events:
        t, d = heapq.heappop(events)
        if t < free[d] - _EPS:
            continue
        fu, av, wh = future[d], avail[d], w_heap[d]
        while fu and fu[0][0] <= t + _EPS:
            av.append(heapq.heappop(fu)[1])
        best, bp, blocked = -1, float("inf"), False
        for a in av:
            if a < SM and mem[d] + act[a // M] + reserve[a // M] > budget[d] + _EPS:
                blocked = True
                continue
            if prio[a] < bp:
                best, bp = a, prio[a]
        if wh and (wh[0][0] < bp or (blocked and best < 0)):
            best, bp = wh[0][1], wh[0][0]
        if best >= 0 and lookahead > 0:
            soon = next((r for r, a in fu if r - t < lookahead * dur[best] and prio[a] < bp), None)
            if soon is not None:
                heapq.heappush(events, (soon, d))
                continue
        if best < 0:
            if fu:
                heapq.heappush(events, (fu[0][0], d))
            continue
        a = best
        if a >= 2 * SM:
            heapq.heappop(wh)
        else:
            av.remove(a)
        k, rest = divmod(a, SM)
        s, i = divmod(rest, M)
        e = t + dur[a]
        end[a] = free[d] = e
        done += 1
        order[d].append(Action(s, _KINDS[k], i))
        mem[d] += net[k][s]
        heapq.heappush(events, (e, d))
        sent = False
        for q, _delay in g.succs[a]:
            dq = dev[q]
            if dq != d:
                boundary = s if (q % SM) // M > s else s - 1
                if not sent:  # one message per output, on the sender's stream
                    send_free[d] = max(e, send_free[d]) + wire[boundary]
                    sent = True
                r = send_free[d] + lat[boundary]
            else:
                r = e
            ready[q] = max(ready[q], r)
            cnt[q] -= 1
            if cnt[q] == 0:
                if q >= 2 * SM:
                    heapq.heappush(w_heap[dq], (prio[q], q))
                else:
                    heapq.heappush(future[dq], (ready[q], q))
                if dq != d:
                    heapq.heappush(events, (max(ready[q], free[dq]), dq))
    if done != N:
        return None
    return order, max(free), end


def justified_schedule(
    costs: StageCosts,
    placement: list[int],
    devices: int,
    microbatches: int,
    budget_mib: list[float] | None,
    passes: int = 3,
    lookahead: float = 0.0,
    start: dict[Action, float] | None = None,
    deadline: float | None = None,
) -> tuple[list[list[Action]], float] | None:
    """The best of ``passes`` backward-then-forward rounds (module docstring): per-device
    orders and makespan (ms); ``None`` if the first forward pass stalls on memory, or when
    stages recompute (not modelled here).
    ``start`` gives the end time (ms) of every F, B and W in a schedule to improve (default:
    micro-batch order). Rounds stop at ``deadline`` (``time.perf_counter()``), keeping the
    best found so far (the first round always runs)."""
    if costs.recompute_mib and any(costs.recompute_mib):
        return None
    g = Graph(costs, placement, microbatches)
    S, M = g.S, g.M
    SM = S * M
    if start is not None:
        end_ms = [0.0] * g.N
        for a, e in start.items():
            end_ms[_KINDS.index(a.kind) * SM + a.stage * M + a.mb] = e
    else:  # micro-batch order: F, B, W of micro-batch 0 end first, then those of 1, ...
        end_ms = [float(3 * (a % M) + a // SM) for a in range(g.N)]
    best: tuple[list[list[Action]], float] | None = None
    for k in range(passes):
        if k > 0 and deadline is not None and time.perf_counter() > deadline:
            break
        prio = backward_pass(g, devices, end_ms)
        r = forward_pass(g, costs, placement, devices, prio, budget_mib, lookahead)
        if r is None:
            break
        order, span, end_ms = r
        if best is None or span < best[1] - 1e-9:
            best = (order, span)
    return best
