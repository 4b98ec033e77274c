"""Tests of the analytic cost model against the reference numbers (octopipe-paper.md §5-6)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from octopipe_core import costmodel
from octopipe_core.costmodel import (
    PRESETS,
    GPUSpec,
    ModelConfig,
    derive_profile,
    forward_flops,
    layer_params,
    main,
    model_params,
)
from octopipe_core.profile import Profile, profile_to_csv

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_profiles"
N8, N56, JAMBA = PRESETS["nemotron-h-8b"], PRESETS["nemotron-h-56b"], PRESETS["jamba-v0.1"]


def _at_seq(cfg: ModelConfig, seq: int) -> ModelConfig:
    return dataclasses.replace(cfg, seq_len=seq)


@pytest.mark.parametrize(
    ("cfg", "layer_type", "millions"),
    [
        (N8, "mamba2", 109.6),
        (N8, "attention", 41.9),
        (N8, "mlp", 176.2),
        (N56, "mamba2", 438.4),
        (N56, "attention", 151.0),
        (N56, "mlp", 536.9),
        (JAMBA, "mamba1", 105.3),
        (JAMBA, "mlp", 176.2),
        (JAMBA, "moe", 2818.6),  # 16 experts, counted before expert parallelism
    ],
)
def test_layer_params_match_reference(cfg: ModelConfig, layer_type: str, millions: float) -> None:
    assert layer_params(cfg, layer_type) / 1e6 == pytest.approx(millions, rel=0.02)


@pytest.mark.parametrize(
    ("name", "billions"),
    [("nemotron-h-8b", 8.1), ("nemotron-h-56b", 56.0), ("jamba-v0.1", 52.0), ("llama-3-8b", 8.03)],
)
def test_total_params(name: str, billions: float) -> None:
    assert model_params(PRESETS[name]) / 1e9 == pytest.approx(billions, rel=0.03)


@pytest.mark.parametrize(
    ("cfg", "seq", "attn", "mamba", "mlp_tf"),
    [
        (N8, 4096, 0.33, 0.64, 1.44),
        (N8, 8192, 0.43, 0.64, 2.89),
        (N56, 4096, 0.34, 0.84, 4.40),
        (N56, 8192, 0.41, 0.84, 8.80),
    ],
)
def test_nemotron_flop_ratios(
    cfg: ModelConfig, seq: int, attn: float, mamba: float, mlp_tf: float
) -> None:
    c = _at_seq(cfg, seq)
    mlp = forward_flops(c, "mlp")
    assert mlp / 1e12 == pytest.approx(mlp_tf, rel=0.02)
    assert forward_flops(c, "attention") / mlp == pytest.approx(attn, rel=0.05)
    assert forward_flops(c, "mamba2") / mlp == pytest.approx(mamba, rel=0.05)


@pytest.mark.parametrize(("seq", "attn_mlp", "mamba_moe"), [(4096, 0.83, 1.62), (8192, 0.89, 1.62)])
def test_jamba_flop_ratios(seq: int, attn_mlp: float, mamba_moe: float) -> None:
    c = _at_seq(JAMBA, seq)
    base = forward_flops(c, "mamba_mlp")
    assert base / 1e12 == pytest.approx(2.31 * seq / 4096, rel=0.03)
    assert forward_flops(c, "attn_mlp") / base == pytest.approx(attn_mlp, rel=0.05)
    assert forward_flops(c, "mamba_moe") / base == pytest.approx(mamba_moe, rel=0.05)


def test_lm_head_flops_are_the_logits_gemm() -> None:
    assert forward_flops(N8, "lm_head") == pytest.approx(2 * 8192 * 4096 * 131072)


@pytest.mark.parametrize(
    ("name", "counts"),
    [
        ("nemotron-h-8b", {"mamba2": 24, "attention": 4, "mlp": 24}),
        ("nemotron-h-56b", {"mamba2": 54, "attention": 10, "mlp": 54}),
        ("jamba-v0.1", {"attn_mlp": 4, "mamba_mlp": 12, "mamba_moe": 16}),
        ("llama-3-8b", {"transformer_block": 32}),
    ],
)
def test_layer_counts(name: str, counts: dict[str, int]) -> None:
    layers = list(PRESETS[name].layers)
    assert layers[0] == "embedding" and layers[-1] == "lm_head"
    assert len(layers) == sum(counts.values()) + 2
    assert {t: layers.count(t) for t in counts} == counts


def test_nemotron_attention_positions() -> None:
    # Reference: 0-based attention layer indices {7, 18, 29, 40}; +1 for the embedding layer.
    assert [i - 1 for i, t in enumerate(N8.layers) if t == "attention"] == [7, 18, 29, 40]
    assert [i - 1 for i, t in enumerate(N56.layers) if t == "attention"] == list(range(7, 107, 11))


def test_jamba_block_layout() -> None:
    block = ["mamba_mlp", "mamba_moe", "mamba_mlp", "mamba_moe"]
    block += ["attn_mlp", "mamba_moe", "mamba_mlp", "mamba_moe"]
    assert list(JAMBA.layers[1:-1]) == block * 4


def test_gpt_layer_reproduces_megatron_activation_formulas() -> None:
    # MHA, ffn = 4h, non-gated: F keeps 34·s·b·h (+ 5·a·s²·b without flash), W needs 32·s·b·h.
    s, h, a = 2048, 1024, 16
    cfg = ModelConfig("gpt", ["transformer_block"], h, 4 * h, a, a, 1000, s)
    lt = derive_profile(cfg)["layer_types"]["transformer_block"]
    assert lt["activation_mib"] * 2**20 == pytest.approx(34 * s * h, rel=1e-6)
    assert lt["w_stash_mib"] * 2**20 == pytest.approx(32 * s * h, rel=1e-6)
    full = dataclasses.replace(cfg, activation_formula="full")
    act = derive_profile(full)["layer_types"]["transformer_block"]["activation_mib"]
    assert act * 2**20 == pytest.approx(34 * s * h + 5 * a * s * s, rel=1e-6)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_profile_invariants(name: str) -> None:
    cfg = PRESETS[name]
    p = derive_profile(cfg)
    assert p["format"] == "octopipe.profile/v1"
    assert p["tokens_per_microbatch"] == cfg.seq_len * cfg.micro_batch_size
    dev = {"name": "H800", "memory_gib": 80, "p2p_gbps": 50, "p2p_latency_us": 10}
    if PRESETS[name].tensor_parallel > 1:  # a pipeline device is a tensor-parallel group
        dev["gpus"] = PRESETS[name].tensor_parallel
    assert p["device"] == dev
    assert set(p["layer_types"]) == set(p["layers"])
    out = cfg.tokens_per_microbatch * cfg.hidden * 2 / cfg.tensor_parallel / 2**20
    for t, lt in p["layer_types"].items():
        assert lt["w_stash_mib"] <= lt["activation_mib"]
        assert min(v for k, v in lt.items() if k != "family") >= 0
        assert lt["forward_ms"] > 0
        assert lt["output_mib"] == (0.0 if t == "lm_head" else pytest.approx(out))
        if lt["family"] in ("attention", "transformer_block"):  # s² work only in B
            assert lt["backward_input_ms"] > lt["forward_ms"] > lt["backward_weight_ms"]
    assert "derived by octopipe_core.costmodel" in p["source"]


def test_tensor_and_expert_parallel_divide_costs() -> None:
    one = derive_profile(dataclasses.replace(N56, tensor_parallel=1))["layer_types"]["mlp"]
    eight = derive_profile(N56)["layer_types"]["mlp"]
    for key in ("forward_ms", "activation_mib", "weight_mib", "output_mib"):
        assert one[key] / eight[key] == pytest.approx(8, rel=1e-3)
    ep1 = derive_profile(dataclasses.replace(JAMBA, expert_parallel=1))["layer_types"]
    ep8 = derive_profile(JAMBA)["layer_types"]
    assert ep1["mamba_moe"]["forward_ms"] == ep8["mamba_moe"]["forward_ms"]
    experts_mib = 16 * 3 * 4096 * 14336 * 16 / 2**20
    diff = ep1["mamba_moe"]["weight_mib"] - ep8["mamba_moe"]["weight_mib"]
    assert diff == pytest.approx(experts_mib * 7 / 8, rel=1e-4)


def test_jamba_is_the_memory_heavy_model() -> None:
    def static_gib(name: str) -> float:
        p = derive_profile(PRESETS[name])
        return sum(p["layer_types"][t]["weight_mib"] for t in p["layers"]) / 1024

    assert static_gib("jamba-v0.1") > 80 and static_gib("jamba-v0.1") == max(
        static_gib(n) for n in PRESETS
    )


def test_efficiency_changes_times() -> None:
    slow = GPUSpec(efficiency={**costmodel.DEFAULT_EFFICIENCY, "mlp": 0.275})
    fast_ms = derive_profile(N8)["layer_types"]["mlp"]["forward_ms"]
    assert derive_profile(N8, slow)["layer_types"]["mlp"]["forward_ms"] == pytest.approx(
        2 * fast_ms, rel=1e-3
    )


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_sample_files_are_reproducible(name: str) -> None:
    profile = derive_profile(PRESETS[name])
    if name in costmodel.CSV_SAMPLES:
        csv_text = profile_to_csv(Profile.from_dict(profile))
        assert (SAMPLES / f"{name}.csv").read_text(encoding="utf-8") == csv_text
    else:
        assert json.loads((SAMPLES / f"{name}.json").read_text(encoding="utf-8")) == profile


def test_samples_load_with_the_profile_loader() -> None:
    profile_mod = pytest.importorskip("octopipe_core.profile")
    for name in PRESETS:
        ext = ".csv" if name in costmodel.CSV_SAMPLES else ".json"
        p = profile_mod.load_profile(SAMPLES / f"{name}{ext}")
        assert list(p.layers) == list(PRESETS[name].layers)


def test_all_writes_every_sample(tmp_path: Path) -> None:
    assert main(["--all", "--out-dir", str(tmp_path)]) == 0
    for f in tmp_path.iterdir():
        assert f.read_bytes() == (SAMPLES / f.name).read_bytes()
    assert len(list(tmp_path.iterdir())) == len(PRESETS)


def _cfg_file(tmp_path: Path, **changes: object) -> Path:
    data = {"name": "m", "layers": ["embedding", "mamba2", "lm_head"], "hidden": 512}
    data |= {"ffn_hidden": 2048, "num_heads": 8, "num_kv_heads": 2, "vocab": 1000, "seq_len": 256}
    data |= changes
    path = tmp_path / "my_model.json"
    path.write_text(json.dumps({k: v for k, v in data.items() if v is not None}))
    return path


def test_config_file_round_trip(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    assert main(["--config", str(_cfg_file(tmp_path)), "--out", str(out)]) == 0
    p = json.loads(out.read_text())
    assert p["layers"] == ["embedding", "mamba2", "lm_head"] and p["tokens_per_microbatch"] == 256


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"hiden": 512}, "hiden"),
        ({"vocab": None}, "vocab"),
        ({"seq_len": "8k"}, "seq_len"),
        ({"num_heads": 0}, "num_heads"),
        ({"layers": ["embedding", "mamba3"]}, "layers"),
        ({"layers": ["moe"]}, "moe_top_k"),
    ],
)
def test_bad_config_gives_one_line_error(tmp_path: Path, changes: dict, field: str) -> None:
    path = _cfg_file(tmp_path, **changes)
    with pytest.raises(SystemExit) as exc:
        main(["--config", str(path)])
    msg = str(exc.value.code)
    assert "\n" not in msg and str(path) in msg and f"'{field}'" in msg and "fix:" in msg


def test_bad_config_cli_has_no_traceback(tmp_path: Path) -> None:
    path = _cfg_file(tmp_path, hiden=1)
    cmd = [sys.executable, "-m", "octopipe_core.costmodel", "--config", str(path)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "'hiden'" in r.stderr
