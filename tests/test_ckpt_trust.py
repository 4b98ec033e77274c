"""A received job folder runs nothing of a checkpoint it carries: ``octopipe run`` resumes only
from checkpoints a job on this machine wrote (their files' hashes, recorded outside the job),
keeps checkpoints inside the job unless the user names a place, and its rotation deletes only
what this job wrote."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

from octopipe_core.cli import main
from octopipe_core.commands.run import launch
from octopipe_core.executor import ckpt_trust
from octopipe_core.plan import save_plan
from octopipe_core.profile import load_sample
from octopipe_core.schedules import build_plan


class _Payload:
    """What a crafted ``.metadata`` runs when unpickled: it creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This machine's records (export and checkpoint registries) in a fresh folder."""
    monkeypatch.setenv("OCTOPIPE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(ckpt_trust.TRUST_ENV, raising=False)
    return tmp_path / "home"


def _job(tmp: Path, name: str, *extra: str) -> Path:
    prof = load_sample("tiny-hybrid")
    plan = tmp / "plan.json"
    if not plan.exists():
        save_plan(build_plan(prof, "1f1b", 2, 2), plan, prof)
    job = tmp / name
    assert main(["export", str(plan), "--out", str(job), *extra]) == 0
    return job


def _craft(job: Path, marker: Path) -> Path:
    """A checkpoint someone sends: a step folder whose DCP metadata is a pickle payload."""
    cfg = json.loads((job / "executor_config.json").read_text())
    step = job / "checkpoints" / "step_000001"
    step.mkdir(parents=True)
    (step / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    meta = {"layout": cfg["layout"], "partition": cfg["plan"]["partition"], "step": 1}
    (step / "octopipe.json").write_text(json.dumps(meta))
    (job / "checkpoints" / "latest").write_text("step_000001\n")
    return step


def test_a_crafted_checkpoint_is_never_loaded(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _job(tmp_path, "job", "--steps", "2")
    marker = tmp_path / "MARKER"
    _craft(job, marker)
    assert main(["run", str(job)]) == 2  # refused before anything is launched
    err = capsys.readouterr().err
    assert "not loaded: no job on this machine wrote it" in err and "--trust" in err
    assert len(err.strip().splitlines()) == 1 and not marker.exists()


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_the_ranks_refuse_it_too(tmp_path: Path, home: Path) -> None:
    # launch.sh and torchrun skip `octopipe run`'s checks: the ranks check before loading
    job = _job(tmp_path, "job", "--steps", "2")
    marker = tmp_path / "MARKER"
    _craft(job, marker)
    proc = launch(job / "executor_config.json", job / "out", 2, [], 120)
    assert proc.returncode != 0 and "not loaded: no job on this machine wrote it" in proc.stderr
    assert not marker.exists()


@pytest.mark.dist
@pytest.mark.timeout(400)
def test_own_checkpoints_resume_and_copies_or_edits_need_trust(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _job(tmp_path, "job", "--steps", "3", "--checkpoint-every", "1")
    foreign = job / "checkpoints" / "step_000000"  # not this job's: the rotation keeps it
    foreign.mkdir(parents=True)
    (foreign / "x").write_text("mine")
    assert main(["run", str(job)]) == 0
    names = sorted(p.name for p in (job / "checkpoints").iterdir())
    # keep 2 (the default): this job's two newest, and the folder it did not write
    assert names == ["latest", "step_000000", "step_000002", "step_000003"]
    assert main(["run", str(job), "--steps", "4"]) == 0  # resumes from its own checkpoint
    assert "resumed from" in capsys.readouterr().out
    # the same folder copied elsewhere is not this machine's record: --trust, or refused
    copy = tmp_path / "copy"
    shutil.copytree(job, copy)
    assert main(["run", str(copy), "--steps", "5"]) == 2
    assert "no job on this machine wrote it" in capsys.readouterr().err
    assert main(["run", str(copy), "--steps", "5", "--trust"]) == 0
    assert "resumed from" in capsys.readouterr().out
    # an edit after the save
    latest = job / "checkpoints" / (job / "checkpoints" / "latest").read_text().strip()
    (latest / ".metadata").write_bytes((latest / ".metadata").read_bytes() + b" ")
    assert main(["run", str(job), "--steps", "6"]) == 2
    assert ".metadata differs from what was saved" in capsys.readouterr().err


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_checkpoints_stay_inside_the_job_unless_the_user_names_a_place(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "elsewhere"
    out.mkdir()
    (out / "step_000001").mkdir()  # someone's, beside a job that points its checkpoints here
    job = _job(tmp_path, "job", "--steps", "2", "--checkpoint-every", "1")
    cfg_path = job / "executor_config.json"
    cfg = json.loads(cfg_path.read_text())
    for bad in ("../elsewhere", str(out)):
        cfg["checkpoint"]["dir"] = bad
        cfg["checkpoint"]["keep"] = 1
        cfg_path.write_text(json.dumps(cfg))
        assert main(["run", str(job), "--trust"]) == 2
        err = capsys.readouterr().err
        assert "field 'checkpoint.dir'" in err and "--checkpoint-dir" in err
    assert (out / "step_000001").is_dir()
    # named on the command line: the user's place, but never over a checkpoint of another
    assert main(["run", str(job), "--trust", "--checkpoint-dir", str(out)]) == 2
    assert "was not written by this job" in capsys.readouterr().err
    (out / "step_000001").rename(out / "step_000000")  # below the steps this run writes
    assert main(["run", str(job), "--trust", "--checkpoint-dir", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["latest", "step_000000", "step_000002"]
    assert json.loads((out / "step_000002" / "octopipe.json").read_text())["step"] == 2
