"""Offline check of lowered per-rank lists: completeness, per-pair FIFO order, deadlock.

The model is the conservative one: a send is posted without blocking and its message joins the
FIFO queue of its ordered rank pair; a receive blocks where it is posted until the head of that
queue is its message (another message at the head is a FIFO mismatch: with equal shapes the
runtime would silently swap tensors); a compute op needs its local producers done and its
remote inputs received earlier in the list. If no rank can move, the lists deadlock and the
error names each rank's blocked op and the cycle of ranks waiting on each other.

The runtime is less blocking than this model (receives are posted non-blocking and waited right
before their consumer), so lists that pass here cannot deadlock or mismatch there.

``streams=True`` adds a second, NCCL-like model: each rank pair has one stream per side on which
that pair's sends and receives (both directions) run in posting order, and a send completes
only together with its matching receive; a run of consecutive comm ops is posted as one batch
(``batch_isend_irecv``: its ops run concurrently), posting never blocks the rank, and a compute
op waits for its receives to complete. Unbatched sends facing each other at both stream heads
deadlock here even though gloo would run them.
"""

from __future__ import annotations

from collections import deque

from octopipe_core.errors import OctoPipeError
from octopipe_core.executor.lowering import LoweredPlan, Op
from octopipe_core.plan import Action, Kind, backward_kinds, producers

FIX = "re-lower the plan with octopipe_core.executor.lower_plan (or re-export it)"


class CommOrderError(OctoPipeError):
    """The send/receive order of a lowered plan would mismatch or deadlock."""


def check_lowered(lp: LoweredPlan, *, streams: bool = False) -> None:
    """Raise ``CommOrderError`` if ``lp`` is incomplete, breaks FIFO order or deadlocks (in the
    blocking-receive model, and with ``streams`` also in the per-pair stream model)."""
    _check_structure(lp)
    _check_fifo(lp)
    _simulate_blocking(lp)
    if streams:
        _simulate_streams(lp)


def nccl_safe(lp: LoweredPlan) -> str:
    """The empty string if ``lp`` passes the per-pair stream (NCCL-like) model, else the reason."""
    try:
        _simulate_streams(lp)
    except CommOrderError as e:
        return str(e)
    return ""


def _simulate_streams(lp: LoweredPlan) -> None:
    plan = lp.plan
    bkind = backward_kinds(plan)
    R = len(lp.ranks)
    pos = [0] * R
    done: set[Action] = set()
    completed: list[set[tuple[str, int, int]]] = [set() for _ in range(R)]
    # (rank, peer) -> posted batches (each a list of that pair's ops), not yet completed
    queues: dict[tuple[int, int], deque[list[Op]]] = {}
    progress = True
    while progress:
        progress = False
        for r, ops in enumerate(lp.ranks):
            while pos[r] < len(ops):
                o = ops[pos[r]]
                if o.is_comm:  # a run of consecutive comm ops is posted as one batch
                    batch: dict[int, list[Op]] = {}
                    while pos[r] < len(ops) and ops[pos[r]].is_comm:
                        c = ops[pos[r]]
                        m = lp.messages[c.message_key()]
                        peer = m.dst if c.kind.is_send else m.src
                        batch.setdefault(peer, []).append(c)
                        pos[r] += 1
                    for peer, group in batch.items():
                        queues.setdefault((r, peer), deque()).append(group)
                    progress = True
                    continue
                for p in producers(o.action, plan.num_stages, bkind):
                    if plan.placement[p.stage] == r:
                        if p not in done:
                            break
                    elif ("F" if p.kind == "F" else "B", p.stage, p.mb) not in completed[r]:
                        break
                else:
                    done.add(o.action)
                    pos[r] += 1
                    progress = True
                    continue
                break
        for (a, b), qa in queues.items():
            qb = queues.get((b, a))
            while a < b and qa and qb:
                ka = {x.message_key(): x for x in qa[0]}
                both = [k for k in (x.message_key() for x in qb[0]) if k in ka]
                if not both:
                    break
                for k in both:
                    completed[a].add(k)
                    completed[b].add(k)
                qa[0] = [x for x in qa[0] if x.message_key() not in both]
                qb[0] = [x for x in qb[0] if x.message_key() not in both]
                for q in (qa, qb):
                    if not q[0]:
                        q.popleft()
                progress = True
    if all(pos[r] == len(ops) for r, ops in enumerate(lp.ranks)) and not any(queues.values()):
        return
    heads = [
        f"rank {a}->{b} stream head {' '.join(map(str, q[0]))}"
        for (a, b), q in sorted(queues.items())
        if q
    ]
    raise CommOrderError(
        "lowered plan: send/recv order deadlocks with per-pair streams (NCCL-like): "
        + "; ".join(heads[:6])
        + f"; fix: {FIX}"
    )


def _check_structure(lp: LoweredPlan) -> None:
    plan = lp.plan
    if len(lp.ranks) != plan.num_devices:
        raise CommOrderError(
            f"lowered plan: {len(lp.ranks)} rank lists for {plan.num_devices} devices; fix: {FIX}"
        )
    for r, (ops, acts) in enumerate(zip(lp.ranks, plan.schedule, strict=True)):
        comp = [o.action for o in ops if not o.is_comm]
        if comp != acts:
            raise CommOrderError(
                f"lowered plan: rank {r}'s compute ops differ from the plan's device order; "
                f"fix: {FIX}"
            )
    seen: dict[tuple[Op, int], int] = {}
    for r, ops in enumerate(lp.ranks):
        for o in ops:
            if not o.is_comm:
                continue
            key = o.message_key()
            m = lp.messages.get(key)
            side = m.src if (m and o.kind.is_send) else (m.dst if m else -1)
            if m is None or side != r:
                raise CommOrderError(
                    f"lowered plan: rank {r} has {o}, which matches no cross-device message "
                    f"of this rank; fix: {FIX}"
                )
            if (o, r) in seen:
                raise CommOrderError(f"lowered plan: rank {r} posts {o} twice; fix: {FIX}")
            seen[(o, r)] = 1
    for m in lp.messages.values():
        for op, r in ((m.send_op, m.src), (m.recv_op, m.dst)):
            if (op, r) not in seen:
                raise CommOrderError(
                    f"lowered plan: rank {r} never posts {op} ({m.producer} -> {m.consumer}); "
                    f"fix: {FIX}"
                )


def _check_fifo(lp: LoweredPlan) -> None:
    sends: dict[tuple[int, int], list[Op]] = {}
    recvs: dict[tuple[int, int], list[Op]] = {}
    for ops in lp.ranks:
        for o in ops:
            if o.is_comm:
                m = lp.messages[o.message_key()]
                if o.kind.is_send:
                    sends.setdefault((m.src, m.dst), []).append(o)
                else:
                    recvs.setdefault((m.src, m.dst), []).append(o)
    for (a, b), ss in sorted(sends.items()):
        rr = recvs.get((a, b), [])
        for i, (s, v) in enumerate(zip(ss, rr, strict=False)):
            if s.message_key() != v.message_key():
                raise CommOrderError(
                    f"lowered plan: FIFO order mismatch on rank pair {a}->{b}: message #{i} is "
                    f"sent as {s} but rank {b} posts {v} as its receive #{i} (messages between "
                    f"two ranks match in posting order); fix: {FIX}"
                )


def _simulate_blocking(lp: LoweredPlan) -> None:
    plan = lp.plan
    bkind = backward_kinds(plan)
    S = plan.num_stages
    R = len(lp.ranks)
    pos = [0] * R
    done: set[Action] = set()
    received: list[set[tuple[str, int, int]]] = [set() for _ in range(R)]
    queues: dict[tuple[int, int], deque[tuple[str, int, int]]] = {}
    progress = True
    while progress:
        progress = False
        for r, ops in enumerate(lp.ranks):
            while pos[r] < len(ops):
                o = ops[pos[r]]
                if _blocked(lp, r, o, done, received, queues, S, bkind) is not None:
                    break
                if o.is_comm:
                    key = o.message_key()
                    m = lp.messages[key]
                    if o.kind.is_send:
                        queues.setdefault((m.src, m.dst), deque()).append(key)
                    else:
                        queues[(m.src, m.dst)].popleft()
                        received[r].add(key)
                else:
                    done.add(o.action)
                pos[r] += 1
                progress = True
    if all(pos[r] == len(ops) for r, ops in enumerate(lp.ranks)):
        return
    waits: dict[int, int] = {}
    lines = []
    for r, ops in enumerate(lp.ranks):
        if pos[r] == len(ops):
            continue
        o = ops[pos[r]]
        why = _blocked(lp, r, o, done, received, queues, S, bkind)
        assert why is not None
        text, peer = why
        lines.append(f"rank {r} blocked at {o} ({text})")
        if peer is not None:
            waits[r] = peer
    cycle = _rank_cycle(waits)
    cyc = f"; wait cycle {' -> '.join(f'rank {x}' for x in cycle)}" if cycle else ""
    raise CommOrderError(
        f"lowered plan: send/recv order deadlocks: {'; '.join(lines)}{cyc}; fix: {FIX}"
    )


def _blocked(
    lp: LoweredPlan,
    r: int,
    o: Op,
    done: set[Action],
    received: list[set[tuple[str, int, int]]],
    queues: dict[tuple[int, int], deque[tuple[str, int, int]]],
    S: int,
    bkind: dict[tuple[int, int], Kind],
) -> tuple[str, int | None] | None:
    """None if ``o`` can run now, else (reason, rank waited for or None)."""
    if o.kind.is_send:
        p = lp.messages[o.message_key()].producer
        return None if p in done else (f"its producer {p} has not run on this rank", None)
    if o.kind.is_recv:
        key = o.message_key()
        m = lp.messages[key]
        q = queues.get((m.src, m.dst))
        if not q:
            return (f"waits for {m.send_op} from rank {m.src}, not sent yet", m.src)
        if q[0] != key:
            raise CommOrderError(
                f"lowered plan: FIFO order mismatch: rank {r} posts {o} but the next message "
                f"from rank {m.src} is {q[0]}; fix: {FIX}"
            )
        return None
    for p in producers(o.action, S, bkind):
        src = lp.plan.placement[p.stage]
        if src == r:
            if p not in done:
                return (f"needs {p}, later on this rank", None)
        else:
            key = ("F" if p.kind == "F" else "B", p.stage, p.mb)
            if key not in received[r]:
                m = lp.messages[key]
                return (f"needs {m.recv_op}, which is posted later on this rank", None)
    return None


def _rank_cycle(waits: dict[int, int]) -> list[int]:
    for start in waits:
        path: list[int] = []
        cur: int | None = start
        while cur is not None and cur not in path:
            path.append(cur)
            cur = waits.get(cur)
        if cur is not None:
            i = path.index(cur)
            return [*path[i:], cur]
    return []
