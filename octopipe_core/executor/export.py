"""Export a plan as a self-contained job folder (no torch import needed to export).

Files written:

* ``executor_config.json``: the plan (with its profile), the lowered per-rank op lists, the
  model and data settings, runtime options and the torch version;
* ``launch.sh``: torchrun launcher (single node by default; ``--nnodes``, ``--node-rank``,
  ``--master-addr``, ``--master-port``, ``--nproc-per-node`` for several nodes);
* ``schedule.csv``: PyTorch's compute-only schedule for
  ``_PipelineScheduleRuntime._load_csv`` (one row per rank, cells ``{stage}{F|I|W|B}{mb}``:
  split backward = I + W, fused backward = B) and ``schedule.json`` its side-car (stage -> rank,
  micro-batches, layer ranges per stage, torch version);
* ``trace_simulated.json``: Chrome trace (Perfetto) of the simulated timeline;
* ``plan.json``: the plan as given.
"""

from __future__ import annotations

import csv
import io
import json
import sys
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


def make_config(
    plan: Plan,
    profile: Profile,
    model: dict[str, Any] | None = None,
    runtime: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The executor config of ``plan``: lowered (and checked) lists plus settings."""
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


LAUNCH_SH = """#!/usr/bin/env bash
# Launch this OctoPipe job with torchrun. Single node by default:
#   ./launch.sh
# Several nodes (run on each node):
#   ./launch.sh --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 [--master-port 29500]
# Extra arguments after -- go to the worker (e.g. -- --steps 10 --backend gloo).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NNODES=1; NODE_RANK=0; MASTER_ADDR=127.0.0.1; MASTER_PORT=0; NPROC=""
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
WORLD=__WORLD__
if [[ -z "$NPROC" ]]; then
  if (( WORLD % NNODES )); then
    echo "launch.sh: $WORLD ranks do not split over $NNODES nodes; pass --nproc-per-node" >&2
    exit 2
  fi
  NPROC=$(( WORLD / NNODES ))
fi
if [[ "$NNODES" -gt 1 && "$MASTER_PORT" == 0 ]]; then MASTER_PORT=29500; fi
export PYTHONPATH="__PYROOT__${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec "${PYTHON:-__PYTHON__}" -m torch.distributed.run --nnodes "$NNODES" --node-rank "$NODE_RANK" \\
  --nproc-per-node "$NPROC" --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \\
  -m octopipe_core.executor.worker "$HERE/executor_config.json" --out "$HERE/out" "$@"
"""


def export_job(
    plan: Plan,
    profile: Profile,
    out_dir: str | Path,
    *,
    force: bool = False,
    model: dict[str, Any] | None = None,
    runtime: dict[str, Any] | None = None,
) -> Path:
    """Write the job folder (see the module docstring); refuses a non-empty folder unless
    ``force``."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise OctoPipeError(f"export: --out {out}: is a file; fix: pass a folder path")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise OctoPipeError(
            f"export: --out {out}: folder is not empty; fix: choose an empty folder or pass "
            "--force to overwrite"
        )
    cfg = make_config(plan, profile, model, runtime)
    out.mkdir(parents=True, exist_ok=True)
    (out / "executor_config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    root = str(Path(__file__).resolve().parents[2])
    sh = (
        LAUNCH_SH.replace("__WORLD__", str(plan.num_devices))
        .replace("__PYROOT__", root)
        .replace("__PYTHON__", sys.executable)
    )
    (out / "launch.sh").write_text(sh)
    (out / "launch.sh").chmod(0o755)
    (out / "schedule.csv").write_text(torch_csv(plan))
    (out / "schedule.json").write_text(json.dumps(torch_sidecar(plan), indent=1) + "\n")
    save_plan(plan, out / "plan.json", profile)
    from octopipe_core.executor.trace import sim_trace, write_trace
    from octopipe_core.simulator import simulate

    write_trace(sim_trace(simulate(profile, plan)), out / "trace_simulated.json")
    return out
