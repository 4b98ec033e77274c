"""Schedule moves: reorder each device's actions on a fixed layout.

* **re-plan**: the list scheduler with every policy not tried yet on this layout;
* **split backward**: turn each fused ``BW`` into ``B`` then ``W`` (the upstream gradient
  leaves earlier; W can then move);
* **advance**: move a later F, B or W whose inputs were already there into an idle gap, which
  also hides a receive under computation;
* **delay W**: push a W that held back a ready F or B behind it (W has the fewest
  dependencies, so it fills the drain);
* **advance W (memory)**: on a device over its cap, run a pending W before the F that makes
  the peak, since W frees the stash B kept;
* **justify**: forward-backward improvement of the whole schedule (``justify.py``): right-
  justify it, then list-schedule by the latest starts found (3-6 % off the greedy orders on
  V layouts with many near-critical devices).

Every move is checked by the simulator (a reorder that deadlocks is dropped).

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> from octopipe_core.schedules import build_plan
>>> from octopipe_core.tuner.evaluate import Evaluator
>>> prof = Profile.from_dict(example_profile_dict())
>>> ev = Evaluator(prof, devices=2, microbatches=4, cap_gib=80.0)
>>> peer = build_plan(prof, "1f1b", 2, 4)
>>> inc = ev.from_order(peer.partition, peer.placement, peer.schedule, "1f1b")
>>> any(p.move is Move.SPLIT_BACKWARD for p in schedule_proposals(ev, inc))
True
"""

from __future__ import annotations

from collections.abc import Callable

from octopipe_core.plan import Action, Kind, backward_kinds, producers
from octopipe_core.tuner.evaluate import Candidate, Evaluator, Move, Phase, Proposal, proposal
from octopipe_core.tuner.justify import justified_schedule
from octopipe_core.tuner.list_scheduler import POLICIES, PULL_POLICY, Policy

_EPS = 1e-9


class Timeline:
    """Per-device start/end/ready times of a simulated candidate, by order position."""

    def __init__(self, cand: Candidate) -> None:
        r, plan = cand.result, cand.plan
        self.plan = plan
        self.start: list[list[float]] = [[] for _ in range(plan.num_devices)]
        self.end: list[list[float]] = [[] for _ in range(plan.num_devices)]
        for (d, _a), s, e in zip(r.ops, r.start_ms, r.end_ms, strict=True):
            self.start[d].append(s)
            self.end[d].append(e)
        self.pos = {a: (d, k) for d, acts in enumerate(plan.schedule) for k, a in enumerate(acts)}
        arrive: dict[Action, float] = {}
        for *_x, _p, cons, _ts, te in r.transfers:
            arrive[cons] = max(arrive.get(cons, 0.0), te)
        bkind = backward_kinds(plan)
        S = plan.num_stages
        pair_arrive = {(p, c): te for *_x, p, c, _ts, te in r.transfers}
        self.ready: dict[Action, float] = {}
        self.local_prods: dict[Action, list[int]] = {}
        self.prod_arrival: dict[Action, list[tuple[Action, float]]] = {}
        for acts in plan.schedule:
            for a in acts:
                t = arrive.get(a, 0.0)
                loc = []
                pa = []
                for p in producers(a, S, bkind):
                    pd, pk = self.pos[p]
                    if plan.placement[p.stage] == plan.placement[a.stage]:
                        t = max(t, self.end[pd][pk])
                        loc.append(pk)
                        pa.append((p, self.end[pd][pk]))
                    else:
                        pa.append((p, pair_arrive.get((p, a), self.end[pd][pk])))
                self.ready[a] = t
                self.local_prods[a] = loc
                self.prod_arrival[a] = pa

    def critical_links(self) -> list[tuple[float, int, int]]:
        """Walk the critical path back from the last action; return its device-bound links
        ``(delay, device, position)``: actions that waited for the previous action on their
        device although their inputs were there ``delay`` ms earlier."""
        acts_of = self.plan.schedule
        d = max(range(len(acts_of)), key=lambda d: self.end[d][-1] if self.end[d] else 0.0)
        if not acts_of[d]:
            return []
        k = len(acts_of[d]) - 1
        links = []
        for _ in range(sum(len(a) for a in acts_of) + 1):
            a = acts_of[d][k]
            st = self.start[d][k]
            dev_bound = k > 0 and abs(self.end[d][k - 1] - st) <= 1e-9
            if dev_bound and self.ready[a] < st - _EPS:
                links.append((st - self.ready[a], d, k))
                k -= 1
                continue
            binding = next((p for p, t in self.prod_arrival[a] if abs(t - st) <= 1e-9), None)
            if binding is not None:
                d, k = self.pos[binding]
            elif dev_bound:
                k -= 1
            else:
                break
        return links

    def gaps(self, top: int) -> list[tuple[float, int, int]]:
        """The ``top`` largest idle gaps ``(length, device, position after the gap)``."""
        out = []
        for d, acts in enumerate(self.plan.schedule):
            for k in range(1, len(acts)):
                g = self.start[d][k] - self.end[d][k - 1]
                if g > _EPS:
                    out.append((g, d, k))
        out.sort(key=lambda x: -x[0])
        return out[:top]


def _moved(order: list[list[Action]], d: int, j: int, k: int) -> list[list[Action]]:
    """Copy of ``order`` with device ``d``'s action at ``j`` moved to position ``k``."""
    new = [list(a) for a in order]
    a = new[d].pop(j)
    new[d].insert(k if k <= j else k - 1, a)
    return new


def _order_thunk(ev: Evaluator, inc: Candidate, order: list[list[Action]]) -> Callable:
    plan = inc.plan
    return lambda: ev.from_order(
        plan.partition, plan.placement, order, "", recompute=plan.recompute
    )


def advance_proposals(
    ev: Evaluator, inc: Candidate, tl: Timeline, top_gaps: int = 6, window: int = 24
) -> list[Proposal]:
    """Move a ready action from later in a device's order into one of the largest gaps."""
    out: list[Proposal] = []
    order = inc.plan.schedule
    for _g, d, k in tl.gaps(top_gaps):
        acts = order[d]
        gap_start, gap_end = tl.end[d][k - 1], tl.start[d][k]
        picked = {"FB": 0, "W": 0}
        for j in range(k + 1, min(len(acts), k + window)):
            a = acts[j]
            if tl.ready[a] >= gap_end - _EPS or any(pk >= k for pk in tl.local_prods[a]):
                continue
            cls = "W" if a.kind == "W" else "FB"
            if picked[cls] >= (1 if cls == "W" else 2):
                continue
            picked[cls] += 1
            new = _moved(order, d, j, k)
            desc = f"advance {a} into the {gap_end - gap_start:.2f} ms gap before {acts[k]}"
            out.append(proposal(Phase.SCHEDULE, Move.ADVANCE, desc, _order_thunk(ev, inc, new)))
            if picked["FB"] >= 2 and picked["W"] >= 1:
                break
    return out


def critical_proposals(ev: Evaluator, inc: Candidate, tl: Timeline, top: int = 8) -> list[Proposal]:
    """On the critical path, move each action that waited for its device's previous action
    to where its inputs were ready (or just swap it with that action)."""
    out: list[Proposal] = []
    order = inc.plan.schedule
    links = sorted(tl.critical_links(), key=lambda x: -x[0])[:top]
    for delay, d, k in links:
        acts = order[d]
        a = acts[k]
        ready = tl.ready[a]
        loc = set(tl.local_prods[a])
        q = k
        while q - 1 >= 0 and tl.start[d][q - 1] >= ready - _EPS and (q - 1) not in loc:
            q -= 1
        for t in dict.fromkeys((q, k - 1)):
            if t < k and (t not in loc) and all(pk < t for pk in loc):
                new = _moved(order, d, k, t)
                desc = f"advance critical {a} by {k - t} (waited {delay:.2f} ms on d{d})"
                out.append(proposal(Phase.SCHEDULE, Move.ADVANCE, desc, _order_thunk(ev, inc, new)))
    return out


def delay_w_proposals(ev: Evaluator, inc: Candidate, tl: Timeline, top: int = 6) -> list[Proposal]:
    """Push W actions that held back a ready F or B behind it, or into the next gap."""
    cands = []
    for d, acts in enumerate(inc.plan.schedule):
        for k in range(len(acts) - 1):
            a, nxt = acts[k], acts[k + 1]
            if a.kind != "W" or nxt.kind == "W":
                continue
            held = tl.end[d][k] - max(tl.ready[nxt], tl.start[d][k])
            if held > _EPS:
                cands.append((held, d, k))
    cands.sort(key=lambda x: -x[0])
    out: list[Proposal] = []
    order = inc.plan.schedule
    for held, d, k in cands[:top]:
        acts = order[d]
        targets = [k + 2]
        q = next(
            (q for q in range(k + 1, len(acts) - 1) if tl.start[d][q + 1] - tl.end[d][q] > _EPS),
            None,
        )
        if q is not None:
            targets.append(q + 1)
        targets.append(len(acts))
        for t in dict.fromkeys(targets):
            if t <= k + 1 or t > len(acts):
                continue
            new = _moved(order, d, k, t)
            desc = f"delay {acts[k]} (held the next action {held:.2f} ms) to position {t}"
            out.append(proposal(Phase.SCHEDULE, Move.DELAY, desc, _order_thunk(ev, inc, new)))
    return out


def split_backward(order: list[list[Action]]) -> list[list[Action]] | None:
    """Each fused BW becomes B immediately followed by W; None if there is no BW.

    >>> split_backward([[Action(0, Kind.BW, 0)]])
    [[Action(stage=0, kind=Kind.B, mb=0), Action(stage=0, kind=Kind.W, mb=0)]]
    """
    if not any(a.kind == "BW" for acts in order for a in acts):
        return None
    out = []
    for acts in order:
        row: list[Action] = []
        for a in acts:
            if a.kind == "BW":
                row += [Action(a.stage, Kind.B, a.mb), Action(a.stage, Kind.W, a.mb)]
            else:
                row.append(a)
        out.append(row)
    return out


def memory_repair_proposals(ev: Evaluator, inc: Candidate, limit: int = 4) -> list[Proposal]:
    """On each device over the cap, run a pending W (or delay the F) before the peak's F."""
    r, plan = inc.result, inc.plan
    tl = Timeline(inc)
    out: list[Proposal] = []
    cap = r.memory_cap_gib
    for d in sorted(range(plan.num_devices), key=lambda d: -r.peak_memory_gib[d]):
        if r.peak_memory_gib[d] <= cap + 1e-9:
            continue
        acts = plan.schedule[d]
        # the F that starts at the activation peak
        level, peak, t_peak = r.static_mib[d], -1.0, 0.0
        for t, delta in r.memory_events(d):
            level += delta
            if level > peak:
                peak, t_peak = level, t
        kf = next(
            (
                k
                for k, a in enumerate(acts)
                if a.kind == "F" and abs(tl.start[d][k] - t_peak) < 1e-9
            ),
            None,
        )
        if kf is None:
            continue
        n = 0
        for j in range(kf + 1, len(acts)):
            a = acts[j]
            if a.kind == "W" and tl.pos[Action(a.stage, Kind.B, a.mb)][1] < kf:
                new = _moved(plan.schedule, d, j, kf)
                desc = f"advance {a} before {acts[kf]} on d{d} (frees its stash under the cap)"
                out.append(proposal(Phase.MEMORY, Move.ADVANCE, desc, _order_thunk(ev, inc, new)))
                n += 1
                if n >= limit:
                    break
        kb = next((j for j in range(kf + 1, len(acts)) if acts[j].kind in ("B", "BW")), None)
        if kb is not None:
            new = _moved(plan.schedule, d, kf, kb + 1)
            desc = f"delay {acts[kf]} after {acts[kb]} on d{d} (lower peak)"
            out.append(proposal(Phase.MEMORY, Move.DELAY, desc, _order_thunk(ev, inc, new)))
    return out


def policy_proposals(
    ev: Evaluator, inc: Candidate, phase: Phase = Phase.SCHEDULE
) -> list[Proposal]:
    """List-schedule the current layout with each policy not tried on it yet."""
    plan = inc.plan
    out = []
    rec = plan.recompute
    for pol in POLICIES:
        if ev.seen_policy(plan.partition, plan.placement, pol, rec):
            continue

        def build(pol: Policy = pol) -> Candidate | None:
            return ev.from_policies(plan.partition, plan.placement, "", (pol,), recompute=rec)

        out.append(proposal(phase, Move.POLICY, f"re-plan with {pol.name}", build))
    return out


# (rounds, lookahead, start from the incumbent's times) of the justify moves; from
# micro-batch order they find other schedules than from the incumbent (on many-stage layouts
# the better ones), so both starts are tried. From the incumbent's times, lookahead 0.25
# beat 0.5 on 11 of 13 spread layouts at 8 devices and 16-32 micro-batches, but neither wins
# everywhere, so both lookaheads are tried (tuned, in two runs each: nemotron-h-56b p=16
# m=32 1,718.7 -> 1,709.8 ms, p=32 m=128 3,464.0 -> 3,452.3 ms)
JUSTIFY_MOVES = ((4, 0.0, False), (10, 0.5, False), (6, 0.5, True), (6, 0.25, True))


def justify_thunk(
    ev: Evaluator, inc: Candidate, passes: int, lookahead: float, from_inc: bool
) -> Callable[[], Candidate | None]:
    def build() -> Candidate | None:
        plan, res = inc.plan, inc.result
        costs = ev.costs(plan.partition)
        ends = dict(zip((a for _d, a in res.ops), res.end_ms, strict=True)) if from_inc else None
        got = justified_schedule(
            costs, plan.placement, ev.devices, ev.microbatches,
            ev.budgets_mib(costs, plan.placement), passes, lookahead, ends, ev.deadline,
        )  # fmt: skip
        return None if got is None else ev.from_order(plan.partition, plan.placement, got[0], "")

    return build


# the justify move from the pull schedule's times: (rounds, lookahead), on layouts with at
# least this many stages per device (where the forward wave leaves devices idle; the cells it
# improved hold 3.2-15; on fewer it cost convergence runs a quarter more time for nothing)
PULL_JUSTIFY = (6, 0.25)
PULL_STAGES_PER_DEVICE = 3


def _how(passes: int, wait: float, from_inc: bool) -> str:
    """How a justify move runs, for its description."""
    how = f"{passes} rounds" + (f", lookahead {wait:g}" if wait else "")
    return how + (", from its times" if from_inc else "")


def justify_proposals(ev: Evaluator, inc: Candidate) -> list[Proposal]:
    """Forward-backward improvement of the incumbent's schedule (split F/B/W, no
    recomputation), from micro-batch order and from the incumbent's times; on layouts of
    many stages per device, also of the pull schedule from its times."""
    plan = inc.plan
    if plan.recompute or any(a.kind is Kind.BW for acts in plan.schedule for a in acts):
        return []
    out = []
    # the pull schedule first: where it applies it gains most (the test on jamba-v0.1's
    # counted-wave layout), and a phase cut short by the budget keeps what it found
    many = len(plan.partition) >= PULL_STAGES_PER_DEVICE * ev.devices
    if many and not ev.seen_policy(plan.partition, plan.placement, PULL_POLICY):
        desc = f"justify the {PULL_POLICY.name} schedule ({_how(*PULL_JUSTIFY, True)})"
        out.append(proposal(Phase.SCHEDULE, Move.JUSTIFY, desc, pull_justify_thunk(ev, inc)))
    for passes, wait, from_inc in JUSTIFY_MOVES:
        thunk = justify_thunk(ev, inc, passes, wait, from_inc)
        desc = f"justify the schedule ({_how(passes, wait, from_inc)})"
        out.append(proposal(Phase.SCHEDULE, Move.JUSTIFY, desc, thunk))
    return out


def pull_justify_thunk(ev: Evaluator, inc: Candidate) -> Callable[[], Candidate | None]:
    """The layout list-scheduled with ``PULL_POLICY``, then justified from its times; the
    better of the two (once per layout: the evaluator remembers the policy)."""

    def build() -> Candidate | None:
        plan = inc.plan
        part, place = plan.partition, plan.placement
        pulled = ev.from_policies(part, place, "", (PULL_POLICY,), bound_ms=float("inf"))
        if pulled is None:
            return None
        got = justify_thunk(ev, pulled, *PULL_JUSTIFY, True)()
        return pulled if got is None or pulled.key() <= got.key() else got

    return build


def schedule_proposals(ev: Evaluator, inc: Candidate) -> list[Proposal]:
    """Justification, policies, BW splitting, W delays and advances into gaps, in that
    order."""
    out = justify_proposals(ev, inc) + policy_proposals(ev, inc)
    split = split_backward(inc.plan.schedule)
    if split is not None:
        thunk = _order_thunk(ev, inc, split)
        out.append(proposal(Phase.SCHEDULE, Move.SPLIT_BACKWARD, "split fused backward", thunk))
        return out
    tl = Timeline(inc)
    out += critical_proposals(ev, inc, tl)
    out += delay_w_proposals(ev, inc, tl)
    out += advance_proposals(ev, inc, tl)
    return out
