"""Heterogeneous timelines computed by hand, communication, memory events, graph agreement."""

from __future__ import annotations

import pytest

from octopipe_core.graph import build_graph, critical_path, simulate_graph
from octopipe_core.plan import Plan, parse_actions
from octopipe_core.schedules import SCHEDULES, build_plan
from octopipe_core.simulator import simulate
from tests.helpers import hetero_profile, uniform_profile


def test_heterogeneous_1f1b_heavy_first_and_last() -> None:
    # peers.md §1.6: F=[2,1,1,1], full backward=[4,2,2,2], p=4, m=8: 51; heavy stage last: 57.
    heavy_first = hetero_profile([(2, 2, 2), (1, 1, 1), (1, 1, 1), (1, 1, 1)])
    heavy_last = hetero_profile([(1, 1, 1), (1, 1, 1), (1, 1, 1), (2, 2, 2)])
    assert simulate(heavy_first, build_plan(heavy_first, "1f1b", 4, 8)).step_time_ms == 51
    assert simulate(heavy_last, build_plan(heavy_last, "1f1b", 4, 8)).step_time_ms == 57


def test_hand_computed_two_stage_timeline_with_comm() -> None:
    # 2 stages, F=1/3, B=1/1, W=1/2 ms; 64 MiB boundary at 64 GB/s, 1 ms latency.
    prof = hetero_profile([(1, 1, 1), (3, 1, 2)], out_mib=64)
    prof = prof.with_device(p2p_gbps=64 * 2**20 / 1e9 * 1000, p2p_latency_us=1000)  # 1 ms + 1 ms
    plan = Plan(
        2, [(0, 1), (1, 2)], [0, 1],
        [parse_actions("0F0 0F1 0B0 0W0 0B1 0W1"), parse_actions("1F0 1B0 1F1 1B1 1W0 1W1")],
    )  # fmt: skip
    r = simulate(prof, plan)
    got = {str(a): (s, e) for (_, a), s, e in zip(r.ops, r.start_ms, r.end_ms, strict=True)}
    # transfer = 2 ms. d0: F0 0-1, F1 1-2. d1: F0 3-6, B0 6-7, F1 7-10 (F1 arrives at 4).
    # B0 grad arrives at d0 at 9: B0 9-10, W0 10-11; d1: B1 10-11, W0 11-13, W1 13-15.
    # B1 grad arrives at d0 at 13: B1 13-14, W1 14-15.
    assert got["0F0"] == (0, 1) and got["0F1"] == (1, 2)
    assert got["1F0"] == (3, 6) and got["1B0"] == (6, 7) and got["1F1"] == (7, 10)
    assert got["0B0"] == (9, 10) and got["0W0"] == (10, 11)
    assert got["1B1"] == (10, 11) and got["1W1"] == (13, 15)
    assert got["0B1"] == (13, 14) and got["0W1"] == (14, 15)
    assert r.step_time_ms == 15
    assert r.comm_time_ms == pytest.approx(8.0)
    # transfers overlap compute on the receiver: F1 [2,4] vs d1 busy 3-6 -> 1 ms of 2, ...
    assert 0 < r.comm_overlap_ratio < 1


def test_sends_serialise_on_the_comm_stream() -> None:
    # Two back-to-back forwards on d0 each send 2 ms of data: the second waits for the first.
    prof = hetero_profile([(1, 1, 1), (1, 1, 1)], out_mib=64)
    prof = prof.with_device(p2p_gbps=64 * 2**20 / 1e9 / 2 * 1000, p2p_latency_us=0)  # 2 ms
    plan = build_plan(prof, "gpipe", 2, 2)
    r = simulate(prof, plan)
    sends = sorted((s, e) for src, _, p, _, s, e in r.transfers if p.kind == "F")
    assert sends == [(1, pytest.approx(3)), (pytest.approx(3), pytest.approx(5))]


def test_memory_events_b_keeps_stash_w_frees_it() -> None:
    prof = uniform_profile(1, act=100.0, stash=30.0, weight=1024.0)
    plan = Plan(1, [(0, 1)], [0], [parse_actions("0F0 0B0 0W0")])
    r = simulate(prof, plan)
    curve = r.memory_curves()
    levels = list(curve[curve.device == 0].memory_gib * 1024)
    assert levels[:4] == pytest.approx([1024, 1124, 1054, 1024])
    assert r.peak_memory_gib == [pytest.approx(1124 / 1024)]
    assert r.fits_memory
    tight = simulate(prof, plan, memory_cap_gib=1.05)
    assert not tight.fits_memory


@pytest.mark.parametrize("sched", SCHEDULES)
def test_networkx_graph_agrees_op_for_op(sched: str) -> None:
    prof = hetero_profile([(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2)] * 2, out_mib=32)
    plan = build_plan(prof, sched, 2, 4, chunks=2, partition="balanced")
    fast = simulate(prof, plan)
    times = simulate_graph(build_graph(prof, plan))
    for (_, a), s, e in zip(fast.ops, fast.start_ms, fast.end_ms, strict=True):
        assert times[("compute", a)] == (pytest.approx(s), pytest.approx(e))
    for _, _, p, c, s, e in fast.transfers:
        assert times[("send", p, c)] == (pytest.approx(s), pytest.approx(e))
    assert max(e for _, e in times.values()) == pytest.approx(fast.step_time_ms)


def test_graph_has_memory_events_and_critical_path() -> None:
    prof = uniform_profile(2, act=10.0, stash=4.0, out_mib=8)
    g = build_graph(prof, build_plan(prof, "1f1b", 2, 2))
    node = g.nodes[("compute", next(iter(build_plan(prof, "1f1b", 2, 2).schedule[0])))]
    assert node["mem_alloc_mib"] == 10.0
    path = critical_path(g)
    assert path[0][0] == "compute" and path[-1][0] == "compute"
    assert {d for _, _, d in g.edges(data="dep")} == {"order", "data", "comm", "stream"}


def test_metrics_keys_and_units() -> None:
    prof = uniform_profile(4)
    m = simulate(prof, build_plan(prof, "1f1b", 4, 8)).metrics()
    for key in (
        "step_time_ms",
        "bubble_ratio",
        "comm_overlap_ratio",
        "peak_memory_gib",
        "memory_cap_gib",
        "fits_memory",
        "tokens_per_gpu_per_s",
        "lower_bound_ms",
        "schedule",
    ):
        assert key in m
    assert m["lower_bound_ms"] == pytest.approx(8 * 3)
    assert m["tokens_per_gpu_per_s"] == pytest.approx(8 * 1000 / (m["step_time_ms"] / 1000) / 4)


def test_tokens_per_gpu_counts_every_gpu_of_a_tensor_parallel_device() -> None:
    from octopipe_core.profile import load_sample, parse_profile_csv, profile_to_csv

    prof = load_sample("nemotron-h-56b")
    assert prof.device.gpus == 8
    plan = build_plan(prof, "1f1b", 4, 8)
    one = simulate(prof.with_device(gpus=1), plan)
    assert simulate(prof, plan).tokens_per_gpu_per_s == pytest.approx(one.tokens_per_gpu_per_s / 8)
    assert parse_profile_csv(profile_to_csv(prof)).device.gpus == 8


def test_latency_does_not_hold_the_comm_stream() -> None:
    # wire time 1.5 ms, latency 1 ms: back-to-back sends queue on the wire, not on the latency.
    prof = hetero_profile([(1, 1, 1), (1, 1, 1)], out_mib=64)
    prof = prof.with_device(p2p_gbps=64 * 2**20 / 1e9 / 1.5 * 1000, p2p_latency_us=1000)
    r = simulate(prof, build_plan(prof, "gpipe", 2, 2))
    sends = sorted((s, e) for _, _, p, _, s, e in r.transfers if p.kind == "F")
    assert sends[0] == (pytest.approx(1.0), pytest.approx(3.5))  # wire 1-2.5, +1 ms latency
    assert sends[1] == (pytest.approx(2.5), pytest.approx(5.0))  # wire 2.5-4, +1 ms latency
