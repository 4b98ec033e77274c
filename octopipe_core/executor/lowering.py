"""Lowering: a plan's per-device compute orders -> per-rank lists with sends and receives.

Every data dependency between stages on different devices becomes one message: a
``SEND_F``/``SEND_B`` on the producer's rank and a ``RECV_F``/``RECV_B`` on the consumer's rank
(names and stage tagging as in PyTorch's pipelining IR: a send is tagged with the sending
stage, a receive with the receiving stage). Messages between two ranks are matched in posting
order, so the lowering must post them in the same order on both sides.

The order is derived from one timed execution of the plan (the simulator's, or unit costs):

* each send is posted right after its producer (sends never block the sender);
* each receive is keyed by ``(producer end time, producer topological index)`` and posted on the
  consumer's rank just before the first compute whose ``(start time, topological index)`` is
  larger, i.e. as soon as the message is expected to arrive.

Keys grow strictly along every edge of the resulting wait graph, so it has no cycle even if a
receive blocks where it is posted, and the receive order on each pair equals the send order
(producers on one device finish in list order). ``checker.check_lowered`` verifies both.

>>> from octopipe_core.plan import Plan, parse_actions
>>> plan = Plan(2, [(0, 1), (1, 2)], [0, 1],
...             [parse_actions("0F0 0F1 0BW0 0BW1"), parse_actions("1F0 1BW0 1F1 1BW1")])
>>> print(format_lowered(lower_plan(plan)))
r0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0BW0 0RECV_B1 0BW1
r1: 1RECV_F0 1F0 1RECV_F1 1BW0 1SEND_B0 1F1 1BW1 1SEND_B1
"""

from __future__ import annotations

import heapq
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

from octopipe_core.errors import OctoPipeError
from octopipe_core.plan import (
    Action,
    Kind,
    Plan,
    TextEnum,
    asap_times,
    backward_kinds,
    find_order_cycle,
    producers,
)


class OpKind(TextEnum):
    """A lowered op: a compute action's kind, or one end of a message (``SEND_F`` sends an
    activation, ``RECV_B`` receives a gradient, ...).

    >>> OpKind("RECV_B").is_comm, OpKind.F == Kind.F
    (True, True)
    """

    F = "F"
    B = "B"
    W = "W"
    BW = "BW"
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"

    @property
    def is_send(self) -> bool:
        return self in (OpKind.SEND_F, OpKind.SEND_B)

    @property
    def is_recv(self) -> bool:
        return self in (OpKind.RECV_F, OpKind.RECV_B)

    @property
    def is_comm(self) -> bool:
        return self.is_send or self.is_recv


_OP_RE = re.compile(r"^(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|BW|F|B|W)(\d+)$")


class Op(NamedTuple):
    """One entry of a rank's list: a compute action or one end of a message."""

    stage: int
    kind: OpKind
    mb: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.mb}"

    @property
    def is_comm(self) -> bool:
        return self.kind.is_comm

    @property
    def action(self) -> Action:
        return Action(self.stage, Kind(self.kind), self.mb)

    @staticmethod
    def parse(text: str) -> Op:
        """Parse ``"2RECV_B0"``-style text.

        >>> Op.parse("2RECV_B0")
        Op(stage=2, kind=OpKind.RECV_B, mb=0)
        """
        m = _OP_RE.match(text.strip()) if isinstance(text, str) and len(text) < 40 else None
        if not m:
            raise OctoPipeError(
                f"bad lowered op {str(text)[:30]!r}; fix: write <stage><F|B|W|BW|SEND_F|RECV_F|"
                "SEND_B|RECV_B><microbatch>, e.g. 1RECV_F0"
            )
        return Op(int(m.group(1)), OpKind(m.group(2)), int(m.group(3)))

    def message_key(self) -> tuple[str, int, int]:
        """``(direction, producer stage, mb)`` of the message a comm op sends or receives."""
        if self.kind == "SEND_F":
            return ("F", self.stage, self.mb)
        if self.kind == "RECV_F":
            return ("F", self.stage - 1, self.mb)
        if self.kind == "SEND_B":
            return ("B", self.stage, self.mb)
        if self.kind == "RECV_B":
            return ("B", self.stage + 1, self.mb)
        raise ValueError(f"{self} is not a comm op")


@dataclass(frozen=True)
class Message:
    """One cross-device tensor: ``producer``'s output (or input grad) to ``consumer``."""

    key: tuple[str, int, int]
    src: int
    dst: int
    producer: Action
    consumer: Action

    @property
    def send_op(self) -> Op:
        return Op(self.producer.stage, OpKind("SEND_" + self.key[0]), self.producer.mb)

    @property
    def recv_op(self) -> Op:
        return Op(self.consumer.stage, OpKind("RECV_" + self.key[0]), self.consumer.mb)


@dataclass
class LoweredPlan:
    """Per-rank op lists of a plan (rank = device index) and the messages they exchange."""

    plan: Plan
    ranks: list[list[Op]]
    messages: dict[tuple[str, int, int], Message]

    def to_strings(self) -> list[list[str]]:
        return [[str(o) for o in ops] for ops in self.ranks]

    def channel_order(self, src: int, dst: int) -> list[tuple[str, int, int]]:
        """Message keys on the ordered pair ``src -> dst`` in the sender's posting order."""
        return [
            o.message_key()
            for o in self.ranks[src]
            if o.kind.is_send and self.messages[o.message_key()].dst == dst
        ]


def format_lowered(lp: LoweredPlan) -> str:
    """One line per rank: ``r0: 0F0 0SEND_F0 ...``."""
    return "\n".join(f"r{r}: " + " ".join(map(str, ops)) for r, ops in enumerate(lp.ranks))


def plan_messages(plan: Plan) -> dict[tuple[str, int, int], Message]:
    """Every cross-device data dependency of ``plan`` as a message, keyed by ``message_key``."""
    bkind = backward_kinds(plan)
    out: dict[tuple[str, int, int], Message] = {}
    for d, acts in enumerate(plan.schedule):
        for a in acts:
            for p in producers(a, plan.num_stages, bkind):
                src = plan.placement[p.stage]
                if src == d:
                    continue
                key = ("F" if p.kind == "F" else "B", p.stage, p.mb)
                out[key] = Message(key, src, d, p, a)
    return out


def unit_times(plan: Plan) -> dict[Action, tuple[float, float]]:
    """(start, end) of every action in an as-soon-as-possible run at unit costs (BW = 2)."""
    dur = {"F": 1.0, "B": 1.0, "W": 1.0, "BW": 2.0}
    times, _ = asap_times(plan, lambda a: dur[a.kind])
    if len(times) != sum(len(a) for a in plan.schedule):
        raise OctoPipeError("lowering: the plan's device orders contain a dependency cycle")
    return times


def sim_times(plan: Plan, profile: Any) -> dict[Action, tuple[float, float]]:
    """(start, end) of every action in the simulator's timeline of ``plan`` on ``profile``."""
    from octopipe_core.simulator import simulate

    r = simulate(profile, plan)
    return {a: (s, e) for (_, a), s, e in zip(r.ops, r.start_ms, r.end_ms, strict=True)}


def topo_index(plan: Plan, times: dict[Action, tuple[float, float]]) -> dict[Action, int]:
    """A topological index of the actions (data + device-order edges), earliest start first."""
    bkind = backward_kinds(plan)
    preds: dict[Action, list[Action]] = {}
    succs: dict[Action, list[Action]] = {}
    where: dict[Action, tuple[int, int]] = {}
    for d, acts in enumerate(plan.schedule):
        for i, a in enumerate(acts):
            where[a] = (d, i)
            ps = set(producers(a, plan.num_stages, bkind))
            if i:
                ps.add(acts[i - 1])
            preds[a] = list(ps)
            for p in ps:
                succs.setdefault(p, []).append(a)
    indeg = {a: len(p) for a, p in preds.items()}
    heap = [(times[a][0], *where[a], a) for a, k in indeg.items() if k == 0]
    heapq.heapify(heap)
    out: dict[Action, int] = {}
    while heap:
        *_, a = heapq.heappop(heap)
        out[a] = len(out)
        for c in succs.get(a, ()):
            indeg[c] -= 1
            if indeg[c] == 0:
                heapq.heappush(heap, (times[c][0], *where[c], c))
    if len(out) != len(preds):
        raise OctoPipeError("lowering: the plan's device orders contain a dependency cycle")
    return out


def lower_plan(
    plan: Plan,
    profile: Any | None = None,
    times: dict[Action, tuple[float, float]] | None = None,
    *,
    check: bool = True,
) -> LoweredPlan:
    """Lower ``plan`` to per-rank op lists (see the module docstring).

    ``times`` (start, end per action) defaults to the simulator's timeline when ``profile`` is
    given, else to unit costs. With ``check`` the result is verified by ``check_lowered``.
    """
    cyc = find_order_cycle(plan)
    if cyc:
        path = " -> ".join(map(str, cyc))
        raise OctoPipeError(
            f"lowering: field 'schedule': dependency cycle {path}; fix: reorder the plan"
        )
    if times is None:
        times = sim_times(plan, profile) if profile is not None else unit_times(plan)
    seq = topo_index(plan, times)
    msgs = plan_messages(plan)
    by_producer = {m.producer: m for m in msgs.values()}
    incoming: list[list[tuple[tuple[float, int], Message]]] = [[] for _ in plan.schedule]
    for m in msgs.values():
        incoming[m.dst].append(((times[m.producer][1], seq[m.producer]), m))
    ranks: list[list[Op]] = []
    for d, acts in enumerate(plan.schedule):
        recvs = sorted(incoming[d], key=lambda x: x[0])
        ops: list[Op] = []
        i = 0
        for a in acts:
            key = (times[a][0], seq[a])
            while i < len(recvs) and recvs[i][0] < key:
                ops.append(recvs[i][1].recv_op)
                i += 1
            ops.append(Op(a.stage, OpKind(a.kind), a.mb))
            if a in by_producer:
                ops.append(by_producer[a].send_op)
        ops.extend(m.recv_op for _, m in recvs[i:])
        ranks.append(ops)
    lp = LoweredPlan(plan, ranks, msgs)
    if check:
        from octopipe_core.executor.checker import check_lowered

        check_lowered(lp)
    return lp


def lowered_from_strings(plan: Plan, ranks: list[list[str]] | list[str]) -> LoweredPlan:
    """Rebuild a ``LoweredPlan`` from its string form (as stored in an executor config)."""
    parsed = [[Op.parse(t) for t in (r.split() if isinstance(r, str) else r)] for r in ranks]
    return LoweredPlan(plan, parsed, plan_messages(plan))
