"""Export job folders, PyTorch's runtime on the exported CSV, ``octopipe run --check``,
fault handling (killed / hung rank), and ``octopipe profile``."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import pytest

from octopipe_core.cli import main
from octopipe_core.errors import OctoPipeError
from octopipe_core.executor.checker import check_lowered
from octopipe_core.executor.export import export_job
from octopipe_core.executor.lowering import lowered_from_strings
from octopipe_core.executor.plans import irregular_plan, random_plan
from octopipe_core.plan import load_plan, plan_from_dict, save_plan, validate_plan
from octopipe_core.profile import load_profile, load_sample
from octopipe_core.schedules import build_plan


def _plan_file(tmp: Path, sample: str, sched: str, devices: int, m: int) -> Path:
    prof = load_sample(sample)
    path = tmp / f"{sample}-{sched}.json"
    save_plan(build_plan(prof, sched, devices, m), path, prof)
    return path


def test_export_writes_job_and_refuses_non_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan_path = _plan_file(tmp_path, "tiny-hybrid", "zbv", 2, 4)
    out = tmp_path / "job"
    assert main(["export", str(plan_path), "--out", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert {
        "executor_config.json",
        "launch.sh",
        "schedule.csv",
        "schedule.json",
        "trace_simulated.json",
        "plan.json",
    } <= names
    # refuses a non-empty folder, unless --force
    assert main(["export", str(plan_path), "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(["export", str(plan_path), "--out", str(out), "--force"]) == 0

    cfg = json.loads((out / "executor_config.json").read_text())
    assert cfg["format"] == "octopipe.executor/v1" and cfg["torch_version"]
    plan = plan_from_dict(cfg["plan"])
    check_lowered(lowered_from_strings(plan, cfg["lowered"]))
    rows = list(csv.reader((out / "schedule.csv").open()))
    assert len(rows) == 2
    assert all(c[1] in "FIW" for row in rows for c in row)  # zbv: split backward as I/W
    assert sum(len(r) for r in rows) == sum(len(r) for r in plan.schedule)
    side = json.loads((out / "schedule.json").read_text())
    assert side["stage_to_rank"] == {"0": 0, "1": 1, "2": 1, "3": 0}
    assert side["n_microbatches"] == 4 and side["stage_layers"]["0"] == [0, 3]
    trace = json.loads((out / "trace_simulated.json").read_text())
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len([e for e in xs if e["cat"] == "compute"]) == sum(len(r) for r in plan.schedule)
    sh = (out / "launch.sh").read_text()
    assert "--nnodes" in sh and "--node-rank" in sh and "--master-addr" in sh
    assert "octopipe_core.executor.worker" in sh


def test_export_fused_backward_letter_and_errors(tmp_path: Path) -> None:
    prof = load_sample("tiny-hybrid")
    out = export_job(build_plan(prof, "1f1b", 2, 3), prof, tmp_path / "j")
    rows = (out / "schedule.csv").read_text().split()
    assert rows[0] == "0F0,0F1,0B0,0F2,0B1,0B2"  # fused BW exported as torch's full backward B
    (tmp_path / "file").write_text("x")
    with pytest.raises(OctoPipeError, match="is a file"):
        export_job(build_plan(prof, "1f1b", 2, 3), prof, tmp_path / "file")


def test_torch_csv_renumbers_microbatches_for_last_stage_order(tmp_path: Path) -> None:
    # torch's runtime looks losses up by micro-batch index in last-stage forward order
    plan = random_plan(10, 3, 3, seed=5)
    last = plan.num_stages - 1
    assert [a.mb for a in plan.schedule[plan.placement[last]] if a.stage == last][:3] == [1, 0, 2]
    out = export_job(plan, load_sample("tiny-hybrid"), tmp_path / "j")
    rows = [r.split(",") for r in (out / "schedule.csv").read_text().split()]
    f_last = [c for c in rows[plan.placement[last]] if c.startswith(f"{last}F")]
    assert f_last == [f"{last}F0", f"{last}F1", f"{last}F2"]
    side = json.loads((out / "schedule.json").read_text())
    assert side["microbatch_renumbering"] == {"1": 0, "0": 1}


torch = pytest.importorskip("torch")


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_torch_pipeline_runtime_runs_exported_csv(tmp_path: Path) -> None:
    """torch's ``_PipelineScheduleRuntime._load_csv`` runs our CSVs with exact gradients."""
    from octopipe_core.executor.models import ModelSettings
    from octopipe_core.executor.reference import compare_grads, reference_run
    from octopipe_core.executor.torch_csv import run_torch_csv_local

    prof = load_sample("tiny-hybrid")
    fams = [lt.family for lt in prof.layer_costs()]
    by_world = {
        2: [
            build_plan(prof, "zb-h1", 2, 4),
            build_plan(prof, "interleaved", 2, 4),
            build_plan(prof, "dualpipev", 2, 4),
            irregular_plan(prof.num_layers, 4),
        ],
        3: [random_plan(prof.num_layers, 3, 3, seed=5), build_plan(prof, "zbv", 3, 3)],
    }
    for world, plans in by_world.items():
        jobs = []
        for i, plan in enumerate(plans):
            validate_plan(plan, prof.num_layers)
            jobs.append(export_job(plan, prof, tmp_path / f"w{world}-{i}"))
        results = run_torch_csv_local(jobs, world)
        for plan, res in zip(plans, results, strict=True):
            ref_loss, ref_grads = reference_run(fams, ModelSettings(), plan.num_microbatches)
            diff, missing = compare_grads(res["grads"], ref_grads)
            assert not missing and diff < 1e-10, (plan.name, diff, missing)
            assert abs(res["loss"] - ref_loss) < 1e-12


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_octopipe_run_check_sample_plans(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # zbv and the other peers run exactly in test_executor.py (one process group per size)
    cases = [("llama-3-8b", "interleaved", 3, 3)]
    for sample, sched, d, m in cases:
        out = tmp_path / f"job-{sample}"
        assert (
            main(["export", str(_plan_file(tmp_path, sample, sched, d, m)), "--out", str(out)]) == 0
        )
        capsys.readouterr()
        assert main(["run", str(out), "--check", "--steps", "2"]) == 0, capsys.readouterr()
        text = capsys.readouterr().out
        assert "check: OK" in text and "max_abs_grad_diff" in text
        res = json.loads((out / "out" / "result.json").read_text())
        assert len(res["step_ms"]) == 2
        trace = json.loads((out / "out" / "trace_executed.json").read_text())
        assert {e["pid"] for e in trace["traceEvents"] if e["ph"] == "X"} == set(range(d))
    # a user model factory and a hand-made irregular plan
    prof = load_sample("tiny-hybrid")
    path = tmp_path / "hand.json"
    save_plan(irregular_plan(prof.num_layers, 4), path, prof)
    out = tmp_path / "job-hand"
    assert (
        main(
            [
                "export",
                str(path),
                "--out",
                str(out),
                "--dtype",
                "float32",
                "--model",
                "octopipe_core.executor.models:example_factory",
            ]
        )
        == 0
    )
    assert main(["run", str(out), "--check"]) == 0
    assert "check: OK" in capsys.readouterr().out


@pytest.mark.dist
@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["kill", "hang"])
def test_dead_or_hung_rank_ends_job_with_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], mode: str
) -> None:
    out = tmp_path / "job"
    plan = _plan_file(tmp_path, "tiny-hybrid", "1f1b", 2, 4)
    assert main(["export", str(plan), "--out", str(out), "--steps", "2", "--timeout", "5"]) == 0
    monkeypatch.setenv("OCTOPIPE_FAULT", f"1:1:3:{mode}")
    t = time.perf_counter()
    assert main(["run", str(out)]) == 2
    elapsed = time.perf_counter() - t
    err = capsys.readouterr().err
    assert elapsed < 60, elapsed
    assert "octopipe: error: run: the job failed" in err
    if mode == "kill":  # torchrun reports the killed rank (rank 0 may be stopped first)
        assert "rank 1 exited with code -9" in err and "SIGKILL" in err
    else:  # the surviving rank names what it was waiting for
        assert "rank 0: receive" in err and "Timed out" in err


@pytest.mark.timeout(120)
def test_profile_command_writes_loadable_profile(tmp_path: Path) -> None:
    out = tmp_path / "prof.json"
    layers = "embedding,mamba2=mamba*2,attention,mlp,moe,transformer_block,lm_head"
    assert (
        main(
            [
                "profile",
                "--layers",
                layers,
                "--hidden",
                "16",
                "--seq",
                "8",
                "--repeats",
                "3",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    prof = load_profile(out)
    assert prof.num_layers == 8 and prof.layers[1] == prof.layers[2] == "mamba2"
    tm = prof.type_map()
    assert tm["mamba2"].family == "mamba" and tm["lm_head"].output_mib == 0
    for t in prof.layer_types:
        assert t.forward_ms > 0 and t.backward_weight_ms > 0 and t.weight_mib > 0
        if t.family != "embedding":
            assert t.backward_input_ms > 0 and t.activation_mib > 0
    # the measured profile drives the simulator and the executor
    plan = build_plan(prof, "1f1b", 2, 2)
    save_plan(plan, tmp_path / "plan.json", prof)
    assert load_plan(tmp_path / "plan.json")[1] is not None
    assert (
        main(["profile", "--layers", "foo", "--hidden", "8", "--seq", "4", "--out", str(out)]) == 2
    )


def test_run_refuses_a_deadlocking_comm_order_before_launch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "job"
    assert main(["export", str(_plan_file(tmp_path, "tiny-hybrid", "1f1b", 2, 4)), "--out",
                 str(out)]) == 0  # fmt: skip
    cfg_path = out / "executor_config.json"
    cfg = json.loads(cfg_path.read_text())
    r0 = cfg["lowered"][0].split()
    r0.remove("0RECV_B0")
    cfg["lowered"][0] = " ".join(["0RECV_B0", *r0])  # wait for a gradient before any forward
    cfg_path.write_text(json.dumps(cfg))
    t = time.perf_counter()
    assert main(["run", str(out)]) == 2
    assert time.perf_counter() - t < 5  # rejected offline, nothing launched
    err = capsys.readouterr().err
    assert "deadlocks" in err and "wait cycle rank 0 -> rank 1 -> rank 0" in err
    assert not (out / "out").exists()


def test_export_checks_the_model_factory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = _plan_file(tmp_path, "tiny-hybrid", "1f1b", 2, 2)
    assert main(["export", str(plan), "--out", str(tmp_path / "a"), "--model", "nosuch.m:f"]) == 2
    assert "module 'nosuch.m' not found" in capsys.readouterr().err
    assert main(["export", str(plan), "--out", str(tmp_path / "b"), "--model", "nocolon"]) == 2
    assert "expected module:function" in capsys.readouterr().err
    spec = "octopipe_core.executor.models:example_factory"
    assert main(["export", str(plan), "--out", str(tmp_path / "c"), "--model", spec]) == 0
    cfg = json.loads((tmp_path / "c" / "executor_config.json").read_text())
    assert cfg["model"]["factory"] == spec


SAMPLES = ["llama-3-8b", "nemotron-h-8b", "nemotron-h-56b", "jamba-v0.1", "tiny-hybrid"]


@pytest.mark.dist
@pytest.mark.timeout(600)
def test_tune_export_run_check_a_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The new user's path, command by command: tune, export, ``run --check``."""
    plan_path = tmp_path / "tuned.json"
    assert main(["tune", "--profile", "nemotron-h-56b", "--devices", "4", "--microbatches", "4",
                 "--time-budget-s", "1", "--out", str(plan_path)]) == 0  # fmt: skip
    out = tmp_path / "job"
    assert main(["export", str(plan_path), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["run", str(out), "--check", "--steps", "1", "--warmup", "0"]) == 0
    text = capsys.readouterr().out
    assert "check: OK" in text and "max_abs_grad_diff" in text


@pytest.mark.dist
@pytest.mark.timeout(600)
def test_every_sample_tuned_plan_runs_with_exact_gradients() -> None:
    """Each sample's tuned plan, as exported, runs on 4 gloo ranks with the single-process
    reference's loss and gradients; one process group runs them all (one cold start)."""
    from octopipe_core.executor.export import make_config
    from octopipe_core.executor.harness import run_local
    from octopipe_core.executor.reference import check_against_reference
    from octopipe_core.tuner import tune

    profs = [load_sample(s) for s in SAMPLES]
    cfgs = [
        make_config(tune(p, 4, 4, time_budget_s=1, stop_at_convergence=True).plan, p) for p in profs
    ]
    results = run_local(cfgs, 4)
    for name, prof, cfg, res in zip(SAMPLES, profs, cfgs, results, strict=True):
        fams = [lt.family for lt in prof.layer_costs()]
        _, loss_diff, diff, missing = check_against_reference(
            cfg, fams, res["losses"][0], res["grads"]
        )
        assert not missing and diff <= 1e-10, (name, diff, missing[:3])
        assert loss_diff <= 1e-12, name
