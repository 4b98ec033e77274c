"""PP x DP training on gloo (4 processes: PP2 x DP2, float64 stand-in model): reduced
gradients equal the single-process reference on the union of both replicas' batches, and the
parameters after optimizer steps (AdamW, clipping, LR schedule; plain and ZeRO-1) equal a
single-process AdamW run. One spawned process group runs every case."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from octopipe_core.dp_sync import last_weight_actions  # noqa: E402
from octopipe_core.executor.data import config_batches  # noqa: E402
from octopipe_core.executor.export import make_config  # noqa: E402
from octopipe_core.executor.harness import run_local  # noqa: E402
from octopipe_core.executor.mesh import JobLayout  # noqa: E402
from octopipe_core.executor.models import ModelSettings, build_layers, param_names  # noqa: E402
from octopipe_core.executor.plans import irregular_plan  # noqa: E402
from octopipe_core.executor.reference import (  # noqa: E402
    compare_grads,
    reference_run,
    reference_train,
)
from octopipe_core.executor.settings import OptimSettings  # noqa: E402
from octopipe_core.profile import FORMAT, Profile  # noqa: E402
from octopipe_core.schedules import build_plan  # noqa: E402

LAYERS = ["embedding", "mamba", "attention", "moe", "mlp", "transformer_block", "mlp", "lm_head"]
STEPS = 2
TRAIN = {"lr": 0.05, "min_lr": 0.01, "warmup_steps": 1, "weight_decay": 0.1, "clip": 0.5}


def profile() -> Profile:
    lt = {"forward_ms": 1.0, "backward_input_ms": 1.0, "backward_weight_ms": 1.0,
          "activation_mib": 1.0, "weight_mib": 1.0, "output_mib": 0.1}  # fmt: skip
    return Profile.from_dict(
        {
            "format": FORMAT,
            "name": "dp-test",
            "tokens_per_microbatch": 16,
            "layer_types": {f: {**lt, "family": f} for f in dict.fromkeys(LAYERS)},
            "layers": LAYERS,
        }
    )


def cases() -> list[tuple[str, dict[str, Any]]]:
    prof = profile()
    out = []
    for name, plan, layout in [
        ("1f1b", build_plan(prof, "1f1b", 2, 3), {"dp": 2}),
        ("zbv", build_plan(prof, "zbv", 2, 4), {"dp": 2}),
        ("zbv-zero1", build_plan(prof, "zbv", 2, 4), {"dp": 2, "zero1": True}),
        ("hand-zero1-pp-dp", irregular_plan(prof.num_layers, 3), {"dp": 2, "zero1": True,
                                                                   "order": "tp-pp-dp"}),
    ]:  # fmt: skip
        cfg = make_config(plan, prof, {"microbatch_size": 2}, layout=layout, train=TRAIN)
        out.append((name, cfg))
    return out


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_pp2_dp2_gradients_and_steps_match_single_process_reference() -> None:
    cs = cases()
    results = run_local([c for _, c in cs], 4, steps=STEPS, record=("grads", "params"))
    prof = profile()
    fams = [lt.family for lt in prof.layer_costs()]
    for (name, cfg), res in zip(cs, results, strict=True):
        st = ModelSettings.from_dict(cfg["model"])
        m = int(cfg["plan"]["num_microbatches"])
        # reduced gradients of step 0 == one process on the union of both replicas' batches
        batches = config_batches(cfg, 0)
        assert len(batches) == 2 and not torch.equal(batches[0][0], batches[1][0])
        ref_loss, ref_grads = reference_run(fams, st, m, batches)
        diff, missing = compare_grads(res["grads"], ref_grads)
        assert not missing and diff < 1e-10, (name, diff, missing)
        assert abs(res["losses"][0] - ref_loss) < 1e-12, (name, res["losses"][0], ref_loss)
        # parameters after the optimizer steps == single-process AdamW with clipping
        optim = OptimSettings.from_dict({**cfg["train"], "decay_steps": STEPS})
        steps = [config_batches(cfg, i) for i in range(STEPS)]
        ref_losses, ref_params = reference_train(fams, st, m, steps, optim)
        assert res["losses"] == pytest.approx(ref_losses, abs=1e-12), name
        reps = res["params_by_replica"]
        assert len(reps) == 2
        for r, params in enumerate(reps):
            pdiff, pmissing = compare_grads(params, ref_params)
            assert not pmissing and pdiff < 1e-10, (name, r, pdiff, pmissing)
        init = param_names(build_layers(fams, st.resolved(fams)))
        assert max(float((ref_params[k] - p.detach()).abs().max()) for k, p in init.items()) > 1e-3


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_dp_reduction_starts_after_the_stage_last_w_and_overlaps() -> None:
    """Each stage's reduction is launched right after the plan's last W of the stage; on zbv
    the inner stage's reduction starts while its device still computes the outer stage."""
    prof = profile()
    plan = build_plan(prof, "zbv", 2, 4)
    cfg = make_config(plan, prof, layout={"dp": 2})
    (res,) = run_local([cfg], 4, steps=1, record=())
    lay = JobLayout(pp=2, dp=2)
    overlapped = 0
    for s, (d, i) in last_weight_actions(plan).items():
        last_w = str(plan.schedule[d][i])
        for r in range(2):
            rank = lay.rank(r, d)
            ops = [rec for rec in res["records"] if rec[0] == rank]
            w_end = next(rec[4] for rec in ops if rec[2] == last_w)
            dp = next(t for t in res["tail"] if t[0] == rank and t[2] == f"{s}DP")
            assert w_end <= dp[3] < w_end + 0.05, (s, r)
            compute_end = max(rec[4] for rec in ops if "SEND" not in rec[2])
            overlapped += dp[3] < compute_end
    assert overlapped >= 2  # stage 3 (device 0) and stage 2 (device 1) finish first
