"""The process-group backend: NCCL only where every local rank has a GPU of its own (NCCL
refuses two ranks on one device), else gloo for "auto" and a one-line error for "nccl"."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from octopipe_core.cli import main  # noqa: E402
from octopipe_core.errors import OctoPipeError  # noqa: E402
from octopipe_core.executor.runtime import pick_backend  # noqa: E402


def _gpus(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


@pytest.mark.parametrize(
    ("gpus", "ranks", "want"),
    [(0, 1, "gloo"), (1, 1, "nccl"), (1, 2, "gloo"), (8, 8, "nccl"), (8, 9, "gloo")],
)
def test_auto_picks_nccl_only_with_a_gpu_per_local_rank(
    monkeypatch: pytest.MonkeyPatch, gpus: int, ranks: int, want: str
) -> None:
    _gpus(monkeypatch, gpus)
    assert pick_backend("auto", ranks) == want
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(ranks))  # torchrun's, when no count is given
    assert pick_backend("auto") == want


def test_nccl_without_a_gpu_per_rank_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpus(monkeypatch, 1)
    assert pick_backend("nccl", 1) == "nccl" and pick_backend("gloo", 4) == "gloo"
    with pytest.raises(OctoPipeError, match=r"2 rank\(s\) on this node but 1 GPU.*--backend gloo"):
        pick_backend("nccl", 2)


def test_run_refuses_nccl_before_launching(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _gpus(monkeypatch, 0)
    plan = tmp_path / "plan.json"
    args = ["--profile", "tiny-hybrid", "--schedule", "1f1b", "--devices", "2"]
    assert main(["simulate", *args, "--microbatches", "2", "--out", str(plan)]) == 0
    assert main(["export", str(plan), "--out", str(tmp_path / "job")]) == 0
    capsys.readouterr()
    assert main(["run", str(tmp_path / "job"), "--backend", "nccl"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "NCCL needs one GPU per rank" in err, err
    assert not (tmp_path / "job" / "out").exists()  # nothing was launched


def test_a_worker_without_a_gpu_per_rank_stops_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchrun's launch.sh starts the workers itself: each refuses NCCL with one line."""
    from octopipe_core.executor import worker

    _gpus(monkeypatch, 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    plan = tmp_path / "plan.json"
    args = ["--profile", "tiny-hybrid", "--schedule", "1f1b", "--devices", "2"]
    assert main(["simulate", *args, "--microbatches", "2", "--out", str(plan)]) == 0
    assert main(["export", str(plan), "--out", str(tmp_path / "job")]) == 0
    capsys.readouterr()
    cfg = str(tmp_path / "job" / "executor_config.json")
    assert worker.main([cfg, "--backend", "nccl"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("octopipe worker: error: backend nccl: 2 rank(s)") and "\n" not in err
