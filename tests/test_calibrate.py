"""Calibration (``octopipe calibrate``) and the one cost model it fits: per-op fixed costs,
the step's tail, and the least-squares fit that recovers costs injected into known runs."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from octopipe_core.calibrate import fit_profile, nnls, synthetic_run
from octopipe_core.cli import main
from octopipe_core.commands.calibrate import second_plan
from octopipe_core.costs import stage_costs
from octopipe_core.errors import OctoPipeError
from octopipe_core.graph import build_graph, simulate_graph
from octopipe_core.plan import save_plan
from octopipe_core.profile import (
    Profile,
    RuntimeCosts,
    example_profile_dict,
    load_profile,
    load_sample,
    parse_profile_csv,
    profile_to_csv,
)
from octopipe_core.schedules import build_plan
from octopipe_core.simulator import simulate

RT = RuntimeCosts(
    f_op_ms=0.2, b_op_ms=0.3, w_op_ms=0.1, bw_op_ms=0.35, send_op_ms=0.15, step_tail_ms=1.5,
    optimizer_ms_per_mib=0.002,
)  # fmt: skip


def scaled(prof: Profile, f: float, b: float, w: float) -> Profile:
    """``prof`` with every layer's F, B and W times multiplied by ``f``, ``b``, ``w``."""
    types = tuple(
        replace(
            t,
            forward_ms=t.forward_ms * f,
            backward_input_ms=t.backward_input_ms * b,
            backward_weight_ms=t.backward_weight_ms * w,
        )
        for t in prof.layer_types
    )
    return replace(prof, layer_types=types)


# ---- the cost model -------------------------------------------------------------------------
def test_every_op_pays_its_kinds_fixed_cost_once() -> None:
    prof = Profile.from_dict(example_profile_dict())
    part = [(0, 2), (2, 4)]
    plain = stage_costs(prof, part).ops
    with_rt = stage_costs(prof.with_runtime(RT), part).ops
    for k, c in (("F", 0.2), ("B", 0.3), ("W", 0.1), ("BW", 0.35)):
        assert with_rt.ms[k] == pytest.approx([x + c for x in plain.ms[k]])
    # posting a send: stage 0's F and stage 1's B and BW go to the other device, W never
    sent = stage_costs(prof.with_runtime(RT), part).ops_on([0, 1])
    assert sent.ms["F"] == pytest.approx([with_rt.ms["F"][0] + 0.15, with_rt.ms["F"][1]])
    for k in ("B", "BW"):
        assert sent.ms[k] == pytest.approx([with_rt.ms[k][0], with_rt.ms[k][1] + 0.15])
    assert sent.ms["W"] == with_rt.ms["W"]
    assert stage_costs(prof.with_runtime(RT), part).ops_on([0, 0]).ms == with_rt.ms
    # memory terms do not change with the runtime's times
    assert with_rt.free_mib == plain.free_mib and with_rt.alloc_mib == plain.alloc_mib
    # without a BW cost of its own, a fused BW pays the B and the W costs
    no_bw = stage_costs(prof.with_runtime(replace(RT, bw_op_ms=None)), part).ops
    assert no_bw.ms["BW"] == pytest.approx([x + 0.4 for x in plain.ms["BW"]])


def test_simulator_and_graph_add_the_fixed_costs_and_the_step_tail() -> None:
    prof = load_sample("tiny-hybrid")
    for sched in ("1f1b", "zb-h1", "interleaved"):
        plan = build_plan(prof, sched, 2, 4, partition="balanced")
        base = simulate(prof, plan)
        cal = prof.with_runtime(RT)
        r = simulate(cal, plan)
        ops_per_device = max(len(x) for x in plan.schedule)
        assert r.compute_end_ms > base.compute_end_ms + 0.1 * ops_per_device
        weights = [sum(r.costs.weight_mib[s] for s in plan.stages_on(d)) for d in range(2)]
        tail = RT.step_tail_ms + RT.optimizer_ms_per_mib * max(weights)
        assert r.step_time_ms == pytest.approx(r.compute_end_ms + tail)
        times = simulate_graph(build_graph(cal, plan))
        assert max(e for _, e in times.values()) == pytest.approx(r.step_time_ms)


def test_runtime_costs_round_trip_through_json_and_csv() -> None:
    prof = Profile.from_dict(example_profile_dict()).with_runtime(RT)
    assert Profile.from_dict(prof.to_dict()) == prof
    assert parse_profile_csv(profile_to_csv(prof)).runtime == RT
    bad = {**prof.to_dict(), "runtime": {"op_overhead_ms": {"X\n": 1.0}}}
    with pytest.raises(OctoPipeError) as e:
        Profile.from_dict(bad, "p.json")
    assert "\n" not in str(e.value) and "use F, B, W, BW" in str(e.value)
    bad = {**prof.to_dict(), "runtime": {"op_overhead_ms": {"F": -1}}}
    with pytest.raises(OctoPipeError, match=r"runtime\.op_overhead_ms\.F_ms"):
        Profile.from_dict(bad, "p.json")


# ---- the fit ----------------------------------------------------------------------------------
def test_nnls_matches_a_brute_force_search() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        a, b = rng.normal(size=(8, 3)), rng.normal(size=8)
        x = nnls(a, b)
        assert (x >= 0).all()
        best = min(
            np.linalg.norm(a @ np.maximum(rng.normal(size=3) * 2, 0) - b) for _ in range(3000)
        )
        assert np.linalg.norm(a @ x - b) <= best + 1e-9


def test_the_fit_recovers_injected_scales_and_fixed_costs() -> None:
    prior = load_sample("tiny-hybrid")
    truth = scaled(prior, 1.3, 1.2, 1.1).with_runtime(RT)
    zb = build_plan(prior, "zb-h1", 2, 8, partition="uniform")
    plans = [zb, second_plan(zb, prior)[1]]  # what calibrate runs for one plan given
    fit = fit_profile(prior, [synthetic_run(truth, p, f"p{i}") for i, p in enumerate(plans)])
    rt = fit.profile.runtime
    assert rt.step_tail_ms == pytest.approx(RT.step_tail_ms, rel=0.02)
    assert rt.optimizer_ms_per_mib == pytest.approx(RT.optimizer_ms_per_mib, rel=0.02)
    for k in ("F", "B", "W", "BW"):
        assert rt.op_ms(k) == pytest.approx(RT.op_ms(k), abs=0.05), k
    assert rt.send_op_ms == pytest.approx(RT.send_op_ms, abs=0.05)
    assert all(abs(e) < 1.0 for e in fit.step_error_pct().values())
    # plans the fit never saw predict as the truth does
    for sched in ("zb-h2", "interleaved", "zbv"):
        plan = build_plan(prior, sched, 2, 8, partition="uniform")
        got, want = simulate(fit.profile, plan), simulate(truth, plan)
        assert got.step_time_ms == pytest.approx(want.step_time_ms, rel=0.02), sched
    # and the uncalibrated prior does not (so the check above could fail)
    plan = build_plan(prior, "zbv", 2, 8, partition="uniform")
    assert simulate(prior, plan).step_time_ms < 0.9 * simulate(truth, plan).step_time_ms


def test_the_fit_finds_a_slower_device() -> None:
    prior = load_sample("tiny-hybrid")
    truth = prior.with_runtime(replace(RT, device_speed=(1.0, 1.08)))
    zb = build_plan(prior, "zb-h1", 2, 8, partition="uniform")
    plans = [zb, second_plan(zb, prior)[1]]
    fit = fit_profile(prior, [synthetic_run(truth, p, f"p{i}") for i, p in enumerate(plans)])
    assert fit.profile.runtime.device_speed == pytest.approx((1.0, 1.08), abs=0.01)
    # every op on the slower device takes 8 % longer, so the tuner weighs where work goes
    plan = build_plan(prior, "1f1b", 2, 8, partition="balanced")
    swapped = replace(plan, placement=[1, 0])
    here = stage_costs(truth, plan.partition).ops_on(plan.placement).ms["F"]  # d0, d1
    there = stage_costs(truth, plan.partition).ops_on(swapped.placement).ms["F"]  # d1, d0
    assert here[1] == pytest.approx(there[1] * 1.08) and there[0] == pytest.approx(here[0] * 1.08)


def test_stages_of_different_layers_tell_the_layer_types_apart() -> None:
    prior = load_sample("tiny-hybrid")
    slow = {"mamba2"}  # in the truth, one type's forward is twice what the prior says
    types = tuple(
        replace(t, forward_ms=t.forward_ms * (2.0 if t.name in slow else 1.0))
        for t in prior.layer_types
    )
    truth = replace(prior, layer_types=types)
    plans = [
        build_plan(prior, s, 2, 8, partition=p)
        for s, p in (("1f1b", "balanced"), ("zb-h1", "uniform"), ("interleaved", "balanced"))
    ]
    fit = fit_profile(prior, [synthetic_run(truth, p, f"p{i}") for i, p in enumerate(plans)])
    got = fit.profile.type_map()
    top = max(t.forward_ms for t in truth.layer_types)
    for t in truth.layer_types:  # within 10 % of the largest forward (the embedding's is tiny)
        assert got[t.name].forward_ms == pytest.approx(t.forward_ms, abs=0.1 * top), t.name
    mamba = got["mamba2"].forward_ms
    assert mamba == pytest.approx(2 * prior.type_map()["mamba2"].forward_ms, rel=0.1)
    assert all(abs(e) < 2.0 for e in fit.step_error_pct().values())


def test_a_fit_records_what_it_was_calibrated_from() -> None:
    prior = load_sample("tiny-hybrid")
    plan = build_plan(prior, "1f1b", 2, 4, partition="balanced")
    fit = fit_profile(prior, [synthetic_run(prior, plan, "a.json")], {"plans": ["a.json"]})
    rec = fit.profile.to_dict()["calibration"]
    assert rec["plans"] == ["a.json"] and set(rec["residuals"]) >= {"F", "BW"}
    assert set(rec["step_error_pct"]) == {"a.json"}
    with pytest.raises(OctoPipeError, match="no runs to fit"):
        fit_profile(prior, [])


# ---- the command line -------------------------------------------------------------------------
def test_calibrate_checks_its_out_path_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prof = load_sample("tiny-hybrid")
    plan = tmp_path / "p.json"
    save_plan(build_plan(prof, "1f1b", 2, 4), plan, prof)
    out = tmp_path / "cal.json"
    out.write_text("mine")
    assert main(["calibrate", str(plan), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and len(err.strip().splitlines()) == 1
    assert out.read_text() == "mine"
    assert main(["calibrate", "--out", str(tmp_path / "x.json")]) == 2
    assert "nothing to fit" in capsys.readouterr().err


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "octopipe_core", *args],
        cwd=cwd, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real calibration: one plan given (a second is added), 2 gloo ranks, a few steps."""
    tmp = tmp_path_factory.mktemp("calibrate")
    prof = load_sample("tiny-hybrid")
    save_plan(build_plan(prof, "zb-h1", 2, 4, partition="balanced"), tmp / "zb.json", prof)
    proc = _cli(
        "calibrate", "zb.json", "--out", "cal.json", "--steps", "4", "--warmup", "1", "--json",
        cwd=tmp,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return {"dir": tmp, "summary": json.loads(proc.stdout), "stderr": proc.stderr}


@pytest.mark.dist
@pytest.mark.timeout(600)
def test_calibrate_runs_two_plans_and_writes_a_profile_that_simulates(
    calibrated: dict[str, Any],
) -> None:
    tmp, summary = calibrated["dir"], calibrated["summary"]
    assert "added interleaved-x5/uniform" in calibrated["stderr"]  # a second partition, on its own
    assert "round 2/2: running" in calibrated["stderr"]  # live progress lines, 2 rounds each
    assert set(summary["step_error_pct"]) == {"zb.json", "interleaved-x5/uniform"}
    assert set(summary["residuals"]) >= {"F", "B", "W", "BW"}
    assert all(v > 0 for v in summary["measured_median_ms"].values())
    prof = load_profile(tmp / "cal.json")
    rec = json.loads(prof.calibration)
    assert rec["plans"] == ["zb.json", "interleaved-x5/uniform"] and rec["backend"] == "auto"
    assert rec["steps"] == 4 and rec["rounds"] == 2 and rec["date"].startswith("20")
    assert prof.tokens_per_microbatch == 8 * 2  # the executed model: seq 8, micro-batch 2
    assert prof.runtime.op_ms("F") >= 0 and prof.device.p2p_latency_us >= 0
    sim = _cli("simulate", "--plan", "zb.json", "--profile", "cal.json", "--json", cwd=tmp)
    assert sim.returncode == 0, sim.stderr
    step = json.loads(sim.stdout)["step_time_ms"]
    measured = summary["measured_median_ms"]["zb.json"]
    # the calibrated profile predicts the run it was fitted to (a few noisy steps on 2 cores)
    assert step == pytest.approx(measured, rel=0.5)


@pytest.mark.dist
@pytest.mark.timeout(600)
def test_calibrate_from_a_recorded_trace_fits_what_its_result_fits(tmp_path: Path) -> None:
    from octopipe_core.calibrate import fit_profile
    from octopipe_core.commands.calibrate import run_from_result
    from octopipe_core.plan import load_plan

    prof = load_sample("tiny-hybrid")
    save_plan(
        build_plan(prof, "interleaved", 2, 4, partition="balanced"), tmp_path / "p.json", prof
    )
    for args in (
        ["export", "p.json", "--out", "job", "--steps", "3", "--warmup", "1"],
        ["run", "job"],
    ):
        proc = _cli(*args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    trace = tmp_path / "job" / "out" / "trace_executed.json"
    # the job folder's own plan (executor_config.json beside out/)
    proc = _cli("calibrate", "--trace", str(trace), "--out", "c.json", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert set(summary["step_error_pct"]) == {"job"}
    from_trace = load_profile(tmp_path / "c.json")
    assert json.loads(from_trace.calibration)["from"] == "traces"
    # the same fit as from the run's result.json: the trace carries everything it needs
    plan, _ = load_plan(tmp_path / "p.json")
    res = json.loads((tmp_path / "job" / "out" / "result.json").read_text())
    direct = fit_profile(prof, [run_from_result("job", plan, res)]).profile
    assert from_trace.runtime.op_ms("F") == pytest.approx(direct.runtime.op_ms("F"), abs=1e-6)
    assert from_trace.runtime.step_tail_ms == pytest.approx(direct.runtime.step_tail_ms, abs=1e-6)
    got, want = from_trace.type_map(), direct.type_map()
    for name, t in want.items():
        assert got[name].forward_ms == pytest.approx(t.forward_ms, abs=1e-6), name
    # a plan per trace, paired in order; a count that does not pair is a one-line error
    proc = _cli("calibrate", "p.json", "p.json", "--trace", str(trace), "--out", "d.json",
                cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2 and "2 plans for 1 traces" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.dist
@pytest.mark.timeout(600)
def test_calibrate_at_dp_2_fits_the_tail_of_a_pp_x_dp_step(tmp_path: Path) -> None:
    prof = load_sample("tiny-hybrid")
    save_plan(build_plan(prof, "zb-h1", 2, 4, partition="balanced"), tmp_path / "zb.json", prof)
    argv = ["calibrate", "zb.json", "--out", "cal.json", "--dp", "2", "--steps", "3",
            "--rounds", "1", "--warmup", "1", "--json"]  # fmt: skip
    proc = _cli(*argv, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "(4 ranks," in proc.stderr  # 2 pipeline devices x 2 replicas
    got = load_profile(tmp_path / "cal.json")
    assert json.loads(got.calibration)["dp"] == 2
    # the step's tail (reductions, all-reduce, optimizer) is in the fitted step
    assert got.runtime.step_tail_ms > 0
    summary = json.loads(proc.stdout)  # its accuracy at DP 2 depends on the load: see docs
    assert set(summary["step_error_pct"]) == {"zb.json", "interleaved-x5/uniform"}
    assert all(math.isfinite(e) for e in summary["step_error_pct"].values())
    proc = _cli(*argv[:-1], "--dp", "17", "--force", cwd=tmp_path)
    assert proc.returncode == 2 and "--dp 17 is over 16" in proc.stderr
