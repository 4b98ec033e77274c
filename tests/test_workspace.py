"""Backward working memory (``workspace_mib``): what a B holds while it runs and frees when it
ends (the loss gradient over the vocabulary, a softmax backward). Measured by the profiler,
kept by every profile form, and a transient peak in the simulator, its DAG and the tuner's
memory budgets."""

from __future__ import annotations

import random
from typing import Any

import pytest

from octopipe_core.costs import stage_costs
from octopipe_core.errors import OctoPipeError
from octopipe_core.graph import build_graph
from octopipe_core.plan import Plan, parse_actions
from octopipe_core.profile import (
    FORMAT,
    Profile,
    parse_profile_csv,
    profile_to_csv,
)
from octopipe_core.schedules import build_plan
from octopipe_core.simulator import simulate


def _profile(work: list[float], act: float = 100.0, stash: float = 30.0) -> Profile:
    types: dict[str, Any] = {}
    for i, ws in enumerate(work):
        types[f"t{i}"] = {
            "family": "mlp", "forward_ms": 1.0 + i % 3, "backward_input_ms": 1.0,
            "backward_weight_ms": 1.0, "activation_mib": act, "weight_mib": 1024.0,
            "output_mib": 1.0, "w_stash_mib": stash, "workspace_mib": ws,
        }  # fmt: skip
    return Profile.from_dict(
        {
            "format": FORMAT,
            "name": "ws",
            "tokens_per_microbatch": 8,
            "layer_types": types,
            "layers": list(types),
        }
    )


def test_b_holds_its_workspace_while_it_runs() -> None:
    prof = _profile([50.0])
    r = simulate(prof, Plan(1, [(0, 1)], [0], [parse_actions("0F0 0B0 0W0")]))
    levels = list(r.memory_curves().memory_gib * 1024)
    assert levels[:5] == pytest.approx([1024, 1124, 1174, 1054, 1024])  # F, B starts, B ends, W
    assert r.peak_memory_gib == [pytest.approx(1174 / 1024)]
    fused = simulate(prof, Plan(1, [(0, 1)], [0], [parse_actions("0F0 0BW0")]))
    assert fused.peak_memory_gib == [pytest.approx(1174 / 1024)]
    assert not simulate(prof, fused.plan, memory_cap_gib=1150 / 1024).fits_memory


def test_a_stage_holds_the_largest_workspace_of_its_layers() -> None:
    c = stage_costs(_profile([5.0, 40.0, 10.0, 0.0]), [(0, 3), (3, 4)])
    assert c.ws_mib(0) == 40.0 and c.ws_mib(1) == 0.0
    assert stage_costs(_profile([0.0, 0.0]), [(0, 2)]).workspace_mib == []


@pytest.mark.parametrize("sched", ["1f1b", "zb-h1", "interleaved", "zbv"])
def test_curves_graph_and_peaks_agree(sched: str) -> None:
    rng = random.Random(sched)
    prof = _profile([rng.choice([0.0, 20.0, 300.0]) for _ in range(8)])
    plan = build_plan(prof, sched, 2, 6, chunks=2, partition="balanced")
    r = simulate(prof, plan)
    curve = r.memory_curves()
    g = build_graph(prof, plan)
    for d in range(2):
        assert curve[curve.device == d].memory_gib.max() == pytest.approx(r.peak_memory_gib[d])
    for _, data in g.nodes(data=True):
        if data.get("kind") == "compute" and data["op"] in ("B", "BW"):
            ws = r.costs.ws_mib(data["stage"])
            assert data["mem_alloc_mib"] == pytest.approx(ws)  # no recomputation here
            assert data["mem_free_mib"] >= ws


def test_the_profile_forms_keep_the_workspace() -> None:
    prof = _profile([0.0, 12.5])
    assert Profile.from_dict(prof.to_dict()) == prof
    text = profile_to_csv(prof)
    assert text.splitlines()[text.count("\n# ") + 1].endswith(",w_stash_mib,workspace_mib")
    assert parse_profile_csv(text) == prof
    plain = profile_to_csv(_profile([0.0, 0.0]))  # older readers: no new column without one
    assert "workspace_mib" not in plain and parse_profile_csv(plain) == _profile([0.0, 0.0])
    bad = prof.to_dict()
    bad["layer_types"]["t1"]["workspace_mib"] = -1
    with pytest.raises(OctoPipeError, match=r"layer_types\.t1\.workspace_mib"):
        Profile.from_dict(bad, "p.json")


def test_the_tuner_budgets_leave_room_for_the_workspace() -> None:
    from octopipe_core.tuner.evaluate import Evaluator

    prof = _profile([0.0, 0.0, 0.0, 200.0])
    ev = Evaluator(prof, 2, 4, 4.0)
    costs = stage_costs(prof, [(0, 2), (2, 4)])
    assert ev.budgets_mib(costs, [0, 1]) == pytest.approx([4096 - 2048, 4096 - 2048 - 200])


def test_the_list_scheduler_counts_the_workspace_once() -> None:
    """The budget leaves out a device's largest backward workspace; the list scheduler does not
    reserve it again: with room for exactly two activations, d0 keeps two forwards in flight
    (one, and a slower plan, when the workspace was taken twice)."""
    from octopipe_core.tuner.evaluate import Evaluator
    from octopipe_core.tuner.list_scheduler import POLICIES, list_schedule

    types = {
        "t": {"family": "mlp", "forward_ms": 1.0, "backward_input_ms": 1.0,
              "backward_weight_ms": 1.0, "activation_mib": 100.0, "weight_mib": 0.0,
              "output_mib": 1.0, "w_stash_mib": 0.0, "workspace_mib": 50.0}
    }  # fmt: skip
    head = {"format": FORMAT, "name": "ws", "tokens_per_microbatch": 8}
    prof = Profile.from_dict({**head, "layer_types": types, "layers": ["t", "t"]})
    ev = Evaluator(prof, 2, 4, 250.0 / 1024)  # 2 x 100 MiB of activations + 50 MiB workspace
    costs = stage_costs(prof, [(0, 1), (1, 2)])
    budgets = ev.budgets_mib(costs, [0, 1])
    assert budgets == pytest.approx([200.0, 200.0])
    r = list_schedule(costs, [0, 1], 2, 4, budgets, POLICIES[0])
    assert r is not None
    level = held = 0
    for a in r.order[0]:
        level += {"F": 1, "B": -1}.get(a.kind, 0)
        held = max(held, level)
    assert held == 2
    plan = Plan(4, [(0, 1), (1, 2)], [0, 1], r.order)
    assert simulate(prof, plan, memory_cap_gib=250.0 / 1024).fits_memory


def test_the_exact_search_keeps_room_for_the_workspace() -> None:
    """The exact search's optimum fits the cap with the backwards' working memory counted
    (it shares the tuner's budgets: a plan using the workspace's room would not fit)."""
    from octopipe_core.tuner.exact import exact_optimum

    prof = _profile([0.0, 0.0, 0.0, 300.0], act=100.0, stash=0.0)
    for cap_mib in (2048 + 300 + 200, 2048 + 300 + 400):
        r = exact_optimum(prof, 2, 3, memory_gib=cap_mib / 1024, time_limit_s=20)
        assert r.plan is not None and r.result is not None and r.complete
        assert r.result.fits_memory, (cap_mib, r.result.peak_memory_gib)


def test_the_layer_type_table_keeps_the_workspace() -> None:
    from app.components.analysis import layer_types_frame, profile_with_types

    prof = _profile([0.0, 12.5])
    assert profile_with_types(prof, layer_types_frame(prof)).type_map()["t1"].workspace_mib == 12.5


def test_profile_measures_the_heads_backward_workspace() -> None:
    pytest.importorskip("torch")
    from octopipe_core.executor.models import ModelSettings
    from octopipe_core.executor.profiler import glibc_in_use, parse_layers, profile_layers

    if glibc_in_use() is None:
        pytest.skip("needs glibc's mallinfo2 (Linux) to read the CPU's bytes in use")
    st = ModelSettings(hidden=32, seq=256, vocab=4096, microbatch_size=1, dtype="float32")
    prof = profile_layers(parse_layers("embedding,mlp,lm_head"), st, repeats=1, warmup=1)
    logits_mib = 256 * 4096 * 4 / 2**20  # float32 logits of one micro-batch: 4 MiB
    lt = prof["layer_types"]
    # the loss gradient over the vocabulary lives while the head's B runs
    assert lt["lm_head"]["workspace_mib"] >= 0.9 * logits_mib
    assert lt["mlp"]["workspace_mib"] < 0.5 * logits_mib
