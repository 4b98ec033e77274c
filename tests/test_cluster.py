"""Cluster files, collective costs and cluster-aware simulation: closed forms and agreement."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from octopipe_core.cluster import (
    Cluster,
    Link,
    collective_ms,
    example_cluster_dict,
    list_cluster_samples,
    load_cluster,
    load_cluster_sample,
)
from octopipe_core.errors import OctoPipeError
from octopipe_core.graph import build_graph, simulate_graph
from octopipe_core.layout import GRAD_FRACTION, OPTIMIZER_FRACTION, Layout, deploy
from octopipe_core.plan import Plan, load_plan, parse_actions, save_plan
from octopipe_core.profile import Profile, load_sample
from octopipe_core.schedules import build_plan
from octopipe_core.simulator import simulate

MIB = 2**20


def cluster(nodes: int = 2, algo: str = "ring") -> Cluster:
    d = example_cluster_dict() | {"nodes": nodes, "collectives": {"algorithm": algo}}
    return Cluster.from_dict(d)


def two_layer_profile(out_mib: float = 64.0, w0: float = 0.0, w1: float = 0.0) -> Profile:
    lt = {
        "forward_ms": 1.0,
        "backward_input_ms": 1.0,
        "backward_weight_ms": 1.0,
        "activation_mib": 10.0,
        "output_mib": out_mib,
        "family": "mlp",
    }
    return Profile.from_dict(
        {
            "format": "octopipe.profile/v1",
            "name": "two",
            "tokens_per_microbatch": 1024,
            "device": {"memory_gib": 80, "p2p_gbps": 50, "p2p_latency_us": 10},
            "layer_types": {"a": {**lt, "weight_mib": w0}, "b": {**lt, "weight_mib": w1}},
            "layers": ["a", "b"],
        }
    )


# ---- collectives: closed forms --------------------------------------------------------------
def test_ring_allreduce_closed_form_inside_and_across_nodes() -> None:
    c = cluster(nodes=4)
    size = 1024.0  # MiB per GPU
    s_bytes = size * MIB
    n = 8
    inside = 2 * (n - 1) / n * s_bytes / 200e9 * 1e3 + 2 * (n - 1) * 3e-3
    assert collective_ms(c, "allreduce", size, list(range(8))) == pytest.approx(inside)
    group = [0, 8, 16, 24]  # one GPU on each of four nodes
    across = 2 * 3 / 4 * s_bytes / 50e9 * 1e3 + 2 * 3 * 10e-3
    assert collective_ms(c, "allreduce", size, group) == pytest.approx(across)
    # reduce-scatter and all-gather are each half of the all-reduce
    rs = collective_ms(c, "reduce_scatter", size, group)
    ag = collective_ms(c, "all_gather", size, group)
    assert rs == pytest.approx(across / 2) and ag == pytest.approx(across / 2)
    assert collective_ms(c, "allreduce", size, [5]) == 0.0


def test_hierarchical_and_tree_change_the_figure_where_documented() -> None:
    size = 512.0
    group = [0, 1, 2, 3, 8, 9, 10, 11]  # 4 members on each of two nodes
    ring = collective_ms(cluster(2, "ring"), "allreduce", size, group)
    hier = collective_ms(cluster(2, "hierarchical"), "allreduce", size, group)
    k, nodes = 4, 2
    want = (2 * (k - 1) / k * size * MIB / 200e9 * 1e3 + 2 * (k - 1) * 3e-3) + (
        2 * (nodes - 1) / nodes * size / k * MIB / 50e9 * 1e3 + 2 * (nodes - 1) * 10e-3
    )
    assert hier == pytest.approx(want)
    assert hier < ring
    big = [8 * i for i in range(256)]  # one GPU on each of 256 nodes, small message
    c = cluster(256, "tree")
    tree = collective_ms(c, "allreduce", 1.0, big)
    assert tree == pytest.approx(2 * 1.0 * MIB / 50e9 * 1e3 + 2 * math.log2(256) * 10e-3)
    assert tree < collective_ms(cluster(256, "ring"), "allreduce", 1.0, big)


# ---- point-to-point by link class -----------------------------------------------------------
def test_two_node_pipeline_boundary_inside_or_across_a_node() -> None:
    prof = two_layer_profile(out_mib=64.0)  # no weights: no optimizer time, dp=1: no reduction
    plan = Plan(1, [(0, 1), (1, 2)], [0, 1], [parse_actions("0F0 0B0 0W0"),
                                               parse_actions("1F0 1B0 1W0")])  # fmt: skip
    c = cluster(2)
    # F0 -> F1 -> B1 -> B0 -> W0 on the critical path, two transfers: 5 + 2 T
    for mapping, link in (((0, 1), c.intra_node), ((0, 8), c.inter_node)):
        p = deploy(prof, c, pp=2, mapping=(mapping,))
        t = link.latency_us / 1e3 + 64 * MIB / (link.bandwidth_gbytes_per_s * 1e9) * 1e3
        r = simulate(p, plan)
        assert r.step_time_ms == pytest.approx(5 + 2 * t)
        assert r.metrics()["inter_node_boundaries"] == (1 if link is c.inter_node else 0)
    # Megatron order with dp=8 puts each stage's replicas on one node: the boundary crosses
    assert deploy(prof, c, pp=2, dp=8).deployment.crosses_nodes(0, 1)
    assert not deploy(prof, c, pp=2, dp=8, order="tp-pp-dp").deployment.crosses_nodes(0, 1)


# ---- data-parallel reduction and W order ---------------------------------------------------
def one_device_two_stages(w_order: str) -> Plan:
    return Plan(1, [(0, 1), (1, 2)], [0, 0],
                [parse_actions(f"0F0 1F0 1B0 0B0 {w_order}")])  # fmt: skip


def test_w_order_lets_the_reduction_overlap_or_leaves_it_at_the_end() -> None:
    # stage 1 has big gradients (long reduction), stage 0 small ones; all ops last 1 ms
    prof = two_layer_profile(w0=800.0, w1=16000.0)
    c = cluster(2)
    p = deploy(prof, c, pp=1, dp=2)  # the two replicas share node 0: NVLink ring
    dep = p.deployment
    r0 = dep.grad_sync_ms(0, 800.0 * GRAD_FRACTION)
    r1 = dep.grad_sync_ms(0, 16000.0 * GRAD_FRACTION)
    opt = dep.optimizer_ms(16800.0)
    assert r1 > 2.0 > r0 > 0
    # W1 first: R1 starts at 5 (end of W1) and hides under W0; R0 follows it
    early = simulate(p, one_device_two_stages("1W0 0W0"))
    assert early.step_time_ms == pytest.approx(5 + r1 + r0 + opt)
    # W0 first: R0 hides under W1, R1 waits for the last W (6) and is fully exposed
    late = simulate(p, one_device_two_stages("0W0 1W0"))
    assert late.step_time_ms == pytest.approx(6 + r1 + opt)
    assert early.step_time_ms < late.step_time_ms
    # reductions left at the end: both wait for the device's last op
    p_end = deploy(prof, c, pp=1, dp=2, overlap_grad_reduce=False)
    end = simulate(p_end, one_device_two_stages("1W0 0W0"))
    assert end.step_time_ms == pytest.approx(6 + r0 + r1 + opt)
    assert end.exposed_tail_ms == pytest.approx(r0 + r1 + opt)


def test_zero1_shards_optimizer_memory_and_adds_the_all_gather() -> None:
    prof = two_layer_profile(w0=1600.0, w1=1600.0)
    plan = one_device_two_stages("1W0 0W0")
    c = cluster(2)
    plain = simulate(deploy(prof, c, pp=1, dp=4), plan)
    zero = simulate(deploy(prof, c, pp=1, dp=4, zero1=True), plan)
    want_static = 3200.0 * (1 - OPTIMIZER_FRACTION + OPTIMIZER_FRACTION / 4)
    assert zero.static_mib[0] == pytest.approx(want_static)
    assert plain.static_mib[0] == pytest.approx(3200.0)
    assert zero.peak_memory_gib[0] < plain.peak_memory_gib[0]
    curve = zero.memory_curves()
    assert curve["memory_gib"].min() == pytest.approx(want_static / 1024)
    kinds = [t.kind for t in zero.tail]
    assert kinds.count("param_gather") == 2 and "optimizer" in kinds


def test_buckets_overlap_the_last_w_of_a_single_stage_device() -> None:
    prof = load_sample("nemotron-h-8b")
    c = load_cluster_sample("16x8-h800-ib400")
    plan = build_plan(prof, "1f1b", 8, 16)
    one = simulate(deploy(prof, c, pp=8, dp=16), plan)
    bucketed = simulate(deploy(prof, c, pp=8, dp=16, bucket_mib=200.0), plan)
    assert bucketed.step_time_ms < one.step_time_ms
    assert len(bucketed.tail) > len(one.tail)


# ---- agreement with the networkx form and the flat case ------------------------------------
@pytest.mark.parametrize(
    ("schedule", "kw"),
    [
        ("zbv", {"dp": 4, "zero1": True}),
        ("1f1b", {"dp": 16, "bucket_mib": 300.0}),
        ("zb-h1", {"dp": 2, "overlap_grad_reduce": False}),
        ("interleaved", {"dp": 4, "order": "tp-pp-dp"}),
    ],
)
def test_graph_form_agrees_with_the_simulator_on_clusters(schedule: str, kw: dict) -> None:
    prof = load_sample("nemotron-h-8b")
    c = load_cluster_sample("16x8-h800-ib400")
    plan = build_plan(prof, schedule, 8, 16)
    p = deploy(prof, c, pp=8, **kw)
    r = simulate(p, plan)
    times = simulate_graph(build_graph(p, plan))
    for (_, a), s, e in zip(r.ops, r.start_ms, r.end_ms, strict=True):
        assert times[("compute", a)] == pytest.approx((s, e))
    tail_kinds = ("grad_sync", "optimizer", "param_gather")
    tail_g = sorted(v for k, v in times.items() if k[0] in tail_kinds)
    tail_s = sorted((t.start_ms, t.end_ms) for t in r.tail)
    assert tail_g == pytest.approx(tail_s)
    assert max(v[1] for v in times.values()) == pytest.approx(r.step_time_ms)


def test_without_a_cluster_nothing_changes() -> None:
    prof = load_sample("nemotron-h-8b")
    plan = build_plan(prof, "zb-h1", 4, 8)
    r = simulate(prof, plan)
    assert r.tail == [] and "cluster" not in r.metrics()
    # a cluster whose links are the profile's flat link, dp=1: only the optimizer step is added
    flat = Link("flat", prof.device.p2p_gbps, prof.device.p2p_latency_us)
    c = Cluster("flat", 1, 8, "H800", 80.0, 3350.0, flat, flat)
    rc = simulate(deploy(prof, c, pp=4), plan)
    assert rc.compute_end_ms == pytest.approx(r.step_time_ms)
    assert rc.start_ms == pytest.approx(r.start_ms)


# ---- files ---------------------------------------------------------------------------------
def test_samples_load_and_bad_files_get_one_line_errors(tmp_path: Path) -> None:
    names = list_cluster_samples()
    assert {"1x8-h800", "16x8-h800-ib400", "1024x8-h800-ib400"} <= set(names)
    big = load_cluster_sample("1024x8-h800-ib400")
    assert big.total_gpus == 8192
    assert load_cluster_sample("16x8-h800-ib400").inter_node.bandwidth_gbytes_per_s == 50.0
    bad = example_cluster_dict() | {"nodes": 0}
    f = tmp_path / "c.json"
    f.write_text(json.dumps(bad))
    with pytest.raises(OctoPipeError, match=r"c.json: field 'nodes'.*fix"):
        load_cluster(f)
    f.write_text(json.dumps(example_cluster_dict() | {"inter_node": {"latency_us": 1}}))
    with pytest.raises(OctoPipeError, match=r"inter_node\.bandwidth_gbytes_per_s"):
        load_cluster(f)
    f.write_text(json.dumps(example_cluster_dict() | {"collectives": {"algorithm": "magic"}}))
    with pytest.raises(OctoPipeError, match=r"collectives\.algorithm"):
        load_cluster(f)
    with pytest.raises(OctoPipeError, match="not found"):
        load_cluster_sample("nope")


def test_layout_errors_and_plan_round_trip(tmp_path: Path) -> None:
    prof = load_sample("nemotron-h-56b")  # device.gpus = 8: TP 8
    c = load_cluster_sample("16x8-h800-ib400")
    with pytest.raises(OctoPipeError, match="needs 256 GPUs"):
        deploy(prof, c, pp=4, dp=8)
    with pytest.raises(OctoPipeError, match="field 'tp'"):
        deploy(load_sample("nemotron-h-8b"), c, pp=4, dp=2, tp=2)
    p = deploy(prof, c, pp=4, dp=4, zero1=True)
    plan = build_plan(p, "zbv", 4, 16)
    r = simulate(p, plan)
    path = tmp_path / "plan.json"
    save_plan(plan, path, p)
    plan2, p2 = load_plan(path)
    assert p2 is not None and p2.deployment == p.deployment
    assert plan2.deployment == p.deployment
    assert simulate(p2, plan2).step_time_ms == pytest.approx(r.step_time_ms)
    assert Layout.from_dict(p.deployment.layout.to_dict()) == p.deployment.layout
