"""Checkpoints (torch.distributed.checkpoint) of a PP2 x DP2 ZeRO-1 job: a run of 4 steps has
exactly the losses of 1 step + STOP + resume to 4 (float64), checkpoints every N steps, only
the newest kept, and a checkpoint of another layout is refused in one line before launching."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from octopipe_core.cli import main
from octopipe_core.plan import save_plan
from octopipe_core.profile import FORMAT, Profile
from octopipe_core.schedules import build_plan
from tests.helpers import job_group

torch = pytest.importorskip("torch")

LAYERS = ["embedding", "attention", "mlp", "mlp", "lm_head"]


def plan_file(tmp: Path) -> Path:
    lt = {"forward_ms": 1.0, "backward_input_ms": 1.0, "backward_weight_ms": 1.0,
          "activation_mib": 1.0, "weight_mib": 1.0, "output_mib": 0.1}  # fmt: skip
    prof = Profile.from_dict(
        {
            "format": FORMAT,
            "name": "ckpt-test",
            "tokens_per_microbatch": 16,
            "layer_types": {f: {**lt, "family": f} for f in dict.fromkeys(LAYERS)},
            "layers": LAYERS,
        }
    )
    path = tmp / "plan.json"
    save_plan(build_plan(prof, "zbv", 2, 4), path, prof)
    return path


def logged(job: Path) -> list[tuple[int, float]]:
    lines = (job / "out" / "train_log.jsonl").read_text().splitlines()
    return [(r["step"], r["loss"]) for r in map(json.loads, lines)]


@pytest.mark.dist
@pytest.mark.timeout(400)
def test_resumed_run_has_the_losses_of_an_uninterrupted_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = plan_file(tmp_path)
    common = ["--dp", "2", "--zero1", "--steps", "4", "--checkpoint-every", "2", "--lr", "0.02",
              "--lr-warmup-steps", "2"]  # fmt: skip
    a, b = tmp_path / "a", tmp_path / "b"
    for job in (a, b):
        assert main(["export", str(plan), "--out", str(job), *common]) == 0
    (a / "CHECKPOINT").touch()  # checkpoint after the current step and go on
    assert main(["run", str(a)]) == 0
    assert "step_000001" in capsys.readouterr().out and not (a / "CHECKPOINT").exists()
    whole = logged(a)
    assert [s for s, _ in whole] == [1, 2, 3, 4]
    assert sorted(p.name for p in (a / "checkpoints").iterdir()) == [
        "latest", "step_000002", "step_000004"]  # fmt: skip

    (b / "STOP").touch()  # checkpoint after the current step and stop
    assert main(["run", str(b)]) == 0
    out = capsys.readouterr().out
    assert "stopped at step 1 (STOP file)" in out and not (b / "STOP").exists()
    assert (b / "checkpoints" / "latest").read_text().strip() == "step_000001"
    assert main(["run", str(b)]) == 0  # resumes at step 1, checkpoints at 2 and 4
    assert "resumed from" in capsys.readouterr().out
    assert logged(b) == whole  # exact: float64, same reductions in the same order
    assert sorted(p.name for p in (b / "checkpoints").iterdir()) == [
        "latest", "step_000002", "step_000004"]  # fmt: skip

    # answered before launching: nothing left to run, and a checkpoint of another layout
    assert main(["run", str(b)]) == 0
    out = capsys.readouterr().out
    assert "nothing to run: the job is at step 4" in out and "ran 4 ranks" not in out
    cfg_path = b / "executor_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["layout"]["zero1"] = False
    cfg_path.write_text(json.dumps(cfg))
    assert main(["run", str(b), "--steps", "7"]) == 2
    cap = capsys.readouterr()
    assert "field 'layout'" in cap.err and "fix: resume with the same plan and layout" in cap.err
    assert "torchrun" not in cap.err and "ran 4 ranks" not in cap.out


def _worker_pids(job: Path) -> list[int]:
    """PIDs of this test's own ranks: the children of the launcher whose command line names
    the job folder (the launcher itself is left alone)."""
    procs: dict[int, tuple[int, str]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        procs[int(d.name)] = (ppid, cmd)
    launchers = {
        pid for pid, (_, cmd) in procs.items()
        if "octopipe_core.executor.local_launch" in cmd and str(job) in cmd
    }  # fmt: skip
    return [pid for pid, (ppid, _) in procs.items() if ppid in launchers]


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_sigusr1_checkpoints_and_stop_file_ends_a_running_job(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    job = tmp_path / "job"
    assert main(["export", str(plan_file(tmp_path)), "--out", str(job), "--steps", "5000"]) == 0
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root))
    cmd = [sys.executable, "-m", "octopipe_core", "run", str(job)]
    with job_group(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
        log = job / "out" / "train_log.jsonl"
        deadline = time.time() + 120
        while time.time() < deadline and not (log.exists() and log.read_text().count("\n") >= 2):
            time.sleep(0.2)
        pids = _worker_pids(job)
        assert len(pids) == 2
        os.kill(pids[1], signal.SIGUSR1)  # one rank asks; every rank checkpoints
        while time.time() < deadline and not (job / "checkpoints" / "latest").exists():
            time.sleep(0.2)
        first = (job / "checkpoints" / "latest").read_text().strip()
        (job / "STOP").touch()
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-6000:]
    step = int(first.removeprefix("step_"))
    assert 2 <= step < 5000
    stopped = [ln for ln in out.splitlines() if "stopped at step" in ln]
    assert len(stopped) == 1 and "(STOP file)" in stopped[0]
    assert (job / "checkpoints" / "latest").read_text().strip() != first  # STOP saved again


def test_a_stop_request_that_arrives_during_a_checkpoint_is_kept(tmp_path: Path) -> None:
    """A checkpoint clears only the requests it answered: a STOP file written while a periodic
    (or CHECKPOINT-requested) checkpoint is saved stays for the next step to read. It used to be
    removed with the rest, and the job ran on to its last step."""
    from octopipe_core.executor.checkpoint import clear_requests, requested

    (tmp_path / "STOP").touch()
    (tmp_path / "CHECKPOINT").touch()
    clear_requests(tmp_path, stop=False, checkpoint=True)
    assert requested(tmp_path) == (True, False)
    clear_requests(tmp_path, stop=False, checkpoint=False)  # a periodic checkpoint
    assert requested(tmp_path) == (True, False)
    clear_requests(tmp_path, stop=True, checkpoint=False)  # the job stops for it
    assert requested(tmp_path) == (False, False)
