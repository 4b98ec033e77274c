"""Memory-aware tuning: selective recomputation (simulator and tuner) and memory-aware
fill-aware partitions."""

from __future__ import annotations

import json

import pytest

from octopipe_core.costs import stage_costs
from octopipe_core.errors import OctoPipeError
from octopipe_core.graph import build_graph, simulate_graph
from octopipe_core.plan import Plan, load_plan, plan_from_dict, save_plan, validate_plan
from octopipe_core.profile import Profile, load_sample
from octopipe_core.schedules import build_plan
from octopipe_core.simulator import simulate
from octopipe_core.tuner import POLICIES, list_schedule, tune
from octopipe_core.tuner import climb as climb_mod
from octopipe_core.tuner.crafted import _lt, crafted_profile
from octopipe_core.tuner.evaluate import Evaluator, Move, Phase
from octopipe_core.tuner.moves_memory import memory_fill_proposals


def act_heavy(cap_gib: float) -> Profile:
    """Eight blocks whose activations (2 GiB) dwarf their output (8 MiB) and W stash."""
    types = {
        "block": _lt(1.0, 1.0, 1.0, act=2048.0, weight=1024.0, out=8.0, stash=256.0,
                     family="transformer_block"),
    }  # fmt: skip
    return crafted_profile("act-heavy", types, ["block"] * 8, memory_gib=cap_gib)


def test_stage_costs_with_recomputation():
    prof = act_heavy(80.0)
    part = [(0, 4), (4, 8)]
    base = stage_costs(prof, part)
    rec = stage_costs(prof, part, recompute=[1])
    assert rec.b_ms[1] == pytest.approx(base.b_ms[1] + base.f_ms[1])  # F again, then B
    assert rec.activation_mib[1] == pytest.approx(8.0)  # only the stage input is kept
    assert rec.rec_mib(1) == pytest.approx(4 * 2048.0 - 8.0)
    assert rec.rec_mib(0) == 0.0 and rec.b_ms[0] == base.b_ms[0]


def test_simulator_costs_recomputation_time_and_memory():
    prof = act_heavy(80.0)
    plan = build_plan(prof, "1f1b", 2, 4)
    plain = simulate(prof, plan)
    plan.recompute = [0]
    rec = simulate(prof, plan)
    # device 0 (4 GiB of weights) keeps 2 micro-batches of 4 blocks of activations in flight
    # without recomputation (1F1B); with it, nothing (stage 0's input is the token ids) but
    # one recomputed micro-batch during its B
    assert plain.peak_memory_gib[0] == pytest.approx(4 + 2 * 8)
    assert rec.peak_memory_gib[0] == pytest.approx(4 + 8)
    assert rec.peak_memory_gib[1] == pytest.approx(plain.peak_memory_gib[1])
    assert rec.step_time_ms > plain.step_time_ms  # B does F again
    # the networkx form agrees op for op
    times = simulate_graph(build_graph(prof, plan))
    for (_, a), s, e in zip(rec.ops, rec.start_ms, rec.end_ms, strict=True):
        assert times[("compute", a)] == (pytest.approx(s), pytest.approx(e))
    # memory curves: the recomputing B allocates at its start
    curve = rec.memory_curves()
    assert curve[curve.device == 0].memory_gib.max() == pytest.approx(rec.peak_memory_gib[0])


def test_list_scheduler_agrees_with_the_simulator_under_recomputation():
    prof = act_heavy(10.0)
    part, place = [(0, 2), (2, 4), (4, 6), (6, 8)], [0, 1, 1, 0]
    costs = stage_costs(prof, part, recompute=[0, 1, 2, 3])
    budget = [10 * 1024.0 - 4096.0] * 2
    ran = 0
    for pol in POLICIES:
        r = list_schedule(costs, place, 2, 6, budget, pol)
        if r is None:
            continue
        ran += 1
        plan = Plan(6, part, place, r.order, recompute=[0, 1, 2, 3])
        validate_plan(plan, 8)
        sim = simulate(prof, plan, 10.0)
        assert sim.step_time_ms == pytest.approx(r.makespan_ms, abs=1e-9)
        assert sim.fits_memory
    assert ran


def test_plan_files_keep_recomputation_and_reject_bad_stages(tmp_path):
    prof = act_heavy(80.0)
    plan = build_plan(prof, "1f1b", 2, 4)
    plan.recompute = [1]
    path = tmp_path / "plan.json"
    save_plan(plan, path, prof)
    again, emb = load_plan(path)
    assert again.recompute == [1] and emb is not None
    assert simulate(emb, again).step_time_ms == pytest.approx(simulate(prof, plan).step_time_ms)
    d = json.loads(path.read_text())
    d["recompute"] = [5]
    with pytest.raises(OctoPipeError, match="recompute"):
        plan_from_dict(d, "plan.json")


def test_tuner_recomputes_only_where_it_pays(monkeypatch):
    # at 8 GiB no plan without recomputation fits (4 GiB of weights per device, 2 GiB per
    # block and micro-batch in flight); recomputing some stages makes one fit
    tight = tune(act_heavy(8.0), 2, 8, time_budget_s=30, stop_at_convergence=True)
    assert tight.fits_memory and tight.plan.recompute
    again = simulate(act_heavy(8.0), tight.plan, 8.0)
    assert again.fits_memory and again.step_time_ms == pytest.approx(tight.step_time_ms)
    roomy = tune(act_heavy(40.0), 2, 8, time_budget_s=3, stop_at_convergence=True)
    assert not roomy.plan.recompute  # with room for the activations it never pays
    assert roomy.step_time_ms < tight.step_time_ms
    monkeypatch.setattr(climb_mod, "recompute_proposals", lambda ev, inc, limit=4: [])
    without = tune(act_heavy(8.0), 2, 8, time_budget_s=30, stop_at_convergence=True)
    assert not without.plan.recompute and not without.fits_memory


def test_memory_aware_fill_partition_respects_the_budget():
    prof = load_sample("nemotron-h-8b")
    ev = Evaluator(prof, 4, 8, 60.0)
    inc = ev.from_policies([(0, 14), (14, 28), (28, 41), (41, 54)], [0, 1, 2, 3], "seq")
    assert inc is not None
    res = ev.fill_partition([0, 1, 2, 3], memory=True)
    assert res.partition is not None and res.exact
    model = ev.fill_model(memory=True)
    assert model.cap_mib == 60 * 1024.0
    lts = prof.layer_costs()
    for s, (a, b) in enumerate(res.partition):  # weights + 1F1B depth x activations
        need = sum(lt.weight_mib + (4 - s) * lt.activation_mib for lt in lts[a:b])
        assert need <= 60 * 1024.0 + 1e-6
    free = ev.fill_partition([0, 1, 2, 3])
    assert free.objective_ms is not None and res.objective_ms is not None
    assert res.objective_ms > free.objective_ms  # the budget binds: it costs time
    props = memory_fill_proposals(ev, inc, Phase.PARTITION)
    assert props and all("memory-aware" in p.description for p in props)
    assert all(p.move is Move.FILL_PARTITION and p.phase is Phase.PARTITION for p in props)
