"""Export a plan as a self-contained job folder (no torch import needed to export).

Files written:

* ``executor_config.json``: the plan (with its profile), the lowered per-rank op lists, the
  model and data settings, runtime options and the torch version;
* ``executor_config.json`` also carries the layout (pp x dp, ZeRO-1, rank order), the data
  source, the optimizer and LR schedule, and the checkpoint settings;
* ``launch.sh``: torchrun launcher (single node by default; ``--nnodes``, ``--node-rank``,
  ``--master-addr``, ``--master-port``, ``--nproc-per-node`` for several nodes; static
  rendezvous, so the node rank is honoured), with ``${PYTHON:-python3}`` and paths relative
  to the script: the folder can be copied anywhere the octopipe package is installed;
* ``slurm.sbatch``: the same torchrun line under ``srun`` (one task per node, node rank
  ``SLURM_NODEID``, rendezvous on the first node of the allocation);
* ``schedule.csv``: PyTorch's compute-only schedule for
  ``_PipelineScheduleRuntime._load_csv`` (one row per rank, cells ``{stage}{F|I|W|B}{mb}``:
  split backward = I + W, fused backward = B) and ``schedule.json`` its side-car (stage -> rank,
  micro-batches, layer ranges per stage, torch version);
* ``FRAMEWORKS.md`` (and ``torchtitan.toml`` where torchtitan can run the plan): the
  torchtitan / Megatron-LM settings of the plan, or the constraint it fails
  (``executor.frameworks``);
* ``trace_simulated.json``: Chrome trace (Perfetto) of the simulated timeline;
* ``plan.json``: the plan as given.
"""

from __future__ import annotations

import csv
import io
import json
from importlib import metadata
from pathlib import Path
from typing import Any

from octopipe_core.errors import OctoPipeError
from octopipe_core.executor.lowering import lower_plan
from octopipe_core.plan import Plan, save_plan, validate_plan
from octopipe_core.profile import Profile

CONFIG_FORMAT = "octopipe.executor/v1"
TORCH_LETTER = {"F": "F", "B": "I", "W": "W", "BW": "B"}
DEFAULT_MODEL: dict[str, Any] = {
    "hidden": 16,
    "seq": 8,
    "vocab": 64,
    "microbatch_size": 2,
    "dtype": "float64",
    "seed": 0,
    "factory": "",
    "input": "auto",
    "loss": "auto",
}


def torch_version() -> str:
    """The installed torch version, read without importing torch."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "unknown"


def job_layout(plan: Plan, profile: Profile, layout: dict[str, Any] | None) -> dict[str, Any]:
    """The job's layout: the plan's (or profile's) ``layout`` with ``layout`` overrides
    (``dp``, ``zero1``, ``order``); TP is not executed (one rank per pipeline device)."""
    from octopipe_core.executor.mesh import JobLayout

    dep = getattr(profile, "deployment", None) or plan.deployment
    base: dict[str, Any] = {}
    if dep is not None:
        d = dep.layout.to_dict()
        base = {k: d[k] for k in ("dp", "zero1", "order", "mapping", "tp") if k in d}
    over = {k: v for k, v in (layout or {}).items() if v is not None}
    if over.get("dp") is not None or over.get("order") is not None:
        base.pop("mapping", None)
    lay = JobLayout.from_dict({**base, **over}, plan.num_devices, "export --dp/--zero1")
    return lay.to_dict()


def make_config(
    plan: Plan,
    profile: Profile,
    model: dict[str, Any] | None = None,
    runtime: dict[str, Any] | None = None,
    *,
    layout: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
    train: dict[str, Any] | None = None,
    checkpoint: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The executor config of ``plan``: lowered (and checked) lists plus model, layout
    (pp x dp), data, optimizer, checkpoint and runtime settings."""
    from octopipe_core.executor.settings import CheckpointSettings, DataSettings, OptimSettings

    validate_plan(plan, profile.num_layers)
    lp = lower_plan(plan, profile)
    from octopipe_core.executor.checker import nccl_safe

    nccl_problem = nccl_safe(lp)
    return {
        "format": CONFIG_FORMAT,
        "plan": plan.to_dict(profile),
        "lowered": [" ".join(r) for r in lp.to_strings()],
        "nccl_safe": not nccl_problem,
        **({"nccl_problem": nccl_problem} if nccl_problem else {}),
        "model": {**DEFAULT_MODEL, **(model or {})},
        "layout": job_layout(plan, profile, layout),
        "data": DataSettings.from_dict(data, "export").to_dict(),
        "train": OptimSettings.from_dict(train, "export").to_dict(),
        "checkpoint": CheckpointSettings.from_dict(checkpoint, "export").to_dict(),
        "runtime": {
            "backend": "auto",
            "timeout_s": 45,
            "steps": 1,
            "warmup": 0,
            "threads": 1,
            **(runtime or {}),
        },
        "torch_version": torch_version(),
    }


def torch_mb_relabel(plan: Plan) -> dict[int, int]:
    """Micro-batch renumbering for torch: the last stage's forwards in ascending order.

    torch 2.13's runtime appends each loss in execution order and looks it up by micro-batch
    index (``_maybe_get_loss``), so a last stage that runs its forwards out of order would
    pair backwards with the wrong losses (silently wrong gradients). Micro-batches are
    interchangeable, so the export renumbers them; the step's summed loss and gradients are
    unchanged.
    """
    last = plan.num_stages - 1
    order = [a.mb for a in plan.schedule[plan.placement[last]] if a.stage == last and a.kind == "F"]
    return {old: new for new, old in enumerate(order)}


def torch_csv(plan: Plan) -> str:
    """PyTorch's compute-only CSV: one row per rank, ``{stage}{F|I|W|B}{mb}`` cells
    (micro-batches renumbered by ``torch_mb_relabel``)."""
    relabel = torch_mb_relabel(plan)
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    for acts in plan.schedule:
        w.writerow([f"{a.stage}{TORCH_LETTER[a.kind]}{relabel[a.mb]}" for a in acts])
    return out.getvalue()


def torch_sidecar(plan: Plan) -> dict[str, Any]:
    """What the CSV does not carry: placement, micro-batches, layer ranges, torch version."""
    return {
        "format": "octopipe.torch-schedule/v1",
        "csv_format": "compute_only",
        "loader": "torch.distributed.pipelining.schedules._PipelineScheduleRuntime._load_csv",
        "torch_version": torch_version(),
        "num_ranks": plan.num_devices,
        "num_stages": plan.num_stages,
        "n_microbatches": plan.num_microbatches,
        "stage_to_rank": {str(s): d for s, d in enumerate(plan.placement)},
        "stage_layers": {str(s): list(r) for s, r in enumerate(plan.partition)},
        "microbatch_renumbering": {str(k): v for k, v in torch_mb_relabel(plan).items() if k != v},
        "letters": {
            "F": "forward",
            "I": "input-grad backward",
            "W": "weight-grad backward",
            "B": "full backward",
        },
    }


# The torchrun line of launch.sh and slurm.sbatch (the SLURM one takes the node rank from
# SLURM_NODEID); tests check that the two agree.
TORCHRUN = (
    '"$PY" -m torch.distributed.run --nnodes "$NNODES" --nproc-per-node "$NPROC" \\\n'
    '  --rdzv-backend static --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \\\n'
    '  --node-rank "$__NODE__" -m octopipe_core.executor.worker "$HERE/executor_config.json" \\\n'
    '  --out "$HERE/out" "$@"'
)

LAUNCH_SH = """#!/usr/bin/env bash
# Launch this OctoPipe job (__LABEL__, __WORLD__ ranks) with torchrun. Needs the octopipe
# package installed for the python it runs ($PYTHON, default python3); no path of the exporting
# machine is used. Single node:
#   ./launch.sh
# Several nodes (run on each node; static rendezvous, node rank honoured):
#   ./launch.sh --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 [--master-port 29500]
# Extra arguments after -- go to the worker (e.g. -- --steps 100 --backend gloo --no-resume).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PYTHON:-python3}"
WORLD=__WORLD__
NNODES="${NNODES:-__NNODES__}"; NODE_RANK="${NODE_RANK:-0}"
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"; MASTER_PORT="${MASTER_PORT:-}"; NPROC=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --nnodes) NNODES="$2"; shift 2;;
    --node-rank) NODE_RANK="$2"; shift 2;;
    --master-addr) MASTER_ADDR="$2"; shift 2;;
    --master-port) MASTER_PORT="$2"; shift 2;;
    --nproc-per-node) NPROC="$2"; shift 2;;
    --) shift; break;;
    *) echo "launch.sh: unknown argument $1" >&2; exit 2;;
  esac
done
if [[ -z "$NPROC" ]]; then
  if (( WORLD % NNODES )); then
    echo "launch.sh: $WORLD ranks do not split over $NNODES nodes; pass --nproc-per-node" >&2
    exit 2
  fi
  NPROC=$(( WORLD / NNODES ))
fi
if (( NODE_RANK < 0 || NODE_RANK >= NNODES )); then
  echo "launch.sh: --node-rank $NODE_RANK is outside 0..$(( NNODES - 1 ))" >&2; exit 2
fi
if [[ -z "$MASTER_PORT" ]]; then
  if (( NNODES > 1 )); then MASTER_PORT=29500; else
    MASTER_PORT="$("$PY" -c 'import socket; s = socket.socket(); s.bind(("", 0))
print(s.getsockname()[1])')"
  fi
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec __TORCHRUN_LAUNCH__
"""

SLURM_SH = """#!/usr/bin/env bash
# SLURM batch script for this OctoPipe job (__LABEL__, __WORLD__ ranks): one task per node, each
# runs torchrun with __NPROC__ processes; node rank = SLURM_NODEID, rendezvous on the first
# node. Submit from the job folder (a shared file system for checkpoints):
#   cd JOB && sbatch slurm.sbatch [-- worker arguments, e.g. --steps 1000]
# Needs the octopipe package installed for $PYTHON (default python3) on every node.
# Before the time limit SLURM sends USR1 (--signal below); the script then asks the job to
# checkpoint and stop (a STOP file), so `sbatch slurm.sbatch` again resumes it.
#SBATCH --job-name=__NAME__
#SBATCH --nodes=__NNODES__
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=__NPROC__
#SBATCH --time=01:00:00
#SBATCH --signal=B:USR1@300
#SBATCH --output=slurm-%j.out
set -euo pipefail
HERE="${OCTOPIPE_JOB_DIR:-${SLURM_SUBMIT_DIR:-$(pwd)}}"
if [[ ! -f "$HERE/executor_config.json" ]]; then
  echo "slurm.sbatch: $HERE has no executor_config.json; fix: submit from the job folder" >&2
  exit 2
fi
PY="${PYTHON:-python3}"
NNODES="${SLURM_JOB_NUM_NODES:-__NNODES__}"
NPROC=$(( __WORLD__ / NNODES ))
MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
MASTER_PORT="${MASTER_PORT:-29500}"
export HERE PY NNODES NPROC MASTER_ADDR MASTER_PORT
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
trap 'touch "$HERE/STOP"' USR1
[[ "${1:-}" == "--" ]] && shift
srun --nodes="$NNODES" --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c '
exec __TORCHRUN_SLURM__' octopipe "$@" &
SRUN=$!
set +e
wait "$SRUN"; rc=$?
while kill -0 "$SRUN" 2>/dev/null; do wait "$SRUN"; rc=$?; done
exit "$rc"
"""


def launch_scripts(cfg: dict[str, Any], name: str, nnodes: int) -> tuple[str, str]:
    """``launch.sh`` and ``slurm.sbatch`` of a config (world = pp x dp of its layout)."""
    from octopipe_core.executor.mesh import config_layout

    lay = config_layout(cfg)
    world = lay.world
    if nnodes < 1 or world % nnodes:
        raise OctoPipeError(
            f"export: --nnodes {nnodes}: does not divide the job's {world} ranks ({lay.label()}); "
            f"fix: use a divisor of {world}"
        )
    subs = {
        "__LABEL__": lay.label(),
        "__WORLD__": str(world),
        "__NNODES__": str(nnodes),
        "__NPROC__": str(world // nnodes),
        "__NAME__": "".join(c if c.isalnum() or c in "-_." else "-" for c in name)[:40] or "job",
    }
    sh, slurm = LAUNCH_SH, SLURM_SH
    for k, v in subs.items():
        sh, slurm = sh.replace(k, v), slurm.replace(k, v)
    sh = sh.replace("__TORCHRUN_LAUNCH__", TORCHRUN.replace("__NODE__", "NODE_RANK"))
    slurm = slurm.replace("__TORCHRUN_SLURM__", TORCHRUN.replace("__NODE__", "SLURM_NODEID"))
    return sh, slurm


def default_nnodes(plan: Plan, world: int) -> int:
    """Nodes a job needs by default: one, or as many as the plan's cluster fills."""
    dep = plan.deployment
    if dep is None:
        return 1
    per = max(1, dep.cluster.gpus_per_node // max(1, dep.layout.tp))
    n = -(-world // per)
    while world % n:
        n += 1
    return n


def export_job(
    plan: Plan,
    profile: Profile,
    out_dir: str | Path,
    *,
    force: bool = False,
    model: dict[str, Any] | None = None,
    runtime: dict[str, Any] | None = None,
    layout: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
    train: dict[str, Any] | None = None,
    checkpoint: dict[str, Any] | None = None,
    nnodes: int | None = None,
) -> Path:
    """Write the job folder (see the module docstring); refuses a non-empty folder unless
    ``force``. Nothing in it names a path or python of this machine."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise OctoPipeError(f"export: --out {out}: is a file; fix: pass a folder path")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise OctoPipeError(
            f"export: --out {out}: folder is not empty; fix: choose an empty folder or pass "
            "--force to overwrite"
        )
    cfg = make_config(
        plan, profile, model, runtime, layout=layout, data=data, train=train, checkpoint=checkpoint
    )
    world = int(cfg["layout"]["pp"]) * int(cfg["layout"]["dp"])
    sh, slurm = launch_scripts(
        cfg, plan.name or "octopipe", nnodes if nnodes is not None else default_nnodes(plan, world)
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "executor_config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    from octopipe_core.executor.trust import record_export

    record_export(json.loads(json.dumps(cfg)))  # the digest of what run will read back
    for name, text in (("launch.sh", sh), ("slurm.sbatch", slurm)):
        (out / name).write_text(text)
        (out / name).chmod(0o755)
    (out / "schedule.csv").write_text(torch_csv(plan))
    (out / "schedule.json").write_text(json.dumps(torch_sidecar(plan), indent=1) + "\n")
    save_plan(plan, out / "plan.json", profile)
    from octopipe_core.executor.frameworks import frameworks_md, torchtitan_fragment

    (out / "FRAMEWORKS.md").write_text(frameworks_md(plan, profile))
    tt = torchtitan_fragment(plan, profile)
    if tt.ok:
        (out / "torchtitan.toml").write_text(tt.text)
    from octopipe_core.executor.trace import sim_trace, write_trace
    from octopipe_core.simulator import simulate

    write_trace(sim_trace(simulate(profile, plan)), out / "trace_simulated.json")
    return out
