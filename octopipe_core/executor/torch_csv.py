"""Run an exported ``schedule.csv`` with PyTorch's own ``_PipelineScheduleRuntime`` (a check
that the export is consumable by torch.distributed.pipelining), on the same model and data.

``run_torch_csv_local(job_dirs, world)`` spawns ``world`` gloo ranks; each builds one
``PipelineStage`` per stage the side-car places on it, loads the CSV with
``_PipelineScheduleRuntime._load_csv`` (compute-only format), runs one step and returns the
summed loss and all gradients (rank 0).
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from octopipe_core.executor.harness import free_port, leave_process_group, start_local
from octopipe_core.executor.models import ModelSettings, build_layers, make_batch, param_names
from octopipe_core.profile import Profile


class _StageModule(nn.Module):
    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def _worker(rank: int, world: int, port: int, jobs: list[str], out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    results = [_run_job(rank, world, Path(j)) for j in jobs]
    if rank == 0:
        torch.save(results, out)  # tensors and plain data only
    leave_process_group()


def _run_job(rank: int, world: int, d: Path) -> dict[str, Any] | None:
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    cfg = json.loads((d / "executor_config.json").read_text())
    side = json.loads((d / "schedule.json").read_text())
    prof = Profile.from_dict(cfg["plan"]["profile"])
    fams = [lt.family for lt in prof.layer_costs()]
    st = ModelSettings.from_dict(cfg["model"]).resolved(fams)
    n_st, m = int(side["num_stages"]), int(side["n_microbatches"])
    mine = sorted(int(s) for s, r in side["stage_to_rank"].items() if r == rank)
    keep = {i for s in mine for i in range(*side["stage_layers"][str(s)])}
    layers = build_layers(fams, st, keep)
    dev = torch.device("cpu")
    stages = []
    for s in mine:
        lo, hi = side["stage_layers"][str(s)]
        mod = _StageModule([layers[i] for i in range(lo, hi)])  # type: ignore[misc]
        stages.append(PipelineStage(mod, s, n_st, dev))

    def loss_fn(out: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        if st.loss == "cross_entropy":
            ce = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), tgt.reshape(-1))
            return ce / m
        return out.pow(2).mean() / m

    sched = _PipelineScheduleRuntime(stages, n_microbatches=m, loss_fn=loss_fn, scale_grads=False)
    sched._load_csv(str(d / "schedule.csv"))
    x, y = make_batch(st, m)
    args = (x.reshape(-1, *x.shape[2:]),) if 0 in mine else ()
    losses: list[torch.Tensor] = []
    kw: dict[str, Any] = {}
    if n_st - 1 in mine:
        kw = {"target": y.reshape(-1, *y.shape[2:]), "losses": losses}
    sched.step(*args, **kw)
    grads = {
        k: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
        for k, p in param_names(layers).items()
    }
    part = {"loss": sum(float(v.detach()) for v in losses), "grads": grads}
    gathered: list[Any] = [None] * world if rank == 0 else []
    dist.gather_object(part, gathered if rank == 0 else None, dst=0)
    if rank != 0:
        return None
    merged: dict[str, Any] = {"loss": sum(p["loss"] for p in gathered), "grads": {}}
    for p in gathered:
        merged["grads"].update(p["grads"])
    return merged


def run_torch_csv_local(job_dirs: list[str | Path], world: int) -> list[dict[str, Any]]:
    """Loss and gradients of one step of each job's CSV under torch's runtime (one group)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "res.pkl")
        jobs = [str(j) for j in job_dirs]
        start_local(_worker, (world, free_port(), jobs, out), world)
        return torch.load(out, weights_only=True)
