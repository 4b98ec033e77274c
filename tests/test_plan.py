"""Plans as data: text form, JSON round trip, validation and named cycles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from octopipe_core.errors import OctoPipeError
from octopipe_core.partition import balanced_partition, uniform_partition
from octopipe_core.plan import (
    Action,
    Kind,
    Plan,
    format_plan,
    load_plan,
    parse_actions,
    save_plan,
    validate_plan,
)
from octopipe_core.profile import load_sample
from octopipe_core.schedules import SCHEDULES, build_plan
from octopipe_core.simulator import simulate


def two_stage(order0: str, order1: str) -> Plan:
    return Plan(2, [(0, 1), (1, 2)], [0, 1], [parse_actions(order0), parse_actions(order1)])


def test_action_text_round_trip() -> None:
    for text in ("0F0", "12B3", "1W0", "2BW15"):
        assert str(Action.parse(text)) == text
    with pytest.raises(OctoPipeError, match="2X0"):
        Action.parse("2X0")


def test_action_kinds_are_an_enum_everywhere(tmp_path: Path) -> None:
    """Kinds are ``Kind`` members (not bare strings) in parsed, built, loaded and lowered
    plans, and still read and print as their letters."""
    from octopipe_core.executor.lowering import OpKind, lower_plan

    prof = load_sample("nemotron-h-8b")
    for sched in SCHEDULES:
        plan = build_plan(prof, sched, 4, 8)
        kinds = {type(a.kind) for row in plan.schedule for a in row}
        assert kinds == {Kind}, (sched, kinds)
        save_plan(plan, tmp_path / f"{sched}.json")
        loaded, _ = load_plan(tmp_path / f"{sched}.json")
        assert {type(a.kind) for row in loaded.schedule for a in row} == {Kind}
        ops = [o for row in lower_plan(plan).ranks for o in row]
        assert {type(o.kind) for o in ops} == {OpKind}
        assert any(o.kind.is_send for o in ops) and any(o.kind.is_recv for o in ops)
    a = Action.parse("3BW12")
    assert a.kind is Kind.BW and a.kind == "BW" and f"{a.kind}" == "BW" and str(a) == "3BW12"
    assert json.dumps([a.kind]) == '["BW"]'
    with pytest.raises(ValueError):
        Kind("X")


def test_cycle_is_named() -> None:
    plan = two_stage("0BW0 0F0 0F1 0BW1", "1F0 1BW0 1F1 1BW1")
    with pytest.raises(OctoPipeError) as e:
        validate_plan(plan, 2)
    msg = str(e.value)
    assert "cycle" in msg and "0BW0" in msg and "0F0" in msg and "\n" not in msg
    with pytest.raises(OctoPipeError, match="cycle"):
        simulate(load_sample("tiny-hybrid"), Plan(2, [(0, 5), (5, 10)], [0, 1], plan.schedule))


def test_cross_device_cycle_is_named() -> None:
    # d0 waits for 1BW0 before running 0F1... and d1 runs 1F1 before 1BW0: fine; but here d1
    # wants 1F1 before 1F0's gradient can come back only after 0F1, which waits on 0BW0.
    plan = two_stage("0F0 0BW0 0F1 0BW1", "1F1 1F0 1BW0 1BW1")
    with pytest.raises(OctoPipeError, match=r"cycle .*1F1"):
        validate_plan(plan, 2)


def test_validation_errors() -> None:
    with pytest.raises(OctoPipeError, match="missing"):
        validate_plan(two_stage("0F0 0F1 0BW0", "1F0 1BW0 1F1 1BW1"), 2)
    with pytest.raises(OctoPipeError, match="twice"):
        validate_plan(two_stage("0F0 0F0 0F1 0BW0 0BW1", "1F0 1BW0 1F1 1BW1"), 2)
    with pytest.raises(OctoPipeError, match="placed on device"):
        validate_plan(two_stage("0F0 0F1 0BW0 0BW1 1F0", "1BW0 1F1 1BW1"), 2)
    with pytest.raises(OctoPipeError, match="both a fused BW"):
        validate_plan(two_stage("0F0 0F1 0BW0 0B0 0W0 0BW1", "1F0 1BW0 1F1 1BW1"), 2)
    bad_part = two_stage("0F0 0F1 0BW0 0BW1", "1F0 1BW0 1F1 1BW1")
    bad_part.partition = [(0, 1), (2, 3)]
    with pytest.raises(OctoPipeError, match=r"partition\[1\]"):
        validate_plan(bad_part, 3)


def test_json_round_trip_and_reproduce(tmp_path: Path) -> None:
    prof = load_sample("nemotron-h-8b")
    plan = build_plan(prof, "zbv", 4, 8, partition="balanced")
    path = tmp_path / "plan.json"
    save_plan(plan, path, prof)
    back, prof2 = load_plan(path)
    assert prof2 == prof
    assert format_plan(back) == format_plan(plan)
    assert simulate(prof2, back).step_time_ms == simulate(prof, plan).step_time_ms


def test_bad_plan_files(tmp_path: Path) -> None:
    prof = load_sample("tiny-hybrid")
    good = build_plan(prof, "1f1b", 2, 4).to_dict(prof)
    for mutate, field in [
        (lambda d: d.update(format="x"), "format"),
        (lambda d: d.update(num_microbatches=0), "num_microbatches"),
        (lambda d: d["schedule"].__setitem__(0, "0F0 0Q1"), "schedule[0]"),
        (lambda d: d.update(partition=[[0, 3], "x"]), "partition[1]"),
        (lambda d: d.update(num_devices=3), "num_devices"),
    ]:
        d = json.loads(json.dumps(good))
        mutate(d)
        p = tmp_path / "bad.json"
        p.write_text(json.dumps(d))
        with pytest.raises(OctoPipeError) as e:
            load_plan(p)
        assert field in str(e.value) and "bad.json" in str(e.value) and "fix" in str(e.value)


def test_partitions() -> None:
    assert uniform_partition(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert balanced_partition([1] * 6 + [6], 3) == [(0, 3), (3, 6), (6, 7)]
    with pytest.raises(OctoPipeError, match="fewer devices"):
        uniform_partition(3, 4)


@pytest.mark.parametrize("sched", SCHEDULES)
@pytest.mark.parametrize("part", ["uniform", "balanced"])
def test_every_peer_is_valid_on_samples(sched: str, part: str) -> None:
    for name in ("nemotron-h-8b", "jamba-v0.1"):
        prof = load_sample(name)
        plan = build_plan(prof, sched, 4, 8, chunks=2, partition=part)
        validate_plan(plan, prof.num_layers)
        assert str(plan).startswith("plan ")


def test_every_peer_is_consistent_on_small_grids() -> None:
    """All peers give acyclic, complete plans for p = 1..6 and m = 1..13 (m % p != 0 too)."""
    from tests.helpers import uniform_profile

    for p in range(1, 7):
        prof = uniform_profile(6 * p)
        for m in range(1, 14):
            for sched in SCHEDULES:
                if sched == "dualpipev" and m < 2 * p:
                    continue
                for v in (2, 3) if sched == "interleaved" else (None,):
                    plan = build_plan(prof, sched, p, m, chunks=v)
                    validate_plan(plan, prof.num_layers)
                    assert simulate(prof, plan).step_time_ms > 0
