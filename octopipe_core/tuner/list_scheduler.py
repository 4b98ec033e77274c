"""Cost-aware, event-driven greedy list scheduler (the zero-bubble idea with real costs).

Unlike ``schedules.greedy_zb_order`` (unit costs, fixed ticks), this scheduler advances a real
clock: every device, when it becomes free, picks among the actions whose inputs have arrived,
using the per-stage F/B/W times of ``costs.stage_costs`` and the boundary transfer times (sends
share one communication stream per device, as in the simulator). Rules, in priority order:

1. the oldest ready **B** (it unblocks the upstream device and frees memory);
2. the oldest ready **F**, if the device's activation memory after it (plus one micro-batch of
   each later stage on the same device, so the pipeline can always drain) stays under the
   device's budget in MiB, and, for the device's first stage (where micro-batches enter it),
   the device holds fewer than its in-flight limit of forwards awaiting their B;
3. a pending **W** (fewest dependencies) to fill the gap, or to free memory when an F is
   blocked by the budget;
4. otherwise wait for the next arrival.

The :class:`Policy` varies the in-flight limit, how eagerly W fills gaps and which stage's F
goes first; ``POLICIES`` lists the variants the tuner tries. Timing and memory follow the
simulator exactly, so the returned makespan equals ``simulate(...).step_time_ms`` (an upper
bound of it for policies with ``w_reserve``).

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> from octopipe_core.costs import stage_costs
>>> prof = Profile.from_dict(example_profile_dict())
>>> r = list_schedule(stage_costs(prof, [(0, 2), (2, 4)]), [0, 1], 2, 4, None, POLICIES[0])
>>> " ".join(map(str, r.order[1][:4]))
'1F0 1B0 1F1 1B1'
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

from octopipe_core.costs import StageCosts
from octopipe_core.plan import Action

_EPS = 1e-9


@dataclass(frozen=True)
class Policy:
    """One variant of the list scheduler.

    * ``inflight``: in-flight limit factor (0 = memory budget only); the limit of device ``d``
      is ``factor x`` the number of stages from its first stage to the end of the pipeline,
      scaled by its share of stages;
    * ``w_fill``: ``"greedy"`` runs a pending W whenever nothing else is ready, ``"lookahead"``
      only when the next known F/B arrival is at least half a W away;
    * ``f_first``: ``"oldest"`` runs the oldest micro-batch's F first, ``"deepest"`` the F of
      the latest stage first (fewer activations held);
    * ``f_pull``: when > 0 (with ``"oldest"``), an F whose output goes to another device moves
      ahead of up to ``f_pull / (1 + h)`` older micro-batches, ``h`` being the work that device
      has in hand (ms: the rest of its running op, the F and B whose inputs have arrived): a
      device about to run dry is fed first (``PULL_POLICY``);
    * ``f_ahead``: when > 0, a ready F goes before a ready B unless the B's micro-batch is at
      least ``f_ahead`` older (micro-batches enter the pipeline sooner, at some memory cost);
    * ``w_reserve``: while the device still has forwards or backwards to run, an idle gap
      runs a pending W only if more than ``w_reserve`` x (the device's number of stages) W are
      pending, so that W are left to fill the drain at the end of the step (zero-bubble
      style; they keep their stash meanwhile, and run anyway when memory blocks an F). A W
      held back may then start after an idle gap, so the makespan is only an upper bound of
      the simulated step of the same orders (the tuner always keeps the simulated one).
    """

    inflight: float = 0.0
    w_fill: str = "greedy"
    f_first: str = "oldest"
    f_ahead: int = 0
    w_reserve: float = 0.0
    f_pull: float = 0.0

    @property
    def name(self) -> str:
        lim = "mem" if self.inflight <= 0 else f"x{self.inflight:g}"
        ahead = f",F+{self.f_ahead}" if self.f_ahead else ""
        keep = f",W>{self.w_reserve:g}" if self.w_reserve else ""
        pull = f",pull{self.f_pull:g}" if self.f_pull else ""
        return f"ls[{lim},{self.w_fill},{self.f_first}{ahead}{keep}{pull}]"


POLICIES: tuple[Policy, ...] = (
    Policy(0.0, "greedy", "oldest"),
    Policy(0.0, "lookahead", "oldest"),
    Policy(1.5, "lookahead", "oldest"),
    Policy(0.0, "lookahead", "oldest", 4),
    Policy(1.0, "greedy", "oldest"),
    Policy(2.0, "greedy", "oldest"),
    Policy(1.5, "lookahead", "oldest", 2),
    Policy(0.0, "greedy", "deepest"),
    Policy(1.0, "lookahead", "oldest"),
    Policy(0.0, "greedy", "oldest", 2),
    Policy(2.0, "lookahead", "deepest"),
    Policy(1.5, "greedy", "oldest"),
    Policy(0.0, "lookahead", "oldest", 0, 0.5),
    Policy(0.0, "lookahead", "oldest", 0, 1.0),
)


# one micro-batch in flight per device entry, W right away: the least activation memory
LEAN_POLICY = Policy(1e-6, "greedy", "deepest")
# forwards that feed devices running dry go first: with many stages per device and few
# micro-batches the forward wave otherwise leaves devices idle before the first B (the tuned
# layouts of jamba-v0.1 and nemotron-h-56b, 8 devices, 16 micro-batches: 1,472 and 1,677 ms
# list-scheduled, against 1,500-1,619 and 1,716-1,790 with ``POLICIES``); a justify move
# starts from its times (``moves_schedule.pull_justify_thunk``)
PULL_POLICY = Policy(0.0, "greedy", "oldest", f_pull=512.0)


@dataclass
class ListResult:
    """Per-device orders, the makespan (ms) and the per-device activation peak (MiB)."""

    order: list[list[Action]]
    makespan_ms: float
    peak_act_mib: list[float]
    policy: Policy


def inflight_limits(placement: list[int], num_devices: int, factor: float) -> list[float]:
    """Per-device limit on forwards awaiting their B (``inf`` when ``factor <= 0``).

    >>> inflight_limits([0, 1, 2, 3], 4, 1.0)
    [4, 3, 2, 1]
    """
    if factor <= 0:
        return [float("inf")] * num_devices
    S = len(placement)
    per = S / num_devices
    out: list[float] = []
    for d in range(num_devices):
        mine = [s for s in range(S) if placement[s] == d]
        if not mine:
            out.append(float("inf"))
            continue
        hops = S - min(mine)
        out.append(max(1, round(factor * hops * len(mine) / per)))
    return out


def list_schedule(
    costs: StageCosts,
    placement: list[int],
    num_devices: int,
    microbatches: int,
    budget_mib: list[float] | None,
    policy: Policy,
    bound_ms: float | None = None,
) -> ListResult | None:
    """Schedule every F, B and W; ``None`` if the memory budgets make the pipeline stall.

    ``budget_mib[d]`` is the activation memory device ``d`` may hold (its cap minus its
    weights); ``None`` means unlimited. With ``bound_ms``, it also gives up (``None``) as soon
    as some device's start time plus its remaining work exceeds that bound.
    """
    S, D, M = len(placement), num_devices, microbatches
    table = costs.ops_on(placement)  # every op's time and memory (the one cost model)
    f, b, w = table.ms["F"], table.ms["B"], table.ms["W"]
    act = table.alloc_mib["F"]
    rec = table.alloc_mib["B"]  # allocated by a recomputing B at its start
    b_free, w_free = table.free_mib["B"], table.free_mib["W"]
    wire, lat = costs.wire_ms, costs.latency_ms
    stages_of: list[list[int]] = [[] for _ in range(D)]
    for s, d in enumerate(placement):
        stages_of[d].append(s)
    # room kept for later stages' forwards and for the largest recomputation on the device
    # (the backwards' working memory is out of ``budget_mib`` already)
    top_rec = [max((rec[t] for t in st), default=0.0) for st in stages_of]
    reserve = [
        sum(act[t] for t in stages_of[placement[s]] if t > s) + top_rec[placement[s]]
        for s in range(S)
    ]
    first = [min(st) if st else -1 for st in stages_of]
    budget = [float("inf")] * D if budget_mib is None else list(budget_mib)
    limit = inflight_limits(placement, D, policy.inflight)
    greedy_w = policy.w_fill == "greedy"
    keep_w = [policy.w_reserve * len(st) for st in stages_of]
    fb_left = [2 * M * len(st) for st in stages_of]  # forwards and backwards still to run
    deepest = policy.f_first == "deepest"
    pull = 0.0 if deepest else policy.f_pull
    f_before_b = policy.f_ahead > 0
    ahead = policy.f_ahead

    f_arr: list[list[float | None]] = [[None] * M for _ in range(S)]
    b_arr: list[list[float | None]] = [[None] * M for _ in range(S)]
    f_arr[0] = [0.0] * M
    f_next, b_next = [0] * S, [0] * S
    wq: list[deque[int]] = [deque() for _ in range(D)]  # encoded s * M + i
    mem, peak = [0.0] * D, [0.0] * D
    fwd_only = [0] * D
    free, send_free = [0.0] * D, [0.0] * D
    nxt = [0.0] * D  # time of the device's live heap entry, or -1 when waiting
    order: list[list[tuple[int, str, int]]] = [[] for _ in range(D)]
    left = [0.0] * D  # remaining work per device
    for st in range(S):
        left[placement[st]] += (f[st] + b[st] + w[st]) * M
    bound = float("inf") if bound_ms is None else bound_ms * (1 + 1e-9) + _EPS
    heap = [(0.0, d) for d in range(D)]
    remaining = 3 * S * M

    def in_hand(e: int, t: float) -> float:
        """Work device ``e`` has at ``t``: the rest of its running op, and the F and B whose
        inputs have arrived (ms)."""
        h = free[e] - t if free[e] > t else 0.0
        for s2 in stages_of[e]:
            i2 = f_next[s2]
            if i2 < M:
                a2 = f_arr[s2][i2]
                if a2 is not None and a2 <= t + _EPS:
                    h += f[s2]
            j2 = b_next[s2]
            if j2 < i2:
                a2 = b_arr[s2][j2]
                if a2 is not None and a2 <= t + _EPS:
                    h += b[s2]
        return h

    def wake(d: int, at: float) -> None:
        t = at if at > free[d] else free[d]
        if nxt[d] < 0 or t < nxt[d] - _EPS:
            nxt[d] = t
            heapq.heappush(heap, (t, d))

    def deliver(src: int, end: float, dst_stage: int, boundary: int, fwd: bool, i: int) -> None:
        dst = placement[dst_stage]
        if dst == src:
            at = end
        else:
            ts = end if end > send_free[src] else send_free[src]
            send_free[src] = ts + wire[boundary]
            at = send_free[src] + lat[boundary]
        (f_arr if fwd else b_arr)[dst_stage][i] = at
        if dst != src:
            wake(dst, at)

    while heap:
        t, d = heapq.heappop(heap)
        if abs(t - nxt[d]) > _EPS or t < free[d] - _EPS:
            continue
        best_b = None  # (arrival, i, -s)
        next_arr = float("inf")
        for s in stages_of[d]:
            i = b_next[s]
            if i < f_next[s]:
                a = b_arr[s][i]
                if a is not None:
                    if a <= t + _EPS:
                        key = (i, -s)
                        if best_b is None or key < best_b:
                            best_b = key
                    elif a < next_arr:
                        next_arr = a
        kind, s_pick, i_pick = "", -1, -1
        if (
            best_b is not None
            and rec[-best_b[1]]
            and wq[d]
            and mem[d] + rec[-best_b[1]] > budget[d] + _EPS
        ):  # a recomputing B would not fit yet: a pending W frees its stash first
            code = wq[d].popleft()
            kind, s_pick, i_pick = "W", code // M, code % M
        elif best_b is not None and not f_before_b:
            kind, i_pick, s_pick = "B", best_b[0], -best_b[1]
        else:
            best_f: tuple[float, int] | None = None
            f_stage = f_mb = -1  # the stage and micro-batch of best_f
            hand: dict[int, float] = {}  # in_hand per receiving device, for this choice
            mem_blocked = False
            mem_wait = False  # some F (ready or not) waits for memory: W must not be held
            for s in stages_of[d]:
                i = f_next[s]
                if i >= M:
                    continue
                a = f_arr[s][i]
                if a is None:
                    continue
                if fwd_only[d] >= limit[d] and s == first[d]:
                    continue
                if mem[d] + act[s] + reserve[s] > budget[d] + _EPS:
                    mem_wait = True
                    if a <= t + _EPS:
                        mem_blocked = True
                    continue
                if a <= t + _EPS:
                    if deepest:
                        fkey: tuple[float, int] = (-s, i)
                    elif pull and s < S - 1 and (e := placement[s + 1]) != d:
                        if e not in hand:
                            hand[e] = in_hand(e, t)
                        fkey = (i - pull / (1.0 + hand[e]), -s)
                    else:
                        fkey = (i, -s)
                    if best_f is None or fkey < best_f:
                        best_f = fkey
                        f_stage, f_mb = s, i
                elif a < next_arr:
                    next_arr = a
            if best_b is not None and (best_f is None or best_b[0] <= f_mb - ahead):
                kind, i_pick, s_pick = "B", best_b[0], -best_b[1]
            elif best_f is not None:
                kind = "F"
                s_pick, i_pick = f_stage, f_mb
            elif wq[d]:
                code = wq[d][0]
                ws = code // M
                if (
                    greedy_w
                    or mem_blocked
                    or next_arr == float("inf")
                    or next_arr - t >= 0.5 * w[ws] - _EPS
                ) and (mem_wait or len(wq[d]) > keep_w[d] or fb_left[d] == 0):
                    wq[d].popleft()
                    kind, s_pick, i_pick = "W", ws, code % M
        if not kind:
            if next_arr < float("inf"):
                nxt[d] = next_arr
                heapq.heappush(heap, (next_arr, d))
            else:
                nxt[d] = -1.0
            continue
        # run it
        s, i = s_pick, i_pick
        if t + left[d] > bound:
            return None
        order[d].append((s, kind, i))
        remaining -= 1
        if kind != "W":
            fb_left[d] -= 1
        if kind == "F":
            end = t + f[s]
            left[d] -= f[s]
            mem[d] += act[s]
            if mem[d] > peak[d]:
                peak[d] = mem[d]
            f_next[s] = i + 1
            fwd_only[d] += 1
            if s < S - 1:
                deliver(d, end, s + 1, s, True, i)
            else:
                b_arr[s][i] = end
        elif kind == "B":
            end = t + b[s]
            left[d] -= b[s]
            if rec[s] and mem[d] + rec[s] > peak[d]:
                peak[d] = mem[d] + rec[s]
            mem[d] += rec[s] - b_free[s]
            b_next[s] = i + 1
            fwd_only[d] -= 1
            wq[d].append(s * M + i)
            if s > 0:
                deliver(d, end, s - 1, s - 1, False, i)
        else:
            end = t + w[s]
            left[d] -= w[s]
            mem[d] -= w_free[s]
        free[d] = end
        nxt[d] = end
        heapq.heappush(heap, (end, d))
    if remaining:
        return None
    actions = [[Action._make(a) for a in row] for row in order]
    return ListResult(actions, max(free), peak, policy)
