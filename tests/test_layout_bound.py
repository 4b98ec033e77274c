"""The layout bound: no schedule of a layout beats it (checked against the exhaustive optimum
schedule of small layouts and against every peer plan), it sees heavy stages that come late on
a device, and the CLI reports it."""

from __future__ import annotations

import json
import random
import time
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import hetero_profile

from octopipe_core.cli import main
from octopipe_core.cluster import load_cluster_sample
from octopipe_core.costs import activation_budgets_mib, stage_costs
from octopipe_core.dp_sync import boundary_comm
from octopipe_core.layout import deploy
from octopipe_core.layout_bound import FORMS, layout_bound, plan_layout_bound
from octopipe_core.profile import Profile, load_sample
from octopipe_core.schedules import PARTITIONS, SCHEDULES, build_plan
from octopipe_core.simulator import simulate
from octopipe_core.tuner.exact import _BnB, partitions
from octopipe_core.tuner.list_scheduler import POLICIES, list_schedule


def _best_schedule_ms(
    prof: Profile, part: list[tuple[int, int]], place: list[int], m: int
) -> float:
    """The fastest schedule of one layout, by the exhaustive search of ``tuner/exact.py``."""
    c = stage_costs(prof, part)
    d = max(place) + 1
    bnb = _BnB(c, place, d, m, activation_budgets_mib(c, place, d, 1e12), float("inf"))
    bnb.deadline = time.perf_counter() + 60
    bnb.run()
    assert not bnb.aborted
    return bnb.best


def test_no_schedule_of_a_small_layout_beats_it() -> None:
    rng = random.Random(0)
    gaps = []
    for _ in range(20):
        n = rng.randint(4, 5)
        uni = rng.uniform
        times = [(uni(0.2, 2), uni(0.2, 2), uni(0.1, 1.5)) for _ in range(n)]
        prof = hetero_profile(times, out_mib=rng.choice([0.0, 50.0]))  # with transfers or not
        s = rng.randint(2, 4)
        part = rng.choice(list(partitions(n, s)))
        place = [rng.randrange(2) for _ in range(s)]
        if len(set(place)) < 2:
            place[0], place[-1] = 0, 1
        m = rng.randint(1, 2)
        best = _best_schedule_ms(prof, part, place, m)
        lb = layout_bound(stage_costs(prof, part), place, m)
        assert lb.ms <= best + 1e-9, (part, place, m, lb, best)
        gaps.append(best / lb.ms - 1)
    assert max(gaps) < 0.1  # and it is close: within 10 % of the best schedule here


def test_a_late_heavy_stage_waits_for_the_forward() -> None:
    """Device 0 holds a nearly free first stage and the last stage: its work waits for the
    forward through stage 1, which the fill estimate (from its first stage) misses."""
    prof = hetero_profile([(0.01, 0.01, 0.01), (1.0, 1.0, 1.0), (1.0, 1.0, 1.0)])
    part, place = [(0, 1), (1, 2), (2, 3)], [0, 1, 0]
    for m in (2, 3, 4):
        c = stage_costs(prof, part)
        lb = layout_bound(c, place, m)
        fill_estimate = m * (c.f_ms[0] + c.b_ms[0] + c.w_ms[0] + 3.0)  # from stage 0, at 0 ms
        assert (lb.device, lb.stage, lb.form) == (0, 2, "work")
        assert lb.ms == pytest.approx(1.01 + 3.0 * m)  # stages 0-1's forward, then 3 ms each
        assert lb.ms > fill_estimate
        best = _best_schedule_ms(prof, part, place, m)
        assert lb.ms <= best <= lb.ms * 1.01  # the best schedule is within 1 % of it


@pytest.mark.parametrize("sample", ["nemotron-h-8b", "jamba-v0.1", "cluster"])
def test_every_peer_plan_is_at_or_above_it(sample: str) -> None:
    if sample == "cluster":  # stage boundaries cost by link class (NVLink in a node, NICs)
        prof = deploy(load_sample("nemotron-h-8b"), load_cluster_sample("16x8-h800-ib400"), 4, 2)
    else:
        prof = load_sample(sample)
    for sched in SCHEDULES:
        for part in PARTITIONS:
            plan = build_plan(prof, sched, 4, 8, None, part)
            lb = plan_layout_bound(prof, plan)
            assert lb.form in FORMS
            assert lb.ms <= simulate(prof, plan).step_time_ms + 1e-6, (sched, part)


def test_a_cluster_counts_its_own_links() -> None:
    """Inside a node, NVLink is faster than the profile's own link: with the profile's
    transfer times the bound would exceed a real schedule of the layout."""
    prof = deploy(load_sample("tiny-hybrid"), load_cluster_sample("1x8-h800"), 4, 1)
    plan = build_plan(prof, "zbv", 4, 1, None, "balanced")
    costs = stage_costs(prof, plan.partition)
    wire, lat = boundary_comm(prof, plan, costs)
    fast = replace(costs, wire_ms=list(wire), latency_ms=list(lat))
    steps = [
        simulate(prof, replace(plan, schedule=r.order)).step_time_ms
        for pol in POLICIES
        if (r := list_schedule(fast, plan.placement, 4, 1, None, pol)) is not None
    ]
    lb = plan_layout_bound(prof, plan)
    assert lb.ms <= min(steps) + 1e-9
    assert layout_bound(costs, plan.placement, 1).ms > min(steps)  # the profile's links


def test_cli_reports_the_layout_bound(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.json"
    args = ["tune", "--profile", "nemotron-h-8b", "--devices", "4", "--microbatches", "8",
            "--time-budget-s", "2", "--stop-at-convergence", "--out", str(out)]  # fmt: skip
    assert main([*args, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert 0 < d["layout_bound_ms"] <= d["step_time_ms"] + 1e-6
    assert d["gap_to_layout_bound_pct"] == pytest.approx(
        100 * (d["step_time_ms"] / d["layout_bound_ms"] - 1), abs=1e-3
    )
    assert d["layout_bound"].startswith("any schedule of this layout needs >= ")
    assert main(["simulate", "--plan", str(out), "--breakdown"]) == 0
    text = capsys.readouterr().out
    assert "layout bound: any schedule of this layout needs >= " in text
    assert "% above it" in text
    assert main(["simulate", "--plan", str(out), "--breakdown", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["layout_bound_ms"] == pytest.approx(d["layout_bound_ms"])
