"""``octopipe profile --model``: the user's own layers (model hooks, HuggingFace tiny models,
stand-ins) give a loadable profile with one row per layer; its tuned plan exports and runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from octopipe_core.cli import main  # noqa: E402
from octopipe_core.executor.models import ModelSettings, build_layers  # noqa: E402
from octopipe_core.executor.profiler import MIB, parse_layers, profile_layers  # noqa: E402
from octopipe_core.profile import load_profile  # noqa: E402

LLAMA = "octopipe_core.executor.hf:llama_tiny"
HYBRID = "octopipe_core.executor.hf:hybrid_tiny"


def _profile_cli(tmp: Path, model: str, layers: str, *extra: str) -> Path:
    out = tmp / "prof.json"
    args = ["profile", "--layers", layers, "--hidden", "16", "--seq", "8", "--vocab", "64",
            "--repeats", "2", "--warmup", "1", "--out", str(out), *extra]  # fmt: skip
    if model:
        args += ["--model", model]
    assert main(args) == 0
    return out


def _check_rows(out: Path, layers: str, model: str) -> None:
    prof = load_profile(out)
    spec = parse_layers(layers)
    assert list(prof.layers) == [t for t, _ in spec]  # one row per layer, in model order
    tm = prof.type_map()
    assert {t: tm[t].family for t, _ in spec} == dict(spec)
    fams = [f for _, f in spec]
    st = ModelSettings(factory=model, hidden=16, seq=8, vocab=64, dtype="float32")
    for i, lt in enumerate(prof.layer_costs()):
        assert lt.forward_ms > 0 and lt.backward_input_ms > 0 and lt.backward_weight_ms > 0
        if lt.family != "embedding":
            assert lt.activation_mib > 0
        # as the executor keeps them (float32): weights, gradients, the optimizer's master
        # copy and AdamW's two moments: 5 x 4 bytes a parameter
        layer = build_layers(fams, st.resolved(fams), {i})[i]
        assert layer is not None
        n = sum(p.numel() for p in layer.parameters())
        assert lt.weight_mib == pytest.approx(5 * 4 * n / MIB, rel=1e-4), lt.name
    assert tm[spec[-1][0]].output_mib == 0 and tm[spec[1][0]].output_mib > 0
    assert "weight_mib = parameters + gradients + master copy and AdamW state" in prof.source


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("model", "layers"),
    [
        (LLAMA, "embedding,block=transformer_block*3,lm_head"),
        (HYBRID, "embedding,m=mamba*2,a=attention,m,lm_head"),
        ("", "embedding,m=mamba*2,attention,mlp,moe,lm_head"),
        ("octopipe_core.executor.models:example_layers", "embedding,mlp*2,lm_head"),
        ("octopipe_core.executor.models:example_factory", "embedding,mlp*2,lm_head"),
    ],
)
def test_profile_model_rows(model: str, layers: str, tmp_path: Path) -> None:
    if model.startswith("octopipe_core.executor.hf"):
        pytest.importorskip("transformers")
    _check_rows(_profile_cli(tmp_path, model, layers), layers, model)


def test_profile_measures_the_users_layers_not_the_stand_ins() -> None:
    pytest.importorskip("transformers")
    layers = parse_layers("embedding,blk=transformer_block,lm_head")
    st = ModelSettings(hidden=16, seq=8, vocab=64, dtype="float32")
    ours = profile_layers(layers, st, repeats=1, warmup=0, model=LLAMA)
    stand = profile_layers(layers, st, repeats=1, warmup=0)
    # a Llama block (GQA attention + SwiGLU) has other weights than the stand-in block
    assert ours["layer_types"]["blk"]["weight_mib"] != stand["layer_types"]["blk"]["weight_mib"]
    assert "llama_tiny" in ours["source"] and "stand-in" in stand["source"]


def test_bfloat16_weight_memory_is_what_the_mixed_precision_executor_keeps() -> None:
    """bf16 weights and gradients, float32 flat gradients, master copy and AdamW moments: the
    executor holds 2 + 4 + 4 + 8 = 18 bytes a parameter (the gradients counted at their larger
    form), not the 8 of AdamW run on the bf16 weights themselves."""
    layers = parse_layers("embedding,mlp,lm_head")
    st = ModelSettings(hidden=32, seq=8, vocab=64, dtype="bfloat16")
    prof = profile_layers(layers, st, repeats=1, warmup=0)
    built = build_layers([f for _, f in layers], st.resolved([f for _, f in layers]))
    for (name, _), layer in zip(layers, built, strict=True):
        assert layer is not None
        n = sum(p.numel() for p in layer.parameters())
        got = prof["layer_types"][name]["weight_mib"]
        assert got == pytest.approx(18 * n / MIB, rel=1e-3), name


def test_profile_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "p.json")
    assert main(["profile", "--model", LLAMA, "--hidden", "16", "--seq", "8", "--out", out]) == 2
    assert "--layers is required" in capsys.readouterr().err
    args = ["profile", "--layers", "embedding,mlp,lm_head", "--hidden", "16", "--seq", "8",
            "--out", out]  # fmt: skip
    assert main([*args, "--model", "nosuch_mod:f"]) == 2
    assert "cannot import" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main([*args, "--device", "cuda"]) == 2
        assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_profile_model_on_cuda(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    layers = "embedding,m=mamba,a=attention,lm_head"
    _check_rows(_profile_cli(tmp_path, HYBRID, layers, "--device", "cuda"), layers, HYBRID)


@pytest.mark.dist
@pytest.mark.timeout(600)
def test_measured_profile_tunes_exports_and_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """profile --model -> tune -> export --model -> run --check (gradients equal the
    single-process reference of the same model)."""
    pytest.importorskip("transformers")
    prof = _profile_cli(tmp_path, HYBRID, "embedding,m=mamba,a=attention,m,a,lm_head")
    plan = tmp_path / "tuned.json"
    assert main(["tune", "--profile", str(prof), "--devices", "2", "--microbatches", "4",
                 "--time-budget-s", "2", "--stop-at-convergence",
                 "--out", str(plan)]) == 0  # fmt: skip
    job = tmp_path / "job"
    assert main(["export", str(plan), "--out", str(job), "--model", HYBRID, "--hidden", "16",
                 "--seq", "8", "--vocab", "64", "--dtype", "float64",
                 "--lr", "1e-2"]) == 0  # fmt: skip
    cfg = json.loads((job / "executor_config.json").read_text())
    assert cfg["model"]["factory"] == HYBRID
    capsys.readouterr()
    assert main(["run", str(job), "--check"]) == 0
    text = capsys.readouterr().out
    assert "check: OK" in text and "max_abs_grad_diff" in text
    # and it trains: 12 AdamW steps on the synthetic (learnable) task lower the loss
    assert main(["run", str(job), "--steps", "12", "--no-resume"]) == 0
    log = [json.loads(ln) for ln in (job / "out" / "train_log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in log if "loss" in r]
    assert len(losses) >= 12 and sum(losses[-3:]) / 3 < losses[0], losses
