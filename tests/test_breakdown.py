"""Where the time goes (per-device idle by cause), the critical path, and the by-layer diff."""

from __future__ import annotations

import itertools

import pytest

from octopipe_core.breakdown import critical_path, time_breakdown
from octopipe_core.plan_diff import device_changes, layer_moves
from octopipe_core.profile import load_sample
from octopipe_core.schedules import build_plan
from octopipe_core.simulator import simulate
from tests.helpers import uniform_profile


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1", "zbv", "interleaved"])
@pytest.mark.parametrize("sample", ["nemotron-h-8b", "jamba-v0.1"])
def test_parts_add_up_to_the_step_and_the_path_is_contiguous(sample: str, schedule: str) -> None:
    prof = load_sample(sample)
    r = simulate(prof, build_plan(prof, schedule, 4, 8))
    rows = time_breakdown(r)
    for row in rows:
        assert row.busy_ms + row.idle_ms == pytest.approx(r.step_time_ms, abs=1e-6)
        assert min(row.fill_ms, row.wait_transfer_ms, row.idle_between_ms, row.drain_ms) >= 0
    idle = sum(x.idle_ms for x in rows) / (r.step_time_ms * r.num_devices)
    assert idle == pytest.approx(r.bubble_ratio, abs=1e-9)
    path = critical_path(r)
    for x, y in itertools.pairwise(path):
        assert x.end_ms == pytest.approx(y.start_ms, abs=1e-6), (x, y)
    assert path[0].start_ms == pytest.approx(min(r.start_ms))
    assert path[-1].end_ms == pytest.approx(max(r.end_ms))


def test_closed_form_fill_and_drain_of_1f1b() -> None:
    """p devices, one layer each, F = B = W = 1 ms, free transfers: device d starts after d
    forwards (fill = d ms) and, as the mirror image, finishes d backward steps early."""
    p, m = 4, 8
    prof = uniform_profile(p, f=1.0, b=1.0, w=1.0, gbps=1e9, lat_us=0.0)
    r = simulate(prof, build_plan(prof, "1f1b", p, m))
    rows = time_breakdown(r)
    assert [x.fill_ms for x in rows] == pytest.approx([0.0, 1.0, 2.0, 3.0])
    assert [x.wait_transfer_ms for x in rows] == pytest.approx([0.0] * p)
    assert rows[0].drain_ms == pytest.approx(0.0)
    assert rows[-1].drain_ms > 0


def test_slow_links_show_as_waiting_on_transfers() -> None:
    prof = uniform_profile(4, f=1.0, b=1.0, w=1.0, out_mib=100.0, gbps=10.0, lat_us=500.0)
    r = simulate(prof, build_plan(prof, "1f1b", 4, 8))
    rows = time_breakdown(r)
    assert sum(x.wait_transfer_ms for x in rows) > 1.0
    assert any(s.kind == "transfer" for s in critical_path(r))


def test_layer_diff_across_stage_counts() -> None:
    prof = load_sample("nemotron-h-8b")
    a = build_plan(prof, "1f1b", 4, 8)
    b = build_plan(prof, "zbv", 4, 8)  # 8 stages in a V against 4 stages
    moves = layer_moves(a, b, prof.num_layers)
    assert moves and all(m.device_a != m.device_b for m in moves)
    moved = sum(m.last_layer - m.first_layer + 1 for m in moves)
    assert 0 < moved < prof.num_layers
    assert layer_moves(a, a, prof.num_layers) == []
    rows = device_changes(prof, simulate(prof, a), simulate(prof, b))
    assert sum(r["layers_a"] for r in rows) == sum(r["layers_b"] for r in rows) == prof.num_layers
    assert any(r["load_delta_ms"] != 0 for r in rows)


def test_simulate_breakdown_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from octopipe_core.cli import main

    argv = ["simulate", "--profile", "tiny-hybrid", "--devices", "2", "--microbatches", "4"]
    assert main([*argv, "--breakdown"]) == 0
    out = capsys.readouterr().out
    assert "wait_transfer_ms" in out and "critical path:" in out
    assert main([*argv, "--breakdown", "--json"]) == 0
    import json

    data = json.loads(capsys.readouterr().out)
    assert len(data["breakdown"]) == 2 and "drain_ms" in data["breakdown"][0]
