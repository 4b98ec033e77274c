"""Peer schedules as plan generators: GPipe, 1F1B, interleaved 1F1B, ZB-H1, ZB-H2, ZB-V, DualPipeV.

Each generator returns per-device compute orders; ``build_plan`` adds a partition (``uniform``
or ``balanced``) and a placement. Orders are the canonical, cost-independent patterns:

* ``gpipe``: all F, then all fused BW;
* ``1f1b``: Megatron's order: ``p-s-1`` warm-up forwards, then one F / one BW, then drain;
* ``interleaved``: Megatron's interleaved 1F1B: ``v`` chunks per device in loop placement
  (stage ``s`` on device ``s % p``), micro-batches in groups of ``p`` per chunk;
* ``zb-h1`` / ``zb-h2`` / ``zbv``: the zero-bubble family, B and W split. They are produced by a
  greedy list scheduler run at unit costs (F = B = W), the way the ZB authors derive their
  handcrafted schedules: B first, then F while the in-flight limit allows, W to fill the rest.
  Warm-up limits (forwards awaiting their B): ZB-H1 ``p-s`` (1F1B's), ZB-H2 ``2(p-s)-1``, ZB-V
  ``2p`` half-size chunks per device with V placement (device ``d`` holds stages ``d`` and
  ``2p-1-d``); see each function for the W-deferral limit;
* ``dualpipev``: DeepSeek's DualPipeV (V placement), its eight phases written as data; fused BW
  except where it defers W (the zero-bubble phases). The overlapped F&B pairs are listed one
  after the other; the simulator runs them in sequence.

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> prof = Profile.from_dict(example_profile_dict())
>>> print(" ".join(map(str, build_plan(prof, "1f1b", devices=2, microbatches=3).schedule[0])))
0F0 0F1 0BW0 0F2 0BW1 0BW2
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from octopipe_core.costs import layer_times_ms
from octopipe_core.errors import OctoPipeError
from octopipe_core.partition import balanced_partition, uniform_partition
from octopipe_core.plan import Action, Kind, Plan, find_order_cycle
from octopipe_core.profile import Profile

Order = list[list[Action]]
PARTITIONS = ("uniform", "balanced")


def loop_placement(devices: int, chunks: int) -> list[int]:
    """Stage ``s`` on device ``s % devices``.

    >>> loop_placement(2, 2)
    [0, 1, 0, 1]
    """
    return [s % devices for s in range(devices * chunks)]


def v_placement(devices: int) -> list[int]:
    """Device ``d`` holds stages ``d`` and ``2*devices-1-d``.

    >>> v_placement(3)
    [0, 1, 2, 2, 1, 0]
    """
    return [s if s < devices else 2 * devices - 1 - s for s in range(2 * devices)]


# --------------------------------------------------------------------------------------------
def gpipe_order(p: int, m: int) -> Order:
    """All forwards, then all fused backwards."""
    return [
        [Action(s, Kind.F, i) for i in range(m)] + [Action(s, Kind.BW, i) for i in range(m)]
        for s in range(p)
    ]


def one_f_one_b_order(p: int, m: int) -> Order:
    """Megatron 1F1B: ``p-s-1`` warm-up forwards, steady one F / one BW, then the drain."""
    out = []
    for s in range(p):
        warm = min(p - s - 1, m)
        acts = [Action(s, Kind.F, i) for i in range(warm)]
        for i in range(m - warm):
            acts += [Action(s, Kind.F, warm + i), Action(s, Kind.BW, i)]
        acts += [Action(s, Kind.BW, i) for i in range(m - warm, m)]
        out.append(acts)
    return out


def interleaved_order(p: int, m: int, v: int) -> Order:
    """Megatron's interleaved 1F1B with ``v`` chunks per device in loop placement.

    Virtual micro-batches are taken in groups of ``p`` micro-batches per chunk (the last group
    may be smaller); forwards go chunk 0..v-1, backwards chunk v-1..0. Device ``d`` warms up
    with ``2(p-d-1) + (v-1)·p`` forwards, as Megatron does (a few more when ``m % p != 0``).
    """
    table_f: list[tuple[int, int]] = []  # (chunk, mb)
    for g0 in range(0, m, p):
        group = range(g0, min(g0 + p, m))
        for c in range(v):
            table_f += [(c, i) for i in group]
    table_b = [(v - 1 - c, i) for c, i in table_f]
    total = m * v
    # Megatron's warm-up; when m is not a multiple of p the last, smaller group can make that
    # order wait on itself, so warm up a little longer until the orders are consistent.
    for extra in range(total + 1):
        out = []
        for d in range(p):
            warm = min(total, 2 * (p - d - 1) + (v - 1) * p + extra)
            fs = [Action(c * p + d, Kind.F, i) for c, i in table_f]
            bs = [Action(c * p + d, Kind.BW, i) for c, i in table_b]
            acts = fs[:warm]
            for k in range(total - warm):
                acts += [fs[warm + k], bs[k]]
            acts += bs[total - warm :]
            out.append(acts)
        probe = Plan(m, [(s, s + 1) for s in range(p * v)], loop_placement(p, v), out)
        if find_order_cycle(probe) is None:
            return out
    raise OctoPipeError("schedule interleaved: no consistent order found")  # unreachable


def greedy_zb_order(
    num_stages: int,
    placement: list[int],
    m: int,
    limit: Callable[[int], int],
    fb_limit: Callable[[int], int] | None = None,
) -> Order:
    """Zero-bubble style list scheduling at unit costs (F = B = W = 1, no communication).

    Each tick every idle device runs, in priority order: the oldest ready B; else the oldest
    ready F if the device holds fewer than ``limit(device)`` in-flight (F done, W not done)
    stage-micro-batches; else the oldest pending W.
    """
    S = num_stages
    D = max(placement) + 1
    stages_of = [[s for s in range(S) if placement[s] == d] for d in range(D)]
    f_next = [0] * S
    b_next = [0] * S
    f_done: dict[tuple[int, int], int] = {}
    b_done: dict[tuple[int, int], int] = {}
    w_pending: list[deque[tuple[int, int]]] = [deque() for _ in range(D)]
    inflight = [0] * D
    fwd_only = [0] * D  # forwards whose B has not run yet
    fb_lim = fb_limit or limit
    order: Order = [[] for _ in range(D)]
    remaining = 3 * S * m
    t = 0
    while remaining:
        finished: list[tuple[Kind, int, int]] = []
        for d in range(D):
            best: tuple[int, int, Kind] | None = None  # (mb, -stage, kind)
            for s in stages_of[d]:
                i = b_next[s]
                if i < m:
                    dep = f_done.get((s, i)) if s == S - 1 else b_done.get((s + 1, i))
                    if dep is not None and dep <= t and (best is None or (i, -s) < best[:2]):
                        best = (i, -s, Kind.B)
            if best is None and inflight[d] < limit(d) and fwd_only[d] < fb_lim(d):
                for s in stages_of[d]:
                    i = f_next[s]
                    if i < m:
                        dep = f_done.get((s - 1, i)) if s > 0 else 0
                        if dep is not None and dep <= t and (best is None or (i, -s) < best[:2]):
                            best = (i, -s, Kind.F)
            if best is None and w_pending[d]:
                s, i = w_pending[d].popleft()
                best = (i, -s, Kind.W)
            if best is None:
                continue
            i, s, kind = best[0], -best[1], best[2]
            order[d].append(Action(s, kind, i))
            finished.append((kind, s, i))
            remaining -= 1
            if kind == "F":
                f_next[s] += 1
                inflight[d] += 1
                fwd_only[d] += 1
            elif kind == "B":
                b_next[s] += 1
                fwd_only[d] -= 1
                w_pending[d].append((s, i))
            else:
                inflight[d] -= 1
        t += 1
        for kind, s, i in finished:
            if kind == "F":
                f_done[(s, i)] = t
            elif kind == "B":
                b_done[(s, i)] = t
        if t > 10 * (3 * S * m + S) + 100:
            raise OctoPipeError("schedule: greedy zero-bubble scheduler made no progress")
    return order


def zb_h1_order(p: int, m: int) -> Order:
    """ZB-H1: 1F1B's warm-up (``p-s`` forwards before a B), W delayed to fill bubbles.

    Stage ``s`` may defer up to ``p-1-s`` extra W (it holds at most ``2p-1-s`` micro-batches'
    activations or W stashes), which is what reaches the paper's ``(p-1)(F+B-W)`` bubble.
    """
    return greedy_zb_order(p, list(range(p)), m, lambda d: 2 * p - 1 - d, lambda d: p - d)


def zb_h2_order(p: int, m: int) -> Order:
    """ZB-H2: ``2(p-s)-1`` warm-up forwards fill the start-up bubble (at most ``2p-1`` held)."""
    return greedy_zb_order(p, list(range(p)), m, lambda d: 2 * p - 1, lambda d: 2 * (p - d) - 1)


def zbv_order(p: int, m: int) -> Order:
    """ZB-V: V placement; at most ``2p`` half-size chunks awaiting B (1F1B's activation memory)
    and ``3p`` awaiting W per device."""
    return greedy_zb_order(2 * p, v_placement(p), m, lambda d: 3 * p, lambda d: 2 * p)


def dualpipev_order(p: int, m: int) -> Order:
    """DeepSeek's DualPipeV on ``p`` devices (``2p`` stages, V placement); needs ``m >= 2p``."""
    if m < 2 * p:
        raise OctoPipeError(
            f"schedule dualpipev: needs micro-batches >= 2 x devices ({2 * p}), got {m}; "
            f"fix: use --microbatches {2 * p} or more"
        )
    return [_DualPipeVRank(p, r).order(m) for r in range(p)]


class _DualPipeVRank:
    """Builds one rank's DualPipeV order; chunk 0 is stage ``r``, chunk 1 stage ``2p-1-r``."""

    def __init__(self, p: int, r: int) -> None:
        self.p, self.r = p, r
        self.stage = (r, 2 * p - 1 - r)
        self.acts: list[Action] = []
        self.next_f = [0, 0]
        self.next_b = [0, 0]
        self.deferred: deque[Action] = deque()

    def fwd(self, c: int) -> None:
        self.acts.append(Action(self.stage[c], Kind.F, self.next_f[c]))
        self.next_f[c] += 1

    def bwd(self, c: int, zb: bool = False) -> None:
        st, mb = self.stage[c], self.next_b[c]
        if zb:  # zero-bubble: B now, W deferred
            self.acts.append(Action(st, Kind.B, mb))
            self.deferred.append(Action(st, Kind.W, mb))
        else:
            self.acts.append(Action(st, Kind.BW, mb))
        self.next_b[c] += 1

    def weight(self) -> None:
        self.acts.append(self.deferred.popleft())

    def order(self, m: int) -> list[Action]:
        p, r = self.p, self.r
        for _ in range(2 * (p - r - 1)):  # phase 1: nF0
            self.fwd(0)
        for _ in range(r + 1):  # phase 2: nF0F1
            self.fwd(0)
            self.fwd(1)
        for _ in range(p - r - 1):  # phase 3: nB1W1F1 (zero bubble)
            self.bwd(1, zb=True)
            self.weight()
            self.fwd(1)
        for _ in range(m - 2 * p + r + 1):  # phase 4: nF0B1F1B0 (main)
            self.fwd(0)
            self.bwd(1)
            self.fwd(1)
            self.bwd(0)
        for _ in range(p - r - 1):  # phase 5: nB1F1B0
            self.bwd(1)
            self.fwd(1)
            self.bwd(0)
        for k in range(2 * (r + 1)):  # phase 6: nB1B0, the second half with W deferred
            self.bwd(1 if k % 2 == 0 else 0, zb=k >= r + 1)
        for _ in range(p - r - 1):  # phase 7: nWB0
            self.weight()
            self.bwd(0, zb=True)
        while self.deferred:  # phase 8: nW
            self.weight()
        return self.acts


# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PeerSchedule:
    """One peer schedule: its name, label, description, stage layout and order generator.

    ``layout`` is ``"linear"`` (stage ``s`` on device ``s``), ``"loop"`` (``chunks`` stages per
    device, stage ``s`` on device ``s % devices``) or ``"v"`` (two stages per device in a V).
    ``order(devices, microbatches, chunks)`` returns the per-device orders.

    >>> PEERS["zbv"].num_stages(4, None), PEERS["zbv"].placement(2, None)
    (8, [0, 1, 1, 0])
    """

    name: str
    label: str
    description: str
    layout: str
    order: Callable[[int, int, int], Order]

    def num_stages(self, devices: int, chunks: int | None) -> int:
        """Stages this schedule uses on ``devices`` devices (``chunks`` for a loop layout)."""
        if self.layout == "loop":
            return devices * (chunks or 2)
        return 2 * devices if self.layout == "v" else devices

    def placement(self, devices: int, chunks: int | None) -> list[int]:
        """The device of each stage."""
        if self.layout == "loop":
            return loop_placement(devices, chunks or 2)
        return v_placement(devices) if self.layout == "v" else list(range(devices))


def _interleaved(p: int, m: int, v: int) -> Order:
    if v < 1:
        raise OctoPipeError(f"--chunks {v}: must be >= 1; fix: use 2 or more")
    return interleaved_order(p, m, v)


# The one table of peer schedules: the CLI's choices, the dashboard's list and the tuner's peers.
PEERS: dict[str, PeerSchedule] = {
    s.name: s
    for s in (
        PeerSchedule("gpipe", "GPipe", "all forwards, then all fused backwards", "linear",
                     lambda p, m, v: gpipe_order(p, m)),
        PeerSchedule("1f1b", "1F1B (Megatron)", "p-s-1 warm-up forwards, then one F / one BW",
                     "linear", lambda p, m, v: one_f_one_b_order(p, m)),
        PeerSchedule("interleaved", "Interleaved 1F1B (Megatron)",
                     "v chunks per device in loop placement, groups of p micro-batches", "loop",
                     _interleaved),
        PeerSchedule("zb-h1", "ZB-H1 (zero bubble)",
                     "1F1B's warm-up, B and W split, W fills the bubbles", "linear",
                     lambda p, m, v: zb_h1_order(p, m)),
        PeerSchedule("zb-h2", "ZB-H2 (zero bubble)",
                     "longer warm-up fills the start-up bubble (more memory)", "linear",
                     lambda p, m, v: zb_h2_order(p, m)),
        PeerSchedule("zbv", "ZB-V (zero bubble, V placement)",
                     "two half-size chunks per device in a V, 1F1B's activation memory", "v",
                     lambda p, m, v: zbv_order(p, m)),
        PeerSchedule("dualpipev", "DualPipeV (DeepSeek)",
                     "V placement, eight phases, W deferred in the zero-bubble phases", "v",
                     lambda p, m, v: dualpipev_order(p, m)),
    )
}  # fmt: skip
SCHEDULES = tuple(PEERS)


def peer(schedule: str) -> PeerSchedule:
    """The registry entry of ``schedule``, or a one-line error listing the known ones."""
    if schedule not in PEERS:
        raise OctoPipeError(
            f"schedule {schedule!r}: unknown; fix: use one of {', '.join(SCHEDULES)}"
        )
    return PEERS[schedule]


def stage_count(schedule: str, devices: int, chunks: int | None) -> int:
    """Number of stages a schedule uses on ``devices`` devices."""
    return peer(schedule).num_stages(devices, chunks)


def make_partition(profile: Profile, num_stages: int, kind: str) -> list[tuple[int, int]]:
    """``uniform`` (equal layer counts) or ``balanced`` (min max stage time) partition."""
    if kind == "uniform":
        return uniform_partition(profile.num_layers, num_stages)
    if kind == "balanced":
        return balanced_partition(layer_times_ms(profile), num_stages)
    raise OctoPipeError(f"partition {kind!r}: unknown; fix: use one of {', '.join(PARTITIONS)}")


def schedule_order(schedule: str, devices: int, microbatches: int, chunks: int | None) -> Order:
    """The device orders of a peer schedule (cost-independent)."""
    return peer(schedule).order(devices, microbatches, chunks or 2)


def build_plan(
    profile: Profile,
    schedule: str,
    devices: int,
    microbatches: int,
    chunks: int | None = None,
    partition: str = "uniform",
) -> Plan:
    """A complete plan for a peer ``schedule`` with a ``uniform`` or ``balanced`` partition."""
    if devices < 1:
        raise OctoPipeError(f"--devices {devices}: must be >= 1; fix: use 1 or more")
    if microbatches < 1:
        raise OctoPipeError(f"--microbatches {microbatches}: must be >= 1; fix: use 1 or more")
    spec = peer(schedule)
    n_stages = spec.num_stages(devices, chunks)
    if profile.num_layers < n_stages:
        raise OctoPipeError(
            f"schedule {schedule}: needs {n_stages} stages but {profile.name} has "
            f"{profile.num_layers} layers; fix: use fewer devices"
            + (" or chunks" if spec.layout == "loop" else "")
        )
    order = spec.order(devices, microbatches, chunks or 2)
    part = make_partition(profile, n_stages, partition)
    meta: dict[str, Any] = {"schedule": schedule, "partition": partition}
    if spec.layout == "loop":
        meta["chunks"] = chunks or 2
    placement = spec.placement(devices, chunks)
    return Plan(microbatches, part, placement, order, f"{schedule}/{partition}", meta)
