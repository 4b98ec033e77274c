"""The HuggingFace adapter (``executor/hf.py``): ``llama_tiny`` and ``hybrid_tiny`` (Bamba)
equal transformers' own causal-LM models, build per stage exactly what the whole build does,
and run pipelined on 2 gloo ranks with the single-process reference's gradients."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from octopipe_core.errors import OctoPipeError  # noqa: E402
from octopipe_core.executor import hf  # noqa: E402
from octopipe_core.executor.data import config_batches  # noqa: E402
from octopipe_core.executor.models import ModelSettings, build_layers, param_names  # noqa: E402
from octopipe_core.executor.reference import compare_grads, reference_run  # noqa: E402
from octopipe_core.profile import FORMAT, Profile  # noqa: E402

LLAMA = "octopipe_core.executor.hf:llama_tiny"
HYBRID = "octopipe_core.executor.hf:hybrid_tiny"
LLAMA_FAMS = ["embedding", "transformer_block", "transformer_block", "transformer_block", "lm_head"]
HYBRID_FAMS = ["embedding", "mamba", "attention", "mamba", "mamba", "attention", "lm_head"]


def _settings(spec: str, fams: list[str], **kw: Any) -> ModelSettings:
    return ModelSettings(factory=spec, hidden=16, vocab=64, seq=8, **kw).resolved(fams)


def _forward(layers: list[Any], x: torch.Tensor) -> torch.Tensor:
    h = x
    for m in layers:
        h = m(h)
    return h


def _hf_model(spec: str, fams: list[str], layers: list[Any], impl: str) -> Any:
    """transformers' own CausalLM with our layers' weights."""
    import transformers

    if spec == LLAMA:
        cfg = hf.llama_tiny_config(16, 64, 8, len(fams) - 2, attn_implementation=impl)
        model, norm = transformers.LlamaForCausalLM(cfg), "model.norm.weight"
    else:
        cfg = hf.hybrid_tiny_config(16, 64, 8, fams[1:-1], attn_implementation=impl)
        model, norm = transformers.BambaForCausalLM(cfg), "model.final_layernorm.weight"
    sd = {"model.embed_tokens.weight": layers[0].embed_tokens.weight}
    for k, m in enumerate(layers[1:-1]):
        sd.update({f"model.layers.{k}.{n}": p for n, p in m.layer.named_parameters()})
    sd[norm], sd["lm_head.weight"] = layers[-1].norm.weight, layers[-1].lm_head.weight
    res = model.double().load_state_dict({k: v.detach() for k, v in sd.items()}, strict=False)
    assert not res.missing_keys and not res.unexpected_keys
    return model


@pytest.mark.parametrize(
    ("spec", "fams", "impl"),
    [(LLAMA, LLAMA_FAMS, "sdpa"), (LLAMA, LLAMA_FAMS, "eager"), (HYBRID, HYBRID_FAMS, "sdpa")],
)
def test_adapter_equals_transformers_model(spec: str, fams: list[str], impl: str) -> None:
    """Rebuilt rotary positions and causal masks give transformers' own logits."""
    st = _settings(spec, fams)
    layers = build_hook(spec, fams, st, impl)
    x = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = _forward(layers, x)
    with torch.no_grad():
        ref = _hf_model(spec, fams, layers, impl)(x).logits
    assert ours.shape == (2, 8, 64) and ours.abs().max() > 1e-3
    assert float((ours - ref).abs().max()) < 1e-12
    # causality: changing the last token changes only the last position's logits
    x2 = x.clone()
    x2[:, -1] = (x2[:, -1] + 1) % 64
    with torch.no_grad():
        ours2 = _forward(layers, x2)
    assert torch.equal(ours2[:, :-1], ours[:, :-1]) and not torch.equal(ours2[:, -1], ours[:, -1])


def build_hook(spec: str, fams: list[str], st: ModelSettings, impl: str = "sdpa") -> list[Any]:
    if impl == "sdpa":
        layers = build_layers(fams, st)
    else:
        fn = hf.llama_tiny if spec == LLAMA else hf.hybrid_tiny
        from octopipe_core.executor.hooks import prepare_layer

        mods = fn(list(range(len(fams))), fams, 16, 64, 8, st.seed, attn_implementation=impl)
        layers = [prepare_layer(m, st.torch_dtype()) for m in mods]
    return layers


@pytest.mark.parametrize(("spec", "fams"), [(LLAMA, LLAMA_FAMS), (HYBRID, HYBRID_FAMS)])
def test_per_stage_build_equals_whole_build(spec: str, fams: list[str]) -> None:
    st = _settings(spec, fams)
    whole = build_layers(fams, st)
    wp = param_names(whole)
    n = len(fams)
    splits = [(range(0, 2), range(2, n)), (range(0, n - 2), range(n - 2, n))]
    x = torch.randint(0, 64, (2, 8))
    for split in splits:
        parts = [build_layers(fams, st, set(r)) for r in split]
        for part, r in zip(parts, split, strict=True):
            assert [i for i, m in enumerate(part) if m is not None] == list(r)
            pp = param_names(part)
            assert pp and all(torch.equal(p, wp[k]) for k, p in pp.items())
        h = x
        for part, r in zip(parts, split, strict=True):
            h = _forward([part[i] for i in r], h)
        assert torch.equal(h, _forward(whole, x))
    assert len(wp) == sum(len(param_names(build_layers(fams, st, {i}))) for i in range(n))


def test_hybrid_layers_follow_the_profile_families() -> None:
    st = _settings(HYBRID, HYBRID_FAMS)
    layers = build_layers(HYBRID_FAMS, st, {1, 2})
    assert layers[1].layer.block_type == "linear_attention"  # type: ignore[union-attr]
    assert layers[2].layer.block_type == "full_attention"  # type: ignore[union-attr]
    assert layers[1].rotary is None and layers[2].rotary is not None  # type: ignore[union-attr]


def test_bad_sizes_are_one_line_errors() -> None:
    st = ModelSettings(factory=LLAMA, hidden=10, vocab=64, seq=8)
    with pytest.raises(OctoPipeError, match=r"hidden 10 with 4 heads .* fix: e\.g\. --hidden 64"):
        build_layers(LLAMA_FAMS, st, {1})
    with pytest.raises(OctoPipeError, match="not a multiple of the Mamba head size 16"):
        hf.hybrid_tiny_config(20, 64, 8, ["mamba"], heads=2, kv_heads=1, mamba_head_dim=16)


def _profile(fams: list[str]) -> Profile:
    lt = {"forward_ms": 1.0, "backward_input_ms": 1.0, "backward_weight_ms": 1.0,
          "activation_mib": 1.0, "weight_mib": 1.0, "output_mib": 0.1}  # fmt: skip
    return Profile.from_dict(
        {
            "format": FORMAT,
            "name": "hf",
            "tokens_per_microbatch": 16,
            "layer_types": {f: {**lt, "family": f} for f in dict.fromkeys(fams)},
            "layers": fams,
        }
    )


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_two_stage_gloo_matches_reference() -> None:
    """llama_tiny and hybrid_tiny on 2 gloo ranks: each rank builds its own layers only, and
    loss and gradients equal the single-process reference (float64)."""
    from octopipe_core.executor.export import make_config
    from octopipe_core.executor.harness import run_local
    from octopipe_core.executor.plans import irregular_plan
    from octopipe_core.schedules import build_plan

    cases = []
    for spec, fams in ((LLAMA, LLAMA_FAMS), (HYBRID, HYBRID_FAMS)):
        prof = _profile(fams)
        model = {"factory": spec, "hidden": 16, "vocab": 64, "seq": 8}
        plans = [build_plan(prof, "1f1b", 2, 3), build_plan(prof, "zbv", 2, 4)]
        if spec == HYBRID:
            plans.append(irregular_plan(len(fams), 3))
        for plan in plans:
            cases.append((spec, fams, plan, make_config(plan, prof, model)))
    results = run_local([c[3] for c in cases], 2, timeout_s=120)
    for (spec, fams, plan, cfg), res in zip(cases, results, strict=True):
        st = ModelSettings.from_dict(cfg["model"])
        ref_loss, ref_grads = reference_run(fams, st, plan.num_microbatches, config_batches(cfg))
        diff, missing = compare_grads(res["grads"], ref_grads)
        assert not missing, (spec, missing[:3])
        assert diff < 1e-10, (spec, plan.name, diff)
        assert abs(res["losses"][0] - ref_loss) < 1e-12
        assert any("mamba" in k or "self_attn" in k for k in res["grads"])
        assert max(float(g.abs().max()) for g in ref_grads.values()) > 1e-4
