"""The ``octopipe`` command's input and output: closed pipes, ``--out`` files, ``--plan`` with
``--profile`` (issue 11)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from octopipe_core.cli import main
from octopipe_core.commands import baselines as baselines_cmd
from octopipe_core.commands import common
from octopipe_core.commands import simulate as simulate_cmd
from octopipe_core.errors import OctoPipeError
from octopipe_core.plan import load_plan, save_plan
from octopipe_core.profile import load_sample
from octopipe_core.schedules import PARTITIONS, SCHEDULES, build_plan
from octopipe_core.simulator import simulate

ROOT = Path(__file__).resolve().parent.parent
SIM = ["simulate", "--profile", "tiny-hybrid", "--devices", "2", "--microbatches", "4"]
BASE = ["baselines", "--profile", "tiny-hybrid", "--devices", "2", "--microbatches", "4"]


@pytest.mark.parametrize(
    "argv",
    [
        [*SIM, "--schedule", "zbv", "--show-schedule"],
        [*BASE, "--json"],
        ["--help"],
    ],
    ids=["simulate", "baselines-json", "help"],
)
def test_closed_pipe_is_quiet(argv: list[str]) -> None:
    """``octopipe ... | head``: the reader is gone before the first write; no traceback."""
    r, w = os.pipe()
    os.close(r)  # like `head` that has already exited
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "octopipe_core", *argv],
        stdout=w,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    os.close(w)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert proc.returncode == (0 if argv == ["--help"] else 141)  # argparse drops help quietly


def test_simulate_out_saves_a_plan_that_resimulates(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "sub" / "zbv.json"
    argv = [*SIM, "--schedule", "zbv", "--memory-gib", "3", "--json", "--out", str(out)]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["plan"] == str(out)
    plan, prof = load_plan(out)
    assert prof is not None and prof.name == "tiny-hybrid"  # the profile is embedded
    assert plan.meta["memory_cap_gib"] == 3
    assert main(["simulate", "--plan", str(out), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["step_time_ms"] == first["step_time_ms"]
    assert again["memory_cap_gib"] == 3 and again["fits_memory"] == first["fits_memory"]


def _no_work(*_a: object, **_k: object) -> None:
    raise AssertionError("the command worked before it checked --out")


def test_out_refuses_existing_file_before_the_work(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "plan.json"
    out.write_text("keep me")
    monkeypatch.setattr(simulate_cmd, "simulate", _no_work)
    assert main([*SIM, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "plan.json" in err and "--force" in err
    assert out.read_text() == "keep me"
    monkeypatch.undo()
    assert main([*SIM, "--out", str(out), "--force"]) == 0
    assert load_plan(out)[1] is not None


def test_out_refuses_an_unwritable_place_before_the_work(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    a_file = tmp_path / "not_a_folder"
    a_file.write_text("")
    monkeypatch.setattr(simulate_cmd, "simulate", _no_work)
    monkeypatch.setattr(baselines_cmd, "run_peers", _no_work)
    assert main([*SIM, "--out", str(a_file / "plan.json")]) == 2
    assert "not a writable folder" in capsys.readouterr().err
    assert main([*SIM, "--out", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert main([*BASE, "--out", str(a_file)]) == 2
    assert "is a file" in capsys.readouterr().err
    assert main([*BASE, "--out", str(a_file / "plans")]) == 2
    assert "not a writable folder" in capsys.readouterr().err


def test_baselines_out_saves_every_peer(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "plans"
    assert main([*BASE, "--json", "--out", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    table = data["baselines"]
    ok = [k for k, v in table.items() if "error" not in v]
    assert len(ok) >= 10 and sorted(data["plans"]) == sorted(str(p) for p in out.iterdir())
    for key in ok:
        sched, part = key.split("/")
        plan, prof = load_plan(out / f"{sched}-{part}.json")
        assert prof is not None and plan.name == key
        assert simulate(prof, plan).step_time_ms == pytest.approx(table[key]["step_time_ms"])
    assert main([*BASE, "--out", str(out)]) == 2  # every file exists now
    assert "--force" in capsys.readouterr().err
    assert main([*BASE, "--out", str(out), "--force"]) == 0


def test_baselines_out_checks_before_the_work(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "plans"
    out.mkdir()
    (out / f"{SCHEDULES[-1]}-{PARTITIONS[-1]}.json").write_text("{}")
    monkeypatch.setattr(baselines_cmd, "run_peers", _no_work)
    assert main([*BASE, "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err


def _plan_and_other_profile(tmp_path: Path) -> tuple[Path, Path]:
    """A zbv plan embedding nemotron-h-8b, and the same model on a 10x slower link."""
    prof = load_sample("nemotron-h-8b")
    plan_path = tmp_path / "plan.json"
    save_plan(build_plan(prof, "zbv", 4, 8), plan_path, prof)
    other = prof.with_device(p2p_gbps=5.0)
    other_path = tmp_path / "slow-link.json"
    other_path.write_text(json.dumps(other.to_dict()))
    return plan_path, other_path


def test_simulate_plan_uses_the_given_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    plan_path, other_path = _plan_and_other_profile(tmp_path)
    assert main(["simulate", "--plan", str(plan_path), "--json"]) == 0
    embedded = json.loads(capsys.readouterr().out)["step_time_ms"]
    assert main(["simulate", "--plan", str(plan_path), "--profile", str(other_path), "--json"]) == 0
    cap = capsys.readouterr()
    plan, _ = load_plan(plan_path)
    expected = simulate(common.resolve_profile(str(other_path)), plan).step_time_ms
    assert json.loads(cap.out)["step_time_ms"] == pytest.approx(expected)
    assert expected > embedded  # the slower link is really used
    assert "instead of the profile embedded" in cap.err and cap.err.count("\n") == 1
    # a profile whose layers the plan does not fit: one line naming the plan and the profile
    assert main(["simulate", "--plan", str(plan_path), "--profile", "llama-3-8b"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "plan.json with --profile llama-3-8b" in err


def test_resimulated_plan_can_be_saved_with_the_new_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    plan_path, other_path = _plan_and_other_profile(tmp_path)
    new = tmp_path / "new.json"
    argv = ["simulate", "--plan", str(plan_path), "--profile", str(other_path), "--out", str(new)]
    assert main(argv) == 0
    capsys.readouterr()
    assert load_plan(new)[1] == common.resolve_profile(str(other_path))


def test_other_commands_refuse_a_conflicting_profile(tmp_path: Path) -> None:
    """``export`` keeps the embedded profile; a different --profile is refused, not ignored."""
    plan_path, other_path = _plan_and_other_profile(tmp_path)
    with pytest.raises(OctoPipeError, match="differs from --profile") as e:
        common.plan_with_profile(str(plan_path), str(other_path))
    assert "\n" not in str(e.value) and "--out NEW.json" in str(e.value)
    plan, prof = common.plan_with_profile(str(plan_path), "nemotron-h-8b")  # the same: fine
    assert prof.name == "nemotron-h-8b" and plan.num_devices == 4


def test_profile_and_plan_cluster_check_out_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import octopipe_core.commands.plan_cluster as plan_cluster_cmd
    import octopipe_core.executor.links as links
    import octopipe_core.executor.profiler as profiler

    # any measuring or searching fails this test: the refusal must come first
    monkeypatch.setattr(profiler, "profile_layers", _no_work)
    monkeypatch.setattr(links, "run_links_local", _no_work)
    monkeypatch.setattr(plan_cluster_cmd, "rank_layouts", _no_work)
    mine = tmp_path / "mine.json"
    mine.write_text("mine")
    profile = ["profile", "--layers", "mlp", "--hidden", "8", "--seq", "4", "--out"]
    for argv in (
        [*profile, str(mine)],  # an existing file, no --force
        ["profile", "--links", "--out", str(mine)],
        [*profile, str(tmp_path)],  # a folder, even with --force
        [*profile, "/proc/x.json", "--force"],  # a place nobody can write
        ["plan-cluster", "--profile", "tiny-hybrid", "--cluster", "1x8-h800", "--gpus", "8",
         "--global-batch", "16", "--out", str(mine)],
        ["plan-cluster", "--profile", "tiny-hybrid", "--cluster", "1x8-h800", "--gpus", "8",
         "--global-batch", "16", "--out", str(tmp_path), "--force"],
    ):  # fmt: skip
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "fix:" in err, (argv, err)
    assert mine.read_text() == "mine"


def test_profile_and_run_refuse_sizes_before_allocating(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import octopipe_core.executor.profiler as profiler
    from octopipe_core.plan import save_plan
    from octopipe_core.profile import load_sample
    from octopipe_core.schedules import build_plan

    monkeypatch.setattr(profiler, "profile_layers", _no_work)
    out = str(tmp_path / "p.json")
    base = ["profile", "--out", out, "--layers", "embedding,mlp", "--hidden", "64", "--seq", "8"]
    for extra, want in (
        (["--repeats", "1000000000"], "--repeats"),
        (["--hidden", "100000000"], "--hidden"),
        (["--hidden", "65536", "--vocab", "10000000"], "GiB"),
        (["--seq", "1000000", "--microbatch-size", "65536"], "GiB"),
        (["--links", "--iters", "1000000000"], "--iters"),
        (["--links", "--nproc", "1000"], "--nproc"),
    ):
        try:
            code = main([*base, *extra])
        except SystemExit as e:  # a flag out of its range: argparse's one line, exit 2
            code = int(e.code or 0)
        assert code == 2, extra
        err = capsys.readouterr().err
        assert want in err and len(err.strip().splitlines()) == 1, (extra, err)
    assert main([*base[:4], "mlp*99999999", *base[5:]]) == 2
    assert "over the 20,000 a profile holds" in capsys.readouterr().err
    # a job folder whose stand-in model cannot fit: refused before a rank starts
    prof = load_sample("tiny-hybrid")
    save_plan(build_plan(prof, "1f1b", 2, 2), tmp_path / "plan.json", prof)
    job = tmp_path / "job"
    argv = ["export", str(tmp_path / "plan.json"), "--out", str(job), "--hidden", "65536",
            "--vocab", "10000000"]  # fmt: skip
    assert main(argv) == 0
    assert main(["run", str(job)]) == 2
    err = capsys.readouterr().err
    assert "GiB" in err and "ran 2 ranks" not in err and len(err.strip().splitlines()) == 1


def test_baselines_refuses_a_total_it_cannot_answer_in_time(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every peer alone is under the per-simulation limit; all 14 together are not
    monkeypatch.setattr(baselines_cmd, "run_peers", _no_work)
    argv = ["baselines", "--profile", "nemotron-h-8b", "--devices", "8", "--microbatches"]
    assert main([*argv, "65536"]) == 2
    err = capsys.readouterr().err
    assert "52,428,800 ops" in err and "fix: --microbatches" in err
    assert len(err.strip().splitlines()) == 1
