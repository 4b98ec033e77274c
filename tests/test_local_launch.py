"""``octopipe run``'s launcher (``executor.local_launch``): ranks forked from one interpreter
that imported torch once; a rank that fails is named with its exit code; SIGUSR1 to the
launcher reaches the ranks (a checkpoint), SIGTERM ends every rank and the job fails in one
line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from octopipe_core.cli import main
from octopipe_core.commands.run import summarize_failure, worker_env
from octopipe_core.plan import save_plan
from octopipe_core.profile import load_sample
from octopipe_core.schedules import build_plan


def _launch(*args: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "octopipe_core.executor.local_launch", *args]
    return subprocess.Popen(
        cmd, env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", [[], ["--exec"]], ids=["forked", "exec"])
def test_failing_ranks_are_named_and_fail_the_launch(tmp_path: Path, mode: list[str]) -> None:
    proc = _launch("--nproc", "2", *mode, "--", str(tmp_path / "missing.json"))
    out, _ = proc.communicate(timeout=100)
    assert proc.returncode == 1, out
    # a rank ran the worker, which refused the missing config in one line; the launcher named
    # it (a rank still starting when the first failed is stopped, not named)
    named = [e for e in summarize_failure(out) if e.startswith("rank ")]
    assert out.count("octopipe worker: error") >= len(named) >= 1
    assert all(e.endswith("exited with code 2") for e in named), named


def test_launcher_refuses_a_call_without_worker_arguments() -> None:
    proc = _launch("--nproc", "0", "--", "x.json")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "needs --nproc >= 1" in out


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_sigusr1_is_passed_on_and_sigterm_ends_every_rank(tmp_path: Path) -> None:
    job, plan = tmp_path / "job", tmp_path / "plan.json"
    prof = load_sample("tiny-hybrid")
    save_plan(build_plan(prof, "1f1b", 2, 4), plan, prof)
    assert main(["export", str(plan), "--out", str(job), "--steps", "5000"]) == 0
    cfg = str(job / "executor_config.json")
    proc = _launch("--nproc", "2", "--", cfg, "--backend", "gloo", "--no-resume")
    try:
        log = job / "out" / "train_log.jsonl"
        deadline = time.time() + 120
        while time.time() < deadline and not (log.exists() and log.read_text().count("\n") >= 1):
            time.sleep(0.2)
        assert log.exists(), "the job never logged a step"
        ranks = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
                 .read_text().split()]  # fmt: skip
        assert len(ranks) == 2
        proc.send_signal(signal.SIGUSR1)  # passed on to the ranks: they checkpoint
        latest = job / "checkpoints" / "latest"
        while time.time() < deadline and not latest.exists():
            time.sleep(0.2)
        assert latest.exists(), "SIGUSR1 to the launcher did not reach the ranks"
        t = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert time.monotonic() - t < 30
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, out[-3000:]
    assert "octopipe launch: stopped by SIGTERM: every rank ended" in out
    assert "exited with" not in out  # the ranks it stopped did not fail on their own
    assert not any(Path(f"/proc/{pid}").exists() for pid in ranks)


def test_the_checkpoint_module_is_preloaded_only_for_jobs_that_use_it(tmp_path: Path) -> None:
    """``torch.distributed.checkpoint`` takes 1.5 s of CPU to import: the launcher loads it
    before forking only when the job saves checkpoints as it goes or resumes from one."""
    import json

    from octopipe_core.executor.local_launch import CHECKPOINT_MODULE, preload_modules

    cfg = tmp_path / "executor_config.json"

    def wants(checkpoint: dict[str, object], *args: str) -> bool:
        cfg.write_text(json.dumps({"checkpoint": checkpoint}))
        return CHECKPOINT_MODULE in preload_modules([str(cfg), *args])

    assert not wants({"every": 0})  # only on request: a rank imports it then
    assert wants({"every": 5})
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "latest").write_text("step_2")
    assert wants({"every": 0, "dir": "ck"})  # a checkpoint to resume from, next to the config
    assert not wants({"every": 0, "dir": "ck"}, "--no-resume")
    assert not wants({"every": 0, "dir": "ck", "resume": False})
    assert not wants({"every": "x"})  # a config the worker refuses: nothing to load for it
