"""The model hook (``executor/hooks.py``): per-stage building, the whole-model form, tuple
outputs and one-line errors; a 2-rank gloo run of a per-stage hook matches the reference."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from octopipe_core.errors import OctoPipeError  # noqa: E402
from octopipe_core.executor.data import config_batches  # noqa: E402
from octopipe_core.executor.hooks import build_hook_layers, contiguous_runs, is_per_stage  # noqa: E402
from octopipe_core.executor.models import (  # noqa: E402
    ModelSettings,
    build_layers,
    example_factory,
    example_layers,
    load_factory,
    param_names,
)
from octopipe_core.executor.reference import reference_run  # noqa: E402

FAMS = ["embedding", "attention", "mlp", "mamba", "mlp", "lm_head"]

HOOK_MODULE = """
from torch import nn
CALLS = []

class TupleLayer(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.lin = nn.Linear(h, h)
    def forward(self, x):
        return x + self.lin(x), None  # as HuggingFace decoder layers do

def spy(layers, families, names, num_layers, model_families, hidden, vocab, seed):
    CALLS.append((list(layers), list(families), list(names), num_layers, list(model_families)))
    out = []
    for i, f in zip(layers, families):
        import torch
        torch.manual_seed(seed * 1000 + i)
        if f == "embedding":
            out.append(nn.Embedding(vocab, hidden))
        elif f == "lm_head":
            out.append(nn.Linear(hidden, vocab))
        else:
            out.append(TupleLayer(hidden))
    return out

def too_few(layers, hidden):
    return [nn.Linear(hidden, hidden)] * (len(layers) - 1)

def not_modules(layers):
    return ["x"] * len(layers)

def not_a_list(layers):
    return 3

def needs_more(layers, depth):
    return []

def whole_short(families, hidden):
    return [nn.Linear(hidden, hidden) for _ in families[1:]]

def whole(families, hidden, vocab):
    return [nn.Embedding(vocab, hidden)] + [TupleLayer(hidden) for _ in families[1:-1]] + [
        nn.Linear(hidden, vocab)]
"""


@pytest.fixture
def hookmod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    (tmp_path / "octo_hookmod.py").write_text(textwrap.dedent(HOOK_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("octo_hookmod", None)
    import octo_hookmod  # type: ignore[import-not-found]

    return octo_hookmod


def _st(factory: str, **kw: object) -> ModelSettings:
    return ModelSettings(factory=factory, **kw).resolved(FAMS)  # type: ignore[arg-type]


def test_contiguous_runs_and_form() -> None:
    assert contiguous_runs([4, 1, 2]) == [[1, 2], [4]]
    assert is_per_stage(example_layers) and not is_per_stage(example_factory)


def test_per_stage_hook_builds_only_the_kept_layers(hookmod: object) -> None:
    st = _st("octo_hookmod:spy")
    got = build_layers(FAMS, st, {1, 2, 5}, names=["e", "a", "m", "s", "m", "h"])
    assert [m is None for m in got] == [True, False, False, True, True, False]
    calls = hookmod.CALLS  # type: ignore[attr-defined]
    assert calls == [
        ([1, 2], ["attention", "mlp"], ["a", "m"], 6, FAMS),
        ([5], ["lm_head"], ["h"], 6, FAMS),
    ]


@pytest.mark.parametrize(
    "spec", ["octopipe_core.executor.models:example_layers", "octo_hookmod:spy"]
)
def test_per_stage_build_equals_whole_build(spec: str, hookmod: object) -> None:
    st = _st(spec, dtype="float64")
    whole = param_names(build_layers(FAMS, st))
    for keep in ({0, 1}, {2, 3, 4}, {5}, {0, 5}):
        part = param_names(build_layers(FAMS, st, keep))
        assert part and set(part) <= set(whole)
        assert {int(k.split(".")[0]) for k in part} == keep
        for k, p in part.items():
            assert torch.equal(p, whole[k]), k
    # forward through stage-built layers equals the whole model
    x = torch.randint(0, st.vocab, (2, st.seq))
    full = build_layers(FAMS, st)
    parts = build_layers(FAMS, st, {0, 1, 2}), build_layers(FAMS, st, {3, 4, 5})
    h1, h2 = x, x
    for i in range(len(FAMS)):
        h1 = full[i](h1)  # type: ignore[misc]
        h2 = (parts[0] if i < 3 else parts[1])[i](h2)  # type: ignore[misc]
    assert h1.shape == (2, st.seq, st.vocab) and torch.equal(h1, h2)


def test_whole_model_form_still_works(hookmod: object) -> None:
    st = _st("octo_hookmod:whole")
    got = build_layers(FAMS, st, {2, 3})
    assert [m is not None for m in got] == [False, False, True, True, False, False]
    assert len(load_factory("octo_hookmod:whole", st, FAMS)) == len(FAMS)
    # a tuple-returning layer passes its first output on: the reference runs
    loss, grads = reference_run(FAMS, ModelSettings(factory="octo_hookmod:whole"), 2)
    assert loss > 0 and all(g.abs().sum() > 0 for k, g in grads.items() if ".lin.weight" in k)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("octo_hookmod:too_few", "returned 1 modules for layers 0..1 (2 asked)"),
        ("octo_hookmod:not_modules", "item 0 for layers 0..1 is a str, not an nn.Module"),
        ("octo_hookmod:not_a_list", "returned a int for layers 0..1"),
        ("octo_hookmod:needs_more", "parameter 'depth' has no default"),
        ("octo_hookmod:nosuch", "cannot import"),
        ("octo_hookmod", "expected module:function"),
        ("octo_hookmod:whole_short", "returned 1 modules for the whole model"),
    ],
)
def test_hook_errors_are_one_line(spec: str, message: str, hookmod: object) -> None:
    fams = ["embedding", "mlp"]
    st = ModelSettings(factory=spec)
    with pytest.raises(OctoPipeError) as e:
        build_hook_layers(spec, st, fams, {0, 1})
    assert message in str(e.value) and "\n" not in str(e.value) and "fix:" in str(e.value)


@pytest.mark.dist
@pytest.mark.timeout(180)
def test_per_stage_hook_runs_pipelined_with_exact_grads(hookmod: object) -> None:
    from octopipe_core.executor.export import make_config
    from octopipe_core.executor.harness import run_local
    from octopipe_core.executor.reference import compare_grads
    from octopipe_core.profile import FORMAT, Profile
    from octopipe_core.schedules import build_plan

    lt = {"forward_ms": 1.0, "backward_input_ms": 1.0, "backward_weight_ms": 1.0,
          "activation_mib": 1.0, "weight_mib": 1.0, "output_mib": 0.1}  # fmt: skip
    prof = Profile.from_dict(
        {
            "format": FORMAT,
            "name": "hook",
            "tokens_per_microbatch": 16,
            "layer_types": {f: {**lt, "family": f} for f in dict.fromkeys(FAMS)},
            "layers": FAMS,
        }
    )
    cases = []
    for spec in ("octo_hookmod:spy", "octopipe_core.executor.models:example_layers"):
        for sched in ("zbv", "1f1b"):
            cases.append(
                (spec, make_config(build_plan(prof, sched, 2, 3), prof, {"factory": spec}))
            )
    results = run_local([c for _, c in cases], 2)
    for (spec, cfg), res in zip(cases, results, strict=True):
        st = ModelSettings.from_dict(cfg["model"])
        ref_loss, ref_grads = reference_run(FAMS, st, 3, config_batches(cfg))
        diff, missing = compare_grads(res["grads"], ref_grads)
        assert not missing and diff < 1e-10, (spec, diff, missing)
        assert abs(res["losses"][0] - ref_loss) < 1e-12
