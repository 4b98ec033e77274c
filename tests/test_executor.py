"""The pipelined runtime matches a single-process reference (float64), on 2, 3 and 4 gloo
ranks: every peer schedule, random irregular plans, the tuner's plans (when
``octopipe_core.tuner`` exists), a hand-made irregular plan (the stand-in for a tuned plan
otherwise) and a user model factory.
Each world size is one spawned process group running all its plans."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from octopipe_core.executor.export import make_config  # noqa: E402
from octopipe_core.executor.harness import run_local  # noqa: E402
from octopipe_core.executor.models import ModelSettings  # noqa: E402
from octopipe_core.executor.plans import irregular_plan, random_plan  # noqa: E402
from octopipe_core.executor.reference import check_against_reference  # noqa: E402
from octopipe_core.plan import Plan, validate_plan  # noqa: E402
from octopipe_core.profile import FORMAT, Profile  # noqa: E402
from octopipe_core.schedules import build_plan  # noqa: E402

PEERS = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zbv", "dualpipev")
FAMILY_LAYERS = [
    "embedding",
    "mamba",
    "attention",
    "transformer_block",
    "moe",
    "mlp",
    "mamba",
    "mlp",
    "attention",
    "lm_head",
]
HAS_TUNER = importlib.util.find_spec("octopipe_core.tuner") is not None


def all_families_profile() -> Profile:
    lt = {
        "forward_ms": 1.0,
        "backward_input_ms": 1.0,
        "backward_weight_ms": 1.0,
        "activation_mib": 1.0,
        "weight_mib": 1.0,
        "output_mib": 0.1,
    }
    fams = dict.fromkeys(FAMILY_LAYERS)
    return Profile.from_dict(
        {
            "format": FORMAT,
            "name": "all-families",
            "tokens_per_microbatch": 16,
            "layer_types": {f: {**lt, "family": f} for f in fams},
            "layers": FAMILY_LAYERS,
        }
    )


def tuned_plan(prof: Profile, devices: int, m: int) -> Plan | None:
    """The tuner's plan (``octopipe_core.tuner``, another engineer's module) if it exists."""
    if not HAS_TUNER:
        return None
    from octopipe_core.tuner import tune

    res: Any = tune(
        prof, devices=devices, microbatches=m, time_budget_s=2, stop_at_convergence=True
    )
    return res if isinstance(res, Plan) else res.plan


def cases(world: int) -> list[tuple[str, Plan, dict[str, Any]]]:
    prof = all_families_profile()
    out: list[tuple[str, Plan, dict[str, Any]]] = []
    for s in PEERS:
        m = 2 * world if s == "dualpipev" else world + 1
        out.append((s, build_plan(prof, s, world, m), {}))
    for seed in range(3 if world == 2 else 2):
        out.append((f"random{seed}", random_plan(prof.num_layers, world, 3, seed + 10 * world), {}))
    tuned = tuned_plan(prof, world, 4) if world < 4 else None
    if tuned is not None:
        out.append(("tuned", tuned, {}))
    if world == 2:
        # hand-made irregular plan: the stand-in for a tuned plan when there is no tuner
        out.append(("hand-irregular", irregular_plan(prof.num_layers, 4), {}))
        out.append(
            (
                "factory",
                build_plan(prof, "zb-h1", 2, 3),
                {"factory": "octopipe_core.executor.models:example_factory"},
            )
        )
        out.append(("hidden-input-mse", random_plan(6, 2, 3, 7), {}))  # no embedding / head
    return out


def _profile_for(plan: Plan) -> Profile:
    prof = all_families_profile()
    if plan.partition[-1][1] == prof.num_layers:
        return prof
    d = prof.to_dict()
    d["layers"] = ["mamba", "mlp", "attention", "moe", "mlp", "transformer_block"]
    d["name"] = "no-ends"
    return Profile.from_dict(d)


def _run_and_compare(cs: list[tuple[str, Plan, dict[str, Any]]], world: int) -> None:
    cfgs = []
    for _, plan, model in cs:
        prof = _profile_for(plan)
        validate_plan(plan, prof.num_layers)
        cfgs.append(make_config(plan, prof, model))
    results = run_local(cfgs, world)
    failures = []
    for (name, plan, _), cfg, res in zip(cs, cfgs, results, strict=True):
        fams = [lt.family for lt in _profile_for(plan).layer_costs()]
        ref_loss, loss_diff, diff, missing = check_against_reference(
            cfg, fams, res["losses"][0], res["grads"]
        )
        if missing or diff > 1e-10 or loss_diff > 1e-12:
            failures.append(
                f"{name}: loss {res['losses'][0]} vs {ref_loss}, grad diff {diff}, "
                f"missing {missing[:3]}"
            )
    assert not failures, failures


@pytest.mark.dist
@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_pipelined_matches_reference(world: int) -> None:
    _run_and_compare(cases(world), world)


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_batched_p2p_posting_matches_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """The NCCL posting mode (runs of comm ops as one ``batch_isend_irecv``), here on gloo."""
    monkeypatch.setenv("OCTOPIPE_BATCH_P2P", "1")
    prof = all_families_profile()
    cs = [(s, build_plan(prof, s, 2, 4), {}) for s in ("1f1b", "zbv", "dualpipev")]
    cs.append(("random", random_plan(prof.num_layers, 2, 3, 99), {}))
    _run_and_compare(cs, 2)


def test_split_backward_equals_fused() -> None:
    from octopipe_core.executor.models import (
        apply_weight_grads,
        build_layers,
        defer_weight_grads,
        loss_fn,
        make_batch,
        param_names,
    )

    st = ModelSettings().resolved(FAMILY_LAYERS)
    grads = []
    for split in (False, True):
        layers = build_layers(FAMILY_LAYERS, st)
        x, y = make_batch(st, 1)
        h = x[0]
        for layer in layers:
            h = layer(h)
        loss = loss_fn(h, y[0], st, 1)
        store: list[Any] = []
        if split:
            with defer_weight_grads(store):
                loss.backward()
            deferred = {id(item[3]) for item in store}
            assert all(p.grad is None for p in param_names(layers).values() if id(p) in deferred)
            apply_weight_grads(store)
        else:
            loss.backward()
        grads.append({k: p.grad.clone() for k, p in param_names(layers).items()})
    assert grads[0].keys() == grads[1].keys()
    for k in grads[0]:
        torch.testing.assert_close(grads[0][k], grads[1][k], rtol=0, atol=1e-12)
