"""The cost model of a plan's ops: what each F, B, W and fused BW op of a stage takes in time
and memory. The simulator, its graph form, the tuner's list scheduler and its justify passes
all read these terms (``StageCosts.ops``); nothing else computes an op's cost.

An op's time is the sum of its stage's layers' times plus the profile's fixed cost per op of
that kind (``profile.runtime``, fitted by ``octopipe calibrate``; 0 in a profile that times
each layer alone). A fused BW costs its layers' B and W times plus one BW fixed cost.

An op's memory (MiB): F allocates the stage's activations at its start; B frees all of them
but the W stash at its end, W frees the stash, BW frees all; a B or BW also holds the stage's
working memory while it runs (``workspace_mib``).

With selective recomputation of a stage (``recompute``), its F keeps only the stage's input
(the previous layer's output; nothing for stage 0) in ``activation_mib``; its B first runs the
forward again (``b_ms`` includes ``f_ms``) and allocates the rest of the activations at its
start (``recompute_mib``), then frees what B frees without recomputation. W is unchanged.

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> prof = Profile.from_dict(example_profile_dict())
>>> c = stage_costs(prof, [(0, 2), (2, 4)])
>>> c.f_ms, c.weight_mib
([1.1, 3.0], [1000.0, 1000.0])
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

from octopipe_core.profile import Profile


@dataclass(frozen=True)
class StageCosts:
    """Per-stage sums (times in ms, memory in MiB) and the boundary transfer times."""

    f_ms: list[float]
    b_ms: list[float]
    w_ms: list[float]
    activation_mib: list[float]
    stash_mib: list[float]
    weight_mib: list[float]
    output_mib: list[float]
    send_ms: list[float]  # transfer time of stage s's output (and of the gradient sent back to it)
    wire_ms: list[float]  # the part of send_ms that occupies the sender's comm stream (size / bw)
    latency_ms: list[float]  # the rest: link latency, added on arrival (0 when nothing is sent)
    # per stage, what B allocates at its start to recompute the forward (empty: nothing)
    recompute_mib: list[float] = field(default_factory=list)
    # per stage, the working memory its B (or BW) holds while it runs: the largest of its
    # layers' ``workspace_mib`` (they run one at a time); empty: none
    workspace_mib: list[float] = field(default_factory=list)

    def rec_mib(self, s: int) -> float:
        """What stage ``s``'s B allocates at its start (MiB; 0 without recomputation)."""
        return self.recompute_mib[s] if self.recompute_mib else 0.0

    def ws_mib(self, s: int) -> float:
        """Working memory stage ``s``'s B holds while it runs, freed at its end (MiB)."""
        return self.workspace_mib[s] if self.workspace_mib else 0.0

    @property
    def num_stages(self) -> int:
        return len(self.f_ms)

    # per stage, a fused BW op's time (its layers' B + W and one BW fixed cost); empty: b + w
    bw_ms: list[float] = field(default_factory=list)
    # what an op pays to post its output to another device (``RuntimeCosts.send_op_ms``)
    send_op_ms: float = 0.0
    # per pipeline device, its ops' time relative to the fastest's (``RuntimeCosts``); ()
    device_speed: tuple[float, ...] = ()

    def total_ms(self, s: int) -> float:
        return self.f_ms[s] + self.b_ms[s] + self.w_ms[s]

    @cached_property
    def ops(self) -> OpTable:
        """Every op's time and memory terms, per kind and stage (computed once), without the
        cost of posting sends (which depends on the placement: ``ops_on``)."""
        return op_table(self)

    def ops_on(self, placement: list[int]) -> OpTable:
        """The op terms with ``placement``: an F whose next stage is on another device, and a
        B or BW whose previous stage is, also pay ``send_op_ms`` to post it; on a device of
        ``device_speed`` x, every op takes x times as long (when the plan has that many)."""
        devices = max(placement, default=-1) + 1
        speed = len(self.device_speed) >= devices and any(x != 1.0 for x in self.device_speed)
        if not self.send_op_ms and not speed:
            return self.ops
        key = tuple(placement)
        cache: dict[tuple[int, ...], OpTable] = self.__dict__.setdefault("_ops_on", {})
        if key not in cache:
            if len(cache) > 64:
                cache.clear()
            cache[key] = op_table(self, placement)
        return cache[key]


KINDS = ("F", "B", "W", "BW")


@dataclass(frozen=True)
class OpTable:
    """Per op kind (F, B, W, BW), per stage: the op's time and memory terms.

    * ``ms``: its duration;
    * ``alloc_mib``: what it allocates at its start (F: the activations; a recomputing B: the
      recomputed ones);
    * ``hold_mib``: what it holds on top only while it runs (a backward's working memory);
    * ``free_mib``: what it frees at its end.

    >>> from octopipe_core.profile import Profile, example_profile_dict
    >>> t = stage_costs(Profile.from_dict(example_profile_dict()), [(0, 2), (2, 4)]).ops
    >>> t.ms["BW"][1] == t.ms["B"][1] + t.ms["W"][1], t.alloc_mib["F"][0]
    (True, 200.0)
    """

    ms: dict[str, list[float]]
    alloc_mib: dict[str, list[float]]
    hold_mib: dict[str, list[float]]
    free_mib: dict[str, list[float]]

    def net_mib(self, kind: str, s: int) -> float:
        """What one op of ``kind`` on stage ``s`` leaves allocated once it ends (MiB)."""
        return self.alloc_mib[kind][s] - self.free_mib[kind][s]


def op_table(c: StageCosts, placement: list[int] | None = None) -> OpTable:
    """The time and memory terms of every op kind of every stage of ``c`` (with
    ``placement``, the ops that post a send to another device pay ``c.send_op_ms``)."""
    n = c.num_stages
    rec = c.recompute_mib or [0.0] * n
    ws = c.workspace_mib or [0.0] * n
    act, stash, zero = c.activation_mib, c.stash_mib, [0.0] * n
    f, b, w = c.f_ms, c.b_ms, c.w_ms
    bw = c.bw_ms or [x + y for x, y in zip(b, w, strict=True)]
    if placement is not None and c.send_op_ms:
        fwd = [s + 1 < n and placement[s + 1] != placement[s] for s in range(n)]
        back = [s > 0 and placement[s - 1] != placement[s] for s in range(n)]
        f = [x + c.send_op_ms * y for x, y in zip(f, fwd, strict=True)]
        b = [x + c.send_op_ms * y for x, y in zip(b, back, strict=True)]
        bw = [x + c.send_op_ms * y for x, y in zip(bw, back, strict=True)]
    if placement is not None and c.device_speed and max(placement) < len(c.device_speed):
        k = [c.device_speed[d] for d in placement]
        f, b, w, bw = ([x * y for x, y in zip(arr, k, strict=True)] for arr in (f, b, w, bw))
    return OpTable(
        ms={"F": f, "B": b, "W": w, "BW": bw},
        alloc_mib={"F": act, "B": rec, "W": zero, "BW": rec},
        hold_mib={"F": zero, "B": ws, "W": zero, "BW": ws},
        free_mib={
            "F": zero,
            "B": [a + r - st for a, r, st in zip(act, rec, stash, strict=True)],
            "W": stash,
            "BW": [a + r for a, r in zip(act, rec, strict=True)],
        },
    )


def stage_costs(
    profile: Profile, partition: list[tuple[int, int]], recompute: Iterable[int] = ()
) -> StageCosts:
    """Sum layer costs over each ``[start, end)`` range of ``partition``; the stages in
    ``recompute`` recompute their forward in B (module docstring).

    >>> from octopipe_core.profile import Profile, example_profile_dict
    >>> prof = Profile.from_dict(example_profile_dict())
    >>> c = stage_costs(prof, [(0, 2), (2, 4)], recompute=[1])
    >>> plain = stage_costs(prof, [(0, 2), (2, 4)])
    >>> c.b_ms[1] == plain.b_ms[1] + c.f_ms[1], c.ops.alloc_mib["B"][0]
    (True, 0.0)
    """
    layers = profile.layer_costs()
    n = len(partition)
    f, b, w = [0.0] * n, [0.0] * n, [0.0] * n
    act, stash, wt, out, send = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n
    lat = [0.0] * n
    for s, (lo, hi) in enumerate(partition):
        for lt in layers[lo:hi]:
            f[s] += lt.forward_ms
            b[s] += lt.backward_input_ms
            w[s] += lt.backward_weight_ms
            act[s] += lt.activation_mib
            stash[s] += lt.w_stash_mib
            wt[s] += lt.weight_mib
        out[s] = layers[hi - 1].output_mib if hi > lo else 0.0
        send[s] = profile.device.transfer_ms(out[s])
        lat[s] = profile.device.p2p_latency_us / 1000.0 if out[s] > 0 else 0.0
    rec: list[float] = []
    for s in sorted(set(recompute)):
        if not rec:
            rec = [0.0] * n
        lo = partition[s][0]
        keep = min(act[s], layers[lo - 1].output_mib if lo > 0 else 0.0)
        rec[s] = act[s] - keep
        act[s] = keep
        b[s] += f[s]
    rt = profile.runtime
    bw: list[float] = []
    if rt.op_ms("F") or rt.op_ms("B") or rt.op_ms("W") or rt.op_ms("BW"):
        bw = [x + y + rt.op_ms("BW") for x, y in zip(b, w, strict=True)]
        f = [x + rt.op_ms("F") for x in f]
        b = [x + rt.op_ms("B") for x in b]
        w = [x + rt.op_ms("W") for x in w]
    r = _round
    wire = [max(0.0, x - y) for x, y in zip(send, lat, strict=True)]
    # the working memory of a stage's B: its layers run one at a time (profiles without any:
    # nothing to do, the tuner calls this for every partition it tries)
    ws: list[float] = []
    if any(lt.workspace_mib for lt in profile.layer_types):
        ws = [max((lt.workspace_mib for lt in layers[lo:hi]), default=0.0) for lo, hi in partition]
    return StageCosts(
        r(f), r(b), r(w), r(act), r(stash), r(wt), out, send, wire, lat, r(rec) if rec else [],
        r(ws), r(bw), profile.runtime.send_op_ms, profile.runtime.device_speed,
    )  # fmt: skip


def activation_budgets_mib(
    costs: StageCosts, placement: list[int], devices: int, cap_mib: float
) -> list[float]:
    """Activation memory each device may hold: ``cap_mib`` minus its stages' weights and the
    largest working memory of its backwards (the schedulers keep within it).

    >>> from octopipe_core.profile import Profile, example_profile_dict
    >>> c = stage_costs(Profile.from_dict(example_profile_dict()), [(0, 2), (2, 4)])
    >>> [round(x) for x in activation_budgets_mib(c, [0, 1], 2, 1024.0)] == [
    ...     round(1024.0 - w) for w in c.weight_mib]
    True
    """
    out = [cap_mib] * devices
    for s, d in enumerate(placement):
        out[d] -= costs.weight_mib[s]
    if costs.workspace_mib:
        ws = [0.0] * devices
        for s, d in enumerate(placement):
            ws[d] = max(ws[d], costs.workspace_mib[s])
        out = [x - w for x, w in zip(out, ws, strict=True)]
    return out


def _round(xs: list[float]) -> list[float]:
    return [round(x, 9) for x in xs]


def layer_times_ms(profile: Profile) -> list[float]:
    """F+B+W time of each layer, in model order."""
    return [
        lt.forward_ms + lt.backward_input_ms + lt.backward_weight_ms for lt in profile.layer_costs()
    ]
