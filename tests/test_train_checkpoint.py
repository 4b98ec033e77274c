"""Checkpoints (torch.distributed.checkpoint) of a PP2 x DP2 ZeRO-1 job: a run of 6 steps has
exactly the losses of 1 step + STOP + resume to 3 + resume to 6 (float64), checkpoints every
N steps, only the newest kept, and a checkpoint of another layout is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from octopipe_core.cli import main
from octopipe_core.plan import save_plan
from octopipe_core.profile import FORMAT, Profile
from octopipe_core.schedules import build_plan

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
    common = ["--dp", "2", "--zero1", "--steps", "6", "--checkpoint-every", "3", "--lr", "0.02",
              "--lr-warmup-steps", "2"]  # fmt: skip
    a, b = tmp_path / "a", tmp_path / "b"
    for job in (a, b):
        assert main(["export", str(plan), "--out", str(job), *common]) == 0
    assert main(["run", str(a)]) == 0
    whole = logged(a)
    assert [s for s, _ in whole] == [1, 2, 3, 4, 5, 6]
    assert sorted(p.name for p in (a / "checkpoints").iterdir()) == [
        "latest", "step_000003", "step_000006"]  # fmt: skip

    (b / "STOP").touch()  # checkpoint after the current step and stop
    assert main(["run", str(b)]) == 0
    out = capsys.readouterr().out
    assert "stopped at step 1 (STOP file)" in out and not (b / "STOP").exists()
    assert (b / "checkpoints" / "latest").read_text().strip() == "step_000001"
    assert main(["run", str(b), "--steps", "3"]) == 0
    assert "resumed from" in capsys.readouterr().out
    assert main(["run", str(b)]) == 0
    assert logged(b) == whole  # exact: float64, same reductions in the same order
    assert sorted(p.name for p in (b / "checkpoints").iterdir()) == [
        "latest", "step_000003", "step_000006"]  # fmt: skip
    assert main(["run", str(b)]) == 0
    assert "nothing to run: the job is at step 6" in capsys.readouterr().out

    # the same checkpoints under another layout: refused, naming the field
    cfg_path = b / "executor_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["layout"]["zero1"] = False
    cfg_path.write_text(json.dumps(cfg))
    assert main(["run", str(b), "--steps", "7"]) == 2
    err = capsys.readouterr().err
    assert "field 'layout'" in err and "fix: resume with the same plan and layout" in err
