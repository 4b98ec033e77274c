"""What of a plan torchtitan and Megatron-LM can run, and their configuration fragments.

* **torchtitan** runs the exported ``schedule.csv`` (``parallelism.pipeline_parallel_schedule_csv``,
  torch's ``_PipelineScheduleRuntime``), but it builds each rank's stages from the schedule
  *name*: loop placement (stage ``s`` on rank ``s % pp``) for every multi-stage schedule, V
  placement (2 stages per rank, rank ``r`` holds ``r`` and ``2 pp - 1 - r``) only for
  ``ZBVZeroBubble``; and the number of stages must be a multiple of pp. The fragment maps each
  stage to torchtitan's module names of its LLMs (``tok_embeddings``, ``layers.<i>``, ``norm`` +
  ``lm_head``) in ``module_fqns_per_model_part``.
* **Megatron-LM** takes only a partition: ``--pipeline-model-parallel-layout`` (``E`` embedding,
  ``t`` decoder layer, ``L`` loss; stage ``i`` on rank ``i % pp``, VPP = stages / pp) or, for
  models with separate Mamba / attention / MLP / MoE layers, ``|`` stage separators in
  ``--hybrid-layer-pattern`` (``M * - E``); it runs its own 1F1B / interleaved order, never the
  plan's per-device order.

>>> from octopipe_core.profile import load_sample
>>> from octopipe_core.schedules import build_plan
>>> prof = load_sample("llama-3-8b")
>>> tt = torchtitan_fragment(build_plan(prof, "interleaved", 2, 4), prof)
>>> tt.ok, tt.schedule, tt.fqns[0][:2]
(True, 'Interleaved1F1B', ['tok_embeddings', 'layers.0'])
>>> torchtitan_fragment(build_plan(prof, "1f1b", 2, 4, partition="balanced"), prof).ok
True
"""

from __future__ import annotations

from dataclasses import dataclass, field

from octopipe_core.plan import Plan
from octopipe_core.profile import Profile

HYBRID_SYMBOL = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E", "transformer_block": "*-"}


@dataclass
class Fragment:
    """A framework's configuration for a plan, or why the plan is not expressible there."""

    ok: bool
    text: str = ""
    problem: str = ""
    schedule: str = ""
    fqns: list[list[str]] = field(default_factory=list)


def placement_style(plan: Plan) -> str:
    """``"loop"``, ``"v"`` or ``""`` (neither) for a plan's stage-to-device placement."""
    pp, n = plan.num_devices, plan.num_stages
    if n % pp == 0 and all(d == s % pp for s, d in enumerate(plan.placement)):
        return "loop"
    v = [s if s < pp else 2 * pp - 1 - s for s in range(n)]
    if n == 2 * pp and list(plan.placement) == v:
        return "v"
    return ""


def layer_fqns(profile: Profile) -> list[list[str]]:
    """torchtitan module names of each profile layer (its LLMs' naming)."""
    out: list[list[str]] = []
    k = 0
    for lt in profile.layer_costs():
        if lt.family == "embedding":
            out.append(["tok_embeddings"])
        elif lt.family == "lm_head":
            out.append(["norm", "lm_head"])
        else:
            out.append([f"layers.{k}"])
            k += 1
    return out


def torchtitan_fragment(plan: Plan, profile: Profile, csv_name: str = "schedule.csv") -> Fragment:
    """torchtitan's ``[parallelism]`` settings for ``plan`` (see the module docstring)."""
    style = placement_style(plan)
    pp, n = plan.num_devices, plan.num_stages
    if not style:
        counts = [plan.placement.count(d) for d in range(pp)]
        return Fragment(
            False,
            problem=f"placement {list(plan.placement)} ({counts} stages per rank) is neither loop "
            f"(stage s on rank s % {pp}, equal stages per rank) nor V (2 stages per rank, rank r "
            f"holds r and {2 * pp - 1}-r); torchtitan builds stages only those ways",
        )
    schedule = "ZBVZeroBubble" if style == "v" else "Interleaved1F1B" if n > pp else "1F1B"
    per_layer = layer_fqns(profile)
    fqns = [[f for i in range(*r) for f in per_layer[i]] for r in plan.partition]
    rows = "\n".join(f"  {f!r}," for f in fqns).replace("'", '"')
    text = (
        "# torchtitan: run OctoPipe's plan through torch's _PipelineScheduleRuntime.\n"
        f"# {plan.name or 'plan'}: {n} stages on {pp} ranks, {style} placement; module names\n"
        "# follow torchtitan's LLMs (tok_embeddings, layers.<i>, norm, lm_head): rename them\n"
        "# for another model. The schedule name only sets the stage placement; the CSV sets\n"
        "# the order.\n"
        "[parallelism]\n"
        f"pipeline_parallel_degree = {pp}\n"
        f'pipeline_parallel_schedule = "{schedule}"\n'
        f'pipeline_parallel_schedule_csv = "{csv_name}"\n'
        f"module_fqns_per_model_part = [\n{rows}\n]\n"
        f"# micro-batches per step: {plan.num_microbatches} (num_pp_microbatches in current "
        "torchtitan; local_batch_size / pipeline_parallel_microbatch_size in older ones)\n"
    )
    return Fragment(True, text, schedule=schedule, fqns=fqns)


def megatron_fragment(plan: Plan, profile: Profile) -> Fragment:
    """Megatron-LM's partition arguments for ``plan``, or why they cannot express it."""
    pp, n = plan.num_devices, plan.num_stages
    if placement_style(plan) != "loop":
        return Fragment(
            False,
            problem=f"placement {list(plan.placement)} is not loop (Megatron puts stage i on rank "
            f"i % {pp}, with the same number of stages on every rank)",
        )
    fams = [lt.family for lt in profile.layer_costs()]
    if fams[0] != "embedding" or fams[-1] != "lm_head":
        return Fragment(
            False,
            problem="Megatron's layouts start with the embedding and end with the LM head; this "
            f"model has {fams[0]} first and {fams[-1]} last",
        )
    hybrid = any(f not in ("embedding", "lm_head", "transformer_block") for f in fams)
    vpp = n // pp
    note = (
        f"# {plan.name or 'plan'}: {n} stages on {pp} ranks. Megatron runs its own "
        f"{'interleaved 1F1B' if vpp > 1 else '1F1B'} order, not the plan's per-device order.\n"
    )
    if hybrid:
        stages = []
        for lo, hi in plan.partition:
            syms = [HYBRID_SYMBOL.get(fams[i], "") for i in range(lo, hi)]
            if not any(syms):
                return Fragment(
                    False,
                    problem=f"stage [{lo}, {hi}) has no decoder layer; a hybrid layer pattern "
                    "cannot give the embedding or the head a stage of its own",
                )
            stages.append("".join(syms))
        args = f'--pipeline-model-parallel-size {pp} --hybrid-layer-pattern "{"|".join(stages)}"'
        return Fragment(True, note + args + "\n")
    sym = {"embedding": "E", "lm_head": "L"}
    layout = "|".join(
        "".join(sym.get(fams[i], "t") for i in range(lo, hi)) for lo, hi in plan.partition
    )
    args = f'--pipeline-model-parallel-size {pp} --pipeline-model-parallel-layout "{layout}"'
    return Fragment(True, note + args + "\n")


def frameworks_md(plan: Plan, profile: Profile) -> str:
    """The job folder's FRAMEWORKS.md: each framework's fragment or the failing constraint."""
    tt, mg = torchtitan_fragment(plan, profile), megatron_fragment(plan, profile)
    lines = ["# Running this plan in torchtitan or Megatron-LM", ""]
    lines += ["## torchtitan", ""]
    if tt.ok:
        lines += ["Expressible: `torchtitan.toml` (below) with `schedule.csv` beside it.", "",
                  "```toml", tt.text.rstrip(), "```", ""]  # fmt: skip
    else:
        lines += [f"Not expressible: {tt.problem}. Run it with this job's `launch.sh`.", ""]
    lines += ["## Megatron-LM", ""]
    if mg.ok:
        lines += ["Partition only:", "", "```", mg.text.rstrip(), "```", ""]
    else:
        lines += [f"Not expressible: {mg.problem}.", ""]
    return "\n".join(lines)
