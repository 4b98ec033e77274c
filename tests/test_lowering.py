"""Lowering to per-rank send/recv lists and the offline FIFO / deadlock checker (no torch)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from octopipe_core.executor.checker import CommOrderError, check_lowered
from octopipe_core.executor.lowering import LoweredPlan, Op, lower_plan
from octopipe_core.executor.plans import irregular_plan, random_plan
from octopipe_core.plan import Action, validate_plan
from octopipe_core.profile import load_sample
from octopipe_core.schedules import SCHEDULES, build_plan


def _fifo_ok(lp: LoweredPlan) -> None:
    for a in range(len(lp.ranks)):
        for b in range(len(lp.ranks)):
            sends = lp.channel_order(a, b)
            recvs = [
                o.message_key()
                for o in lp.ranks[b]
                if o.kind.startswith("RECV") and lp.messages[o.message_key()].src == a
            ]
            assert sends == recvs


@pytest.mark.parametrize("sched", SCHEDULES)
@pytest.mark.parametrize("devices", [2, 3, 4])
def test_peer_plans_lower_and_check(sched: str, devices: int) -> None:
    prof = load_sample("jamba-v0.1")
    plan = build_plan(prof, sched, devices, 2 * devices)
    for lp in (lower_plan(plan, prof), lower_plan(plan)):  # simulator times, unit times
        _fifo_ok(lp)
        for r, ops in enumerate(lp.ranks):
            pos = {o: i for i, o in enumerate(ops)}
            for m in lp.messages.values():
                if m.dst == r:  # receive posted before its consumer
                    assert pos[m.recv_op] < pos[Op(*m.consumer)]
                if m.src == r:  # send right after its producer
                    assert pos[m.send_op] == pos[Op(*m.producer)] + 1


def test_random_irregular_plans_lower_and_check() -> None:
    for seed in range(200):
        for d in (2, 3, 4):
            plan = random_plan(12, d, 3, seed)
            validate_plan(plan, 12)
            _fifo_ok(lower_plan(plan))
    lower_plan(irregular_plan(10))


def test_recv_posted_early_to_overlap() -> None:
    # 1F1B on 2 devices: rank 1 posts the receive of mb1 before computing 1BW0.
    prof = load_sample("tiny-hybrid")
    lp = lower_plan(build_plan(prof, "1f1b", 2, 4), prof)
    r1 = [str(o) for o in lp.ranks[1]]
    assert r1.index("1RECV_F1") < r1.index("1BW0")


def _one_f_one_b() -> LoweredPlan:
    prof = load_sample("tiny-hybrid")
    return lower_plan(build_plan(prof, "1f1b", 2, 4), prof)


def test_checker_catches_swapped_receives() -> None:
    lp = _one_f_one_b()
    ops = lp.ranks[1]
    i, j = ops.index(Op.parse("1RECV_F1")), ops.index(Op.parse("1RECV_F2"))
    ops[i], ops[j] = ops[j], ops[i]
    with pytest.raises(CommOrderError, match=r"FIFO order mismatch on rank pair 0->1"):
        check_lowered(lp)


def test_checker_catches_deadlocking_order() -> None:
    lp = _one_f_one_b()
    ops = lp.ranks[0]  # rank 0 waits for a gradient before sending any activation
    ops.remove(Op.parse("0RECV_B0"))
    ops.insert(0, Op.parse("0RECV_B0"))
    with pytest.raises(
        CommOrderError,
        match=r"deadlocks.*rank 0 blocked at 0RECV_B0.*rank 1 "
        r"blocked at 1RECV_F0.*wait cycle rank 0 -> rank 1 -> rank 0",
    ):
        check_lowered(lp)


def test_checker_catches_recv_after_consumer_and_missing_ops() -> None:
    lp = _one_f_one_b()
    ops = lp.ranks[1]
    ops.remove(Op.parse("1RECV_F0"))
    ops.insert(ops.index(Op.parse("1F0")) + 1, Op.parse("1RECV_F0"))  # FIFO kept, but too late
    with pytest.raises(CommOrderError, match="posted later on this rank"):
        check_lowered(lp)
    lp = _one_f_one_b()
    lp.ranks[0].remove(Op.parse("0SEND_F3"))
    with pytest.raises(CommOrderError, match="never posts 0SEND_F3"):
        check_lowered(lp)
    lp = _one_f_one_b()
    lp.ranks[1].remove(Action(1, "F", 0))  # type: ignore[arg-type]
    with pytest.raises(CommOrderError, match="compute ops differ"):
        check_lowered(lp)


def test_cross_pair_fifo_deadlock_three_ranks() -> None:
    # Rank 2 receives from rank 1 in a different order than rank 1 sends: caught statically.
    prof = load_sample("jamba-v0.1")
    lp = lower_plan(build_plan(prof, "gpipe", 3, 3), prof)
    ops = lp.ranks[2]
    recvs = [i for i, o in enumerate(ops) if o.kind == "RECV_F"]
    ops[recvs[0]], ops[recvs[-1]] = ops[recvs[-1]], ops[recvs[0]]
    with pytest.raises(CommOrderError, match="FIFO"):
        check_lowered(lp)


def test_lowering_imports_without_torch() -> None:
    code = (
        "import sys; import octopipe_core, octopipe_core.executor, "
        "octopipe_core.executor.export, octopipe_core.commands.export, "
        "octopipe_core.commands.run, octopipe_core.commands.profile, octopipe_core.cli; "
        "octopipe_core.cli.build_parser(); assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_stream_model_catches_facing_unbatched_sends() -> None:
    from octopipe_core.executor.checker import nccl_safe
    from octopipe_core.executor.lowering import lowered_from_strings
    from octopipe_core.plan import Plan, parse_actions

    plan = Plan(
        3,
        [(0, 1), (1, 2)],
        [0, 1],
        [parse_actions("0F0 0F1 0F2 0BW0 0BW1 0BW2"),
         parse_actions("1F0 1B0 1W0 1F1 1B1 1W1 1F2 1B2 1W2")],
    )  # fmt: skip
    bad = lowered_from_strings(
        plan,
        [
            "0F0 0SEND_F0 0F1 0SEND_F1 0F2 0SEND_F2 0RECV_B0 0BW0 0RECV_B1 0BW1 0RECV_B2 0BW2",
            "1RECV_F0 1F0 1B0 1SEND_B0 1W0 1RECV_F1 1F1 1B1 1SEND_B1 1W1 1RECV_F2 1F2 1B2 "
            "1SEND_B2 1W2",
        ],
    )
    check_lowered(bad)  # fine when sends never block (gloo)
    assert "per-pair streams" in nccl_safe(bad)  # 0SEND_F1 faces 1SEND_B0 on NCCL-like streams
    with pytest.raises(CommOrderError, match="rank 0->1 stream head 0SEND_F1"):
        check_lowered(bad, streams=True)
    assert nccl_safe(lower_plan(plan)) == ""


def test_lowered_peer_and_random_plans_are_stream_safe() -> None:
    from octopipe_core.executor.checker import nccl_safe

    prof = load_sample("tiny-hybrid")
    for sched in SCHEDULES:
        for d in (2, 4):
            plan = build_plan(prof, sched, d, 2 * d)
            assert nccl_safe(lower_plan(plan, prof)) == ""
    for seed in range(100):
        assert nccl_safe(lower_plan(random_plan(12, 3, 3, seed))) == ""
