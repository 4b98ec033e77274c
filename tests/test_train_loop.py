"""The training loop of an exported job: a PP2 x DP2 job trains on a fixed token file (loss
falls over 30 steps, progress lines and a JSON log), the synthetic task is learnable, a data
hook gives each replica its own shard, and bad token files fail with one clear line."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from octopipe_core.cli import main
from octopipe_core.errors import OctoPipeError
from octopipe_core.plan import save_plan
from octopipe_core.profile import FORMAT, Profile
from octopipe_core.schedules import build_plan

torch = pytest.importorskip("torch")

LAYERS = ["embedding", "attention", "mlp", "attention", "mlp", "lm_head"]


def profile() -> Profile:
    lt = {"forward_ms": 1.0, "backward_input_ms": 1.0, "backward_weight_ms": 1.0,
          "activation_mib": 1.0, "weight_mib": 1.0, "output_mib": 0.1}  # fmt: skip
    return Profile.from_dict(
        {
            "format": FORMAT,
            "name": "train-test",
            "tokens_per_microbatch": 16,
            "layer_types": {f: {**lt, "family": f} for f in dict.fromkeys(LAYERS)},
            "layers": LAYERS,
        }
    )


def plan_file(tmp: Path, sched: str = "zb-h1", m: int = 4) -> Path:
    prof = profile()
    path = tmp / "plan.json"
    save_plan(build_plan(prof, sched, 2, m), path, prof)
    return path


def token_file(path: Path, vocab: int = 64, n: int = 20_000, dtype: type = np.uint16) -> Path:
    """A learnable stream: runs of t -> (5 t + 1) mod vocab from random starts."""
    rng = np.random.default_rng(0)
    toks = np.empty(n, dtype=np.int64)
    for i in range(n):
        toks[i] = rng.integers(vocab) if i % 50 == 0 else (5 * toks[i - 1] + 1) % vocab
    toks.astype(dtype).tofile(path)
    return path


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_pp2_dp2_job_trains_on_a_token_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = token_file(tmp_path / "train.bin")
    job = tmp_path / "job"
    args = ["export", str(plan_file(tmp_path)), "--out", str(job), "--dp", "2", "--hidden",
            "32", "--data", str(data), "--steps", "30", "--lr", "0.03", "--lr-warmup-steps",
            "2", "--dtype", "float32"]  # fmt: skip
    assert main(args) == 0
    assert "20,000 tokens (uint16)" in capsys.readouterr().out
    cfg = json.loads((job / "executor_config.json").read_text())
    assert cfg["layout"]["dp"] == 2 and cfg["data"]["kind"] == "tokens"
    assert main(["run", str(job)]) == 0
    out = capsys.readouterr().out
    assert "ran 4 ranks" in out
    lines = [ln for ln in out.splitlines() if ln.startswith("step ")]
    assert len(lines) == 30 and lines[-1].startswith("step 30/30 | loss ")
    assert "tokens/s" in lines[-1] and "ms/step" in lines[-1]
    log = [json.loads(x) for x in (job / "out" / "train_log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in log]
    assert len(losses) == 30 and all(r["tokens_per_s"] > 0 for r in log)
    assert sum(losses[-5:]) / 5 < 0.75 * losses[0], losses
    lrs = [r["lr"] for r in log]
    assert lrs[0] < lrs[1] and lrs[-1] < lrs[2]  # warm-up, then cosine decay
    res = json.loads((job / "out" / "result.json").read_text())
    assert res["losses"] == pytest.approx(losses)


HOOK = """
import torch

def batch(step, replica, replicas, microbatches, microbatch_size, seq, vocab):
    g = torch.Generator().manual_seed(1000 * step + replica)
    x = torch.randint(0, vocab, (microbatches * microbatch_size, seq), generator=g)
    return x, (x + replica + 1) % vocab
"""


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_data_hook_shards_and_synthetic_task_is_learnable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from octopipe_core.executor.data import config_batches
    from octopipe_core.executor.export import make_config
    from octopipe_core.executor.harness import run_local
    from octopipe_core.executor.models import ModelSettings
    from octopipe_core.executor.reference import compare_grads, reference_run

    (tmp_path / "myhook.py").write_text(textwrap.dedent(HOOK))
    monkeypatch.syspath_prepend(str(tmp_path))
    prof = profile()
    plan = build_plan(prof, "1f1b", 2, 3)
    hook = {"kind": "hook", "hook": "myhook:batch"}
    hooked = make_config(plan, prof, layout={"dp": 2}, data=hook)
    synth = make_config(plan, prof, {"hidden": 32}, layout={"dp": 2}, train={"lr": 0.03})
    hook_res, synth_res = run_local([hooked, synth], 4, steps=20, record=("grads",))
    batches = config_batches(hooked, 0)
    assert torch.equal(batches[1][1], (batches[1][0] + 2) % 64)  # replica 1's own shard
    fams = [lt.family for lt in prof.layer_costs()]
    ref_loss, ref_grads = reference_run(fams, ModelSettings.from_dict(hooked["model"]), 3, batches)
    diff, missing = compare_grads(hook_res["grads"], ref_grads)
    assert not missing and diff < 1e-10 and abs(hook_res["losses"][0] - ref_loss) < 1e-12
    losses = synth_res["losses"]
    assert len(losses) == 20 and sum(losses[-3:]) / 3 < 0.8 * losses[0], losses


def test_bad_token_files_fail_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = plan_file(tmp_path)
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x00\x02")
    assert main(["export", str(plan), "--out", str(tmp_path / "a"), "--data", str(odd)]) == 2
    err = capsys.readouterr().err
    assert f"token file {odd}: 3 bytes is not a whole number of uint16" in err
    assert not (tmp_path / "a").exists()
    big = token_file(tmp_path / "big.bin", vocab=1000, n=500)
    assert main(["export", str(plan), "--out", str(tmp_path / "b"), "--data", str(big)]) == 2
    err = capsys.readouterr().err
    assert "token id " in err and ">= vocab 64; fix: export with --vocab" in err
    tiny = token_file(tmp_path / "tiny.bin", n=10)
    assert main(["export", str(plan), "--out", str(tmp_path / "c"), "--data", str(tiny),
                 "--dp", "2"]) == 2  # fmt: skip
    assert "fewer than one sample" in capsys.readouterr().err
    # a path missing here is only noted at export; the job then fails with the file's name
    assert main(["export", str(plan), "--out", str(tmp_path / "d"), "--data", "nope.bin"]) == 0
    assert "is not here" in capsys.readouterr().out
    from octopipe_core.executor.data import check_token_file

    with pytest.raises(OctoPipeError, match=r"nope.bin: not found; fix"):
        check_token_file(tmp_path / "d" / "nope.bin", "uint16", 64, 8, 1)
    assert main(["export", str(plan), "--out", str(tmp_path / "e"), "--data", "x.bin",
                 "--data-hook", "m:f"]) == 2  # fmt: skip
    assert "pick one" in capsys.readouterr().err


@pytest.mark.dist
@pytest.mark.timeout(150)
def test_killed_rank_ends_a_dp_job_with_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import time

    job = tmp_path / "job"
    assert main(["export", str(plan_file(tmp_path)), "--out", str(job), "--dp", "2", "--steps",
                 "3", "--timeout", "10"]) == 0  # fmt: skip
    monkeypatch.setenv("OCTOPIPE_FAULT", "3:1:2")  # global rank 3 (replica 1) dies in step 2
    t = time.perf_counter()
    assert main(["run", str(job)]) == 2
    assert time.perf_counter() - t < 90
    err = capsys.readouterr().err
    assert "octopipe: error: run: the job failed" in err
    assert "rank 3 exited with code -9" in err and "SIGKILL" in err


def test_merged_results_list_each_ranks_peak_memory_in_rank_order() -> None:
    from octopipe_core.executor.train import merge_results

    def part(rank: int, peak: float | None) -> dict[str, object]:
        return {"rank": rank, "replica": 0, "losses": [1.0], "steps": [(0.0, 1.0)],
                "records": [], "tail": [], "grads": {}, "peak_memory_gib": peak}  # fmt: skip

    # gathered parts may come in any order; the list follows the ranks
    res = merge_results([part(1, 3.5), part(0, 2.0), part(2, None)], warmup=0)
    assert res["peak_memory_gib"] == [2.0, 3.5, None]


def test_steps_run_with_the_collector_off_and_it_comes_back() -> None:
    import gc

    from octopipe_core.executor.train import manual_gc

    assert gc.isenabled()
    with manual_gc():
        assert not gc.isenabled()  # no full collection in the middle of a step
    assert gc.isenabled()
    try:
        with manual_gc():
            raise RuntimeError("a rank failed")
    except RuntimeError:
        pass
    assert gc.isenabled()
