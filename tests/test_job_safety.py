"""Job folders: a bad config fails in one line before any process starts, every process a run
starts ends on every exit path, and a job that runs someone else's code asks first."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from octopipe_core.cli import main
from octopipe_core.commands.run import run_process_group
from octopipe_core.errors import OctoPipeError
from octopipe_core.executor.job_config import load_job_config
from octopipe_core.executor.trust import confirm_user_code, strip_cwd_from_path, user_code
from tests.helpers import job_group


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OCTOPIPE_HOME", str(tmp_path / "home"))
    plan = tmp_path / "plan.json"
    assert main(["simulate", "--profile", "tiny-hybrid", "--devices", "2", "--microbatches",
                 "4", "--out", str(plan)]) == 0  # fmt: skip
    out = tmp_path / "job"
    assert main(["export", str(plan), "--out", str(out)]) == 0
    return out


def _edit(job: Path, section: str, key: str, value: object) -> None:
    p = job / "executor_config.json"
    cfg = json.loads(p.read_text())
    cfg.setdefault(section, {})[key] = value
    p.write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    ("section", "key", "value", "field"),
    [
        ("model", "microbatch_size", 0, "model.microbatch_size"),
        ("model", "hidden", "16", "model.hidden"),
        ("model", "dtype", "float8", "model.dtype"),
        ("runtime", "timeout_s", -1, "runtime.timeout_s"),
        ("runtime", "threads", 0, "runtime.threads"),
        ("runtime", "steps", 1.5, "runtime.steps"),
        ("train", "lr", "fast", "train"),
        ("checkpoint", "every", -2, "checkpoint.every"),
    ],
)
def test_bad_config_fields_fail_in_one_line(
    job: Path, section: str, key: str, value: object, field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _edit(job, section, key, value)
    with pytest.raises(OctoPipeError) as e:
        load_job_config(job)
    assert field in str(e.value) and "fix:" in str(e.value) and "\n" not in str(e.value)
    assert main(["run", str(job)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and field in err


def test_truncated_or_wrong_typed_config(job: Path) -> None:
    p = job / "executor_config.json"
    text = p.read_text()
    p.write_text(text[: len(text) // 2])
    with pytest.raises(OctoPipeError, match="invalid JSON"):
        load_job_config(job)
    p.write_text("[1, 2]")
    with pytest.raises(OctoPipeError, match="expected a JSON object"):
        load_job_config(job)
    p.write_text(json.dumps({"model": {}, "runtime": {}, "plan": {"format": "x"}}))
    with pytest.raises(OctoPipeError, match="plan"):
        load_job_config(job)


@pytest.mark.parametrize(
    "argv",
    [["--steps", "0"], ["--timeout", "-1"], ["--warmup", "-3"], ["--timeout", "nan"]],
)
def test_run_flags_are_bounded(job: Path, argv: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        main(["run", str(job), *argv])
    assert e.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("argv", [["--hidden", "1e9"], ["--timeout", "-1"], ["--warmup", "-3"]])
def test_export_flags_are_bounded(job: Path, argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["export", str(job / "plan.json"), "--out", str(job.parent / "j2"), *argv])
    assert e.value.code == 2


def test_user_code_from_elsewhere_needs_trust(job: Path) -> None:
    _edit(job, "model", "factory", "evil_module:build")  # edited: no longer what was exported
    cfg = load_job_config(job)
    assert user_code(cfg) == ["model.factory = evil_module:build"]
    with pytest.raises(OctoPipeError, match="--trust") as e:
        confirm_user_code(cfg, job, trust=False)
    assert "evil_module:build" in str(e.value)
    confirm_user_code(cfg, job, trust=True)  # the user read it and said so
    assert main(["run", str(job)]) == 2  # refused before anything ran


def test_jobs_exported_here_run_without_asking(
    job: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "octo_mymodel.py").write_text(
        "from octopipe_core.executor.models import example_layers as build\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    plan = job / "plan.json"
    out = tmp_path / "mine"
    assert main(["export", str(plan), "--out", str(out), "--model",
                 "octo_mymodel:build"]) == 0  # fmt: skip
    assert user_code(load_job_config(out)) == ["model.factory = octo_mymodel:build"]
    confirm_user_code(load_job_config(out), out, trust=False)  # recorded at export: no prompt


def test_current_directory_is_kept_off_the_import_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", str(tmp_path), *sys.path])
    monkeypatch.delenv("OCTOPIPE_IMPORT_CWD", raising=False)
    strip_cwd_from_path()
    assert "" not in sys.path and str(tmp_path) not in sys.path
    monkeypatch.setattr(sys, "path", ["", *sys.path])
    monkeypatch.setenv("OCTOPIPE_IMPORT_CWD", "1")
    strip_cwd_from_path()
    assert "" in sys.path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purpose
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def test_timeout_ends_every_process(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    cmd = ["bash", "-c", f"sleep 60 & echo $! > {pidfile}; wait"]
    t0 = time.monotonic()
    with pytest.raises(OctoPipeError, match="did not finish"):
        run_process_group(cmd, dict(os.environ), timeout=1.0)
    assert time.monotonic() - t0 < 15
    time.sleep(0.3)
    assert not _alive(int(pidfile.read_text()))


def test_dead_agent_does_not_block_and_leaves_nothing(tmp_path: Path) -> None:
    """The agent exits while its 'worker' lives on holding the output: the call returns at
    once and the worker is ended."""
    pidfile = tmp_path / "child.pid"
    cmd = ["bash", "-c", f"sleep 60 & echo $! > {pidfile}; pwd; exit 3"]
    t0 = time.monotonic()
    proc = run_process_group(cmd, dict(os.environ), timeout=60, cwd=tmp_path)
    assert proc.returncode == 3 and time.monotonic() - t0 < 15
    assert proc.stdout.strip() == str(tmp_path)  # run in the folder asked for
    time.sleep(0.3)
    assert not _alive(int(pidfile.read_text()))


def test_a_test_job_ends_with_its_test_even_when_the_test_fails(tmp_path: Path) -> None:
    """``tests.helpers.job_group``, for tests that talk to a running job: when the test fails
    mid-way, the job and what it started (a shell and its background sleep) end with it."""
    pidfile = tmp_path / "child.pid"
    cmd = ["bash", "-c", f"sleep 60 & echo $! > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; wait"]
    with pytest.raises(RuntimeError, match="the test failed"), job_group(cmd) as proc:
        deadline = time.monotonic() + 30
        while not pidfile.exists():  # renamed into place: the pid is whole when it appears
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert _alive(int(pidfile.read_text()))
        raise RuntimeError("the test failed")
    assert proc.returncode is not None and proc.returncode < 0  # ended by a signal
    deadline = time.monotonic() + 10
    while _alive(int(pidfile.read_text())):
        assert time.monotonic() < deadline, "the background sleep outlived its job"
        time.sleep(0.02)


def _job_processes(job: Path) -> list[int]:
    """PIDs of live processes whose command line names the job folder."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if str(job) in cmd and state != "Z":
                out.append(int(d.name))
    return out


@pytest.mark.dist
@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGKILL"])
def test_every_way_run_ends_ends_every_process_it_started(tmp_path: Path, sig: str) -> None:
    """SIGTERM or SIGHUP to `octopipe run` (it ends the job, one line, 128 + the signal), or
    the run dying outright (SIGKILL: the kernel tells the launcher, which ends its ranks)."""
    import signal
    import subprocess

    from octopipe_core.plan import save_plan
    from octopipe_core.profile import load_sample
    from octopipe_core.schedules import build_plan

    prof = load_sample("tiny-hybrid")
    save_plan(build_plan(prof, "1f1b", 2, 2), tmp_path / "p.json", prof)
    job = tmp_path / "job"
    assert main(["export", str(tmp_path / "p.json"), "--out", str(job), "--steps", "100000"]) == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "octopipe_core", "run", str(job)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (job / "out" / "train_log.jsonl").exists():  # the ranks are training
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        assert len(_job_processes(job)) >= 3  # the run, its launcher and the ranks
        os.kill(proc.pid, getattr(signal, sig))
        err = proc.communicate(timeout=30)[1]
        if sig != "SIGKILL":
            assert proc.returncode == 128 + getattr(signal, sig)
            assert f"stopped by {sig}" in err and "Traceback" not in err
        deadline = time.monotonic() + 20
        while _job_processes(job):
            assert time.monotonic() < deadline, _job_processes(job)
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _job_processes(job):
            os.kill(pid, signal.SIGKILL)
