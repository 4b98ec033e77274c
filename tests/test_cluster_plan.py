"""Layout search (plan-cluster), TP scaling, W order for DP, and the cluster CLI options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from octopipe_core.cli import main
from octopipe_core.cluster import Cluster, example_cluster_dict, load_cluster_sample
from octopipe_core.cluster_plan import enumerate_layouts, rank_layouts
from octopipe_core.dp_order import dp_order_proposals, order_w_for_dp
from octopipe_core.errors import OctoPipeError
from octopipe_core.layout import deploy
from octopipe_core.plan import validate_plan
from octopipe_core.profile import Profile, example_profile_dict, load_sample
from octopipe_core.scaling import scaling_study
from octopipe_core.schedules import build_plan
from octopipe_core.simulator import simulate
from octopipe_core.tp_scaling import scale_tp, tp_comm_ms


def small() -> tuple[Profile, Cluster]:
    return Profile.from_dict(example_profile_dict()), Cluster.from_dict(example_cluster_dict())


def test_enumerate_layouts_covers_every_split_and_says_why_others_fail() -> None:
    prof, c = small()  # 4 layers, nodes of 8 GPUs
    lays, notes = enumerate_layouts(prof, c, global_batch=8, gpus=16, tps=[1, 2])
    splits = {(lay.tp, lay.pp, lay.dp) for lay, _ in lays}
    assert splits == {(1, 2, 8), (1, 4, 4), (2, 1, 8), (2, 2, 4), (2, 4, 2)}
    for lay, m in lays:
        assert lay.gpus == 16 and lay.dp * m == 8
    assert any("only 4 layers" in n for n in notes)  # PP 8 and 16
    assert any(n.startswith("TP1 x PP1 x DP16") and "not a multiple" in n for n in notes)
    # both rank orders and ZeRO-1 on and off where DP > 1 and PP > 1
    assert sum(1 for lay, _ in lays if (lay.tp, lay.pp) == (1, 2)) == 4


def test_tp_scaling_divides_costs_and_adds_intra_node_collectives() -> None:
    prof, c = small()
    p2 = scale_tp(prof, 2, c)
    a, b = prof.layer_costs()[1], p2.layer_costs()[1]
    comm = tp_comm_ms(a.output_mib, 2, c, 1)
    assert comm > 0
    assert b.forward_ms == pytest.approx(a.forward_ms / 2 + comm)
    assert b.backward_input_ms == pytest.approx(a.backward_input_ms / 2 + comm)
    assert b.backward_weight_ms == pytest.approx(a.backward_weight_ms / 2)
    assert b.weight_mib == pytest.approx(a.weight_mib / 2) and p2.device.gpus == 2
    with pytest.raises(OctoPipeError, match="must divide the 8 GPUs per node"):
        scale_tp(prof, 3, c)


def test_dp_order_moves_are_valid_and_never_slower() -> None:
    prof = load_sample("jamba-v0.1")
    p = deploy(prof, load_cluster_sample("16x8-h800-ib400"), 8, dp=16)
    plan = build_plan(p, "zbv", 8, 32, partition="balanced")
    props = dp_order_proposals(p, plan)
    assert props
    for _, q in props:
        validate_plan(q, p.num_layers)
    res = order_w_for_dp(p, plan)
    assert res.moves and res.step_time_ms < res.start_step_time_ms
    assert res.result.fits_memory >= simulate(p, plan).fits_memory


def test_rank_layouts_ranks_fitting_layouts_by_throughput() -> None:
    prof, c = small()
    res = rank_layouts(prof, c, global_batch=16, gpus=8, time_budget_s=3, tps=[1, 2])
    ok = [r for r in res.rows if r.plan is not None and r.fits_memory]
    assert ok and res.best is ok[0]
    tok = [r.tokens_per_gpu_per_s for r in ok]
    assert tok == sorted(tok, reverse=True)
    best = res.best
    assert best.profile is not None and best.plan is not None
    r = simulate(best.profile, best.plan)
    assert r.step_time_ms == pytest.approx(best.step_time_ms)
    assert r.tokens_per_gpu_per_s == pytest.approx(best.tokens_per_gpu_per_s)


def test_screening_past_its_budget_goes_on_until_a_layout_fits() -> None:
    # the most promising layout of 16 GPUs (TP1 x PP1 x DP16) does not fit 80 GiB: a budget
    # spent before it was screened (a busy machine) must not make the GPU count look hopeless
    c = load_cluster_sample("1x8-h800").with_nodes(2)
    res = rank_layouts(load_sample("nemotron-h-8b"), c, 64, gpus=16, time_budget_s=1e-6)
    assert res.best is not None and res.best.fits_memory
    screened = [r for r in res.rows if r.plan is not None]
    assert len(screened) > 1 and sum(r.fits_memory for r in screened) == 1
    assert any(n.startswith("screening stopped after") for n in res.notes)


def test_memory_infeasible_layouts_say_why() -> None:
    prof = load_sample("jamba-v0.1")  # about 181 GiB of static memory
    c = load_cluster_sample("1x8-h800")
    res = rank_layouts(prof, c, global_batch=8, gpus=8, time_budget_s=1, tps=[1], max_tuned=1)
    one = next(r for r in res.rows if r.layout.pp == 1 and not r.layout.zero1)
    assert not one.fits_memory and "static memory" in one.why and "GiB" in one.why


def test_scaling_study_points() -> None:
    prof, c = small()
    pts = scaling_study(prof, c, "weak", [8, 16], sequences_per_gpu=1, time_budget_s=1, tps=[1])
    assert [p.gpus for p in pts] == [8, 16] and [p.global_batch for p in pts] == [8, 16]
    for p in pts:
        assert p.tuned_tokens_per_gpu_per_s >= (p.one_f_one_b_tokens_per_gpu_per_s or 0) * 0.999


def test_cli_plan_cluster_best_plan_resimulates(tmp_path: Path, capsys) -> None:
    out = tmp_path / "best.json"
    argv = ["plan-cluster", "--profile", "nemotron-h-8b", "--cluster", "16x8-h800-ib400",
            "--global-batch", "64", "--gpus", "32", "--time-budget-s", "2", "--max-tuned", "1",
            "--out", str(out), "--json"]  # fmt: skip
    assert main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["gpus"] == 32 and got["best"]["fits_memory"]
    assert main(["simulate", "--plan", str(out), "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["step_time_ms"] == pytest.approx(got["best"]["step_time_ms"], abs=1e-3)
    assert sim["gpus"] == 32 and sim["layout"]["dp"] == got["best"]["dp"]
    # refuses to overwrite the saved plan
    assert main(argv) == 2
    assert "already exists" in capsys.readouterr().err


def test_cli_named_layout_and_cluster_flags(tmp_path: Path, capsys) -> None:
    argv = ["plan-cluster", "--profile", "nemotron-h-8b", "--cluster", "16x8-h800-ib400",
            "--global-batch", "64", "--layout", "1x4x4", "--zero1", "--time-budget-s", "1",
            "--json"]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["tp"], r["pp"], r["dp"], r["zero1"]) for r in rows] == [(1, 4, 4, True)]
    assert main(["simulate", "--profile", "nemotron-h-8b", "--devices", "4", "--microbatches",
                 "8", "--cluster", "16x8-h800-ib400", "--dp", "4", "--json"]) == 0  # fmt: skip
    m = json.loads(capsys.readouterr().out)
    assert m["gpus"] == 16 and m["grad_sync_ms"] > 0 and m["exposed_tail_ms"] > 0
    assert main(["simulate", "--profile", "nemotron-h-8b", "--dp", "2"]) == 2
    assert "without --cluster" in capsys.readouterr().err
    plan = tmp_path / "t.json"
    assert main(["tune", "--profile", "nemotron-h-8b", "--devices", "4", "--microbatches", "8",
                 "--cluster", "16x8-h800-ib400", "--dp", "8", "--time-budget-s", "1",
                 "--out", str(plan), "--json"]) == 0  # fmt: skip
    tuned = json.loads(capsys.readouterr().out)
    assert main(["simulate", "--plan", str(plan), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_ms"] == pytest.approx(
        tuned["step_time_ms"], abs=1e-3
    )
