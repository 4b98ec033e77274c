"""The training loop of an exported job, on a pp x dp mesh.

One step on every rank: its replica's batch (``data``), the plan's forward/backward
(``runtime.PipelineExecutor``) with each stage's DP gradient reduction launched right after
the stage's last W (``dp.DataParallel``), then the wait for the reductions, one small
all-reduce (squared gradient norm, loss, stop/checkpoint requests), gradient clipping (global
norm), the optimizer step at the scheduled learning rate, and a progress line on the rank that
holds the last stage of replica 0 (also appended to ``<out>/train_log.jsonl``). ``--steps`` is
the step to stop at: a resumed run continues from its checkpoint's step (``checkpoint``).

``execute(cfg, device, steps, warmup)`` runs on an initialised process group and returns rank 0's
merged result (losses per step, step times, op records, the first step's reduced gradients).
"""

from __future__ import annotations

import gc
import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from octopipe_core.errors import OctoPipeError
from octopipe_core.executor import checkpoint as ckpt
from octopipe_core.executor.ckpt_trust import CHECKPOINT_DIR_ENV
from octopipe_core.executor.data import DataSource
from octopipe_core.executor.dp import DataParallel
from octopipe_core.executor.mesh import JobLayout, RankMesh, build_mesh, config_layout
from octopipe_core.executor.runtime import PipelineExecutor, StepResult, config_parts
from octopipe_core.executor.settings import CheckpointSettings, DataSettings, OptimSettings

_MESHES: dict[tuple[Any, ...], RankMesh] = {}
_SIGNALLED = threading.Event()


def _on_sigusr1(signum: int, frame: Any) -> None:
    _SIGNALLED.set()


def install_signal_handler() -> None:
    """SIGUSR1 asks for a checkpoint at the end of the current step (main thread only)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, _on_sigusr1)


def mesh_for(layout: JobLayout, device_type: str) -> RankMesh:
    """The mesh of ``layout`` (made once per process group: its sub-groups are collective)."""
    key = (layout, device_type, id(dist.distributed_c10d._get_default_group()))
    if key not in _MESHES:
        _MESHES[key] = build_mesh(layout, device_type)
    return _MESHES[key]


def _printer(text: str) -> None:
    print(text, flush=True)


def execute(
    cfg: dict[str, Any],
    device: torch.device,
    steps: int | None = None,
    warmup: int | None = None,
    *,
    job_dir: str | Path | None = None,
    out_dir: str | Path | None = None,
    record: tuple[str, ...] = ("grads",),
    resume: bool | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any] | None:
    """Train ``warmup + steps`` steps (from the latest checkpoint when resuming); rank 0 gets
    the merged result. ``record``: ``"grads"`` (the first step's reduced gradients),
    ``"params"`` (every replica's final parameters)."""
    rt = cfg.get("runtime", {})
    steps = int(rt.get("steps", 1)) if steps is None else steps
    warmup = int(rt.get("warmup", 0)) if warmup is None else warmup
    total = warmup + steps
    plan, prof, lp, st = config_parts(cfg)
    layout = config_layout(cfg)
    if dist.get_backend() == "nccl" and not cfg.get("nccl_safe", True):
        raise OctoPipeError(
            f"executor: this plan's comm order is not safe on NCCL ({cfg.get('nccl_problem')}); "
            "fix: run it with --backend gloo"
        )
    mesh = mesh_for(layout, device.type)
    timeout = float(rt.get("timeout_s", 45))
    families = [lt.family for lt in prof.layer_costs()]
    names = list(prof.layers)  # the profile's layer type names, passed to a model hook
    ex = PipelineExecutor(
        lp, families, st, mesh.device, device, timeout, peers=mesh.pipeline, names=names
    )
    ex.infer_shapes()
    optim = OptimSettings.from_dict(cfg.get("train"))
    if not optim.decay_steps:
        optim.decay_steps = int(rt.get("steps", 1)) + int(rt.get("warmup", 0))
    dpar = DataParallel(
        {s: ex.stage_params(s) for s in ex.my_stages},
        layout.dp,
        mesh.replica,
        mesh.dp_group,
        layout.zero1,
        optim,
        timeout,
    )
    jdir = Path(job_dir) if job_dir is not None else None
    data = DataSource(
        DataSettings.from_dict(cfg.get("data", {"kind": "fixed"})), ex.st, plan.num_microbatches,
        jdir, layout.dp,
    )  # fmt: skip
    cks = CheckpointSettings.from_dict(cfg.get("checkpoint"))
    override = os.environ.get(CHECKPOINT_DIR_ENV) or None  # run --checkpoint-dir
    ck_dir = cks.path(jdir, override) if jdir is not None else None
    meta = ckpt.job_meta(layout.to_dict(), plan.partition)

    def state() -> dict[str, torch.Tensor]:
        return {f"model.{k}": p.detach() for k, p in ex.params.items()} | dpar.state_tensors()

    start = 0
    if ck_dir is not None and (cks.resume if resume is None else resume):
        found = ckpt.latest(ck_dir)
        if found is not None:
            start = ckpt.load(found, state(), meta)

    last_rank = mesh.layout.rank(0, plan.placement[-1])
    is_logger = dist.get_rank() == last_rank
    say = log or _printer
    log_file = None
    if is_logger and out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        log_file = (Path(out_dir) / "train_log.jsonl").open("a")
    if is_logger and start:
        say(f"resumed from {ck_dir}/step_{start:06d} (step {start})")
    tokens_per_step = plan.num_microbatches * st.microbatch_size * st.seq * layout.dp

    results: list[StepResult] = []
    losses: list[float] = []
    tail: list[tuple[int, str, float, float]] = []
    first_grads: dict[str, torch.Tensor] = {}
    stopped_at = None
    with manual_gc():  # the collector runs at each step's end, not in the middle
        for i in range(start, total):
            dist.barrier()
            x, y = data.batch(i, mesh.replica, layout.dp)
            ex.set_batch(x, y)
            dpar.tail.clear()
            res = ex.step(i, dpar.launch)
            dpar.wait()
            if i == start and "grads" in record:
                first_grads = dpar.reduced_grads()
            # one small all-reduce: squared gradient norm, loss, stop and checkpoint requests
            stop_req, ck_req = ckpt.requested(jdir) if jdir is not None else (False, False)
            flags = torch.tensor(
                [dpar.grad_sq_sum(), res.loss or 0.0, float(stop_req),
                 float(ck_req or _SIGNALLED.is_set())],
                dtype=torch.float64,
                device=device,
            )  # fmt: skip
            t_sync = time.perf_counter()
            dist.all_reduce(flags)
            flags = flags.cpu()
            dpar.tail.append(("SYNC", t_sync, time.perf_counter()))
            norm = float(flags[0] / dpar.norm_divisor) ** 0.5
            if not math.isfinite(norm):
                raise OctoPipeError(
                    f"step {i}: the gradient norm is {norm}; fix: lower --lr or use float32"
                )
            coef = min(1.0, optim.clip / (norm + 1e-6)) if optim.clip > 0 else 1.0
            lr = optim.lr_at(i, optim.decay_steps)
            dpar.step(lr, coef)
            gc.collect(1)  # the step's young objects (0.1 ms), inside the step's time
            res.end = time.perf_counter()
            results.append(res)
            loss = float(flags[1]) / layout.dp
            losses.append(loss)
            tail += [(i, name, a, b) for name, a, b in dpar.tail]
            if is_logger:
                dt = res.end - res.start
                rec = {
                    "step": i + 1,
                    "loss": loss,
                    "lr": lr,
                    "grad_norm": norm,
                    "step_ms": dt * 1e3,
                    "tokens_per_s": tokens_per_step / dt,
                }
                say(
                    f"step {i + 1}/{total} | loss {loss:.6f} | lr {lr:.3e} | "
                    f"grad_norm {norm:.4f} | {rec['tokens_per_s']:,.0f} tokens/s | "
                    f"{dt * 1e3:.1f} ms/step"
                )
                if log_file is not None:
                    log_file.write(json.dumps(rec) + "\n")
                    log_file.flush()
            stop = bool(flags[2] > 0)
            due = cks.every > 0 and ((i + 1) % cks.every == 0 or i + 1 == total)
            if ck_dir is not None and (due or stop or flags[3] > 0):
                path = ckpt.save(ck_dir, i + 1, state(), meta, cks.keep, jdir)
                _SIGNALLED.clear()
                if dist.get_rank() == 0 and jdir is not None:
                    ckpt.clear_requests(jdir, stop=stop, checkpoint=bool(flags[3] > 0))
                if is_logger:
                    say(f"checkpoint {path}")
            if stop:
                stopped_at = i + 1
                if is_logger:
                    say(f"stopped at step {i + 1} (STOP file)")
                break
    if log_file is not None:
        log_file.close()

    mine: dict[str, Any] = {
        "rank": dist.get_rank(),
        "replica": mesh.replica,
        "device": mesh.device,
        "losses": losses,
        "steps": [(r.start, r.end) for r in results],
        "records": [(r.step, r.op, r.start, r.end, r.wait) for res in results for r in res.records],
        "tail": tail,
        "grads": first_grads,
        # what the caching allocator held at most (CUDA only; the simulator's peak is per device)
        "peak_memory_gib": (
            torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
        ),
    }
    if "params" in record:
        mine["params"] = {k: p.detach().cpu().clone() for k, p in ex.params.items()}
    world = dist.get_world_size()
    gathered: list[Any] = [None] * world if dist.get_rank() == 0 else []
    dist.gather_object(mine, gathered if dist.get_rank() == 0 else None, dst=0)
    if dist.get_rank() != 0:
        return None
    out = merge_results(gathered, min(warmup, max(0, warmup - start)), layout.dp)
    out.update(start_step=start, stopped_at=stopped_at, layout=layout.to_dict())
    return out


@contextmanager
def manual_gc() -> Iterator[None]:
    """Python's automatic garbage collector off while the steps run (each step ends with a
    young-generation collection instead, as torchtitan's ``gc_freq`` and Megatron-LM's
    ``--manual-gc`` do). A full collection walks every object torch and the model made: on 2
    CPU ranks one took 77 ms against a 310 ms step, at a random op of 1 step in 4, and that
    noise is what the calibration and the verification measure."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _rank(part: dict[str, Any]) -> int:
    return int(part["rank"])


def merge_results(parts: list[dict[str, Any]], warmup: int, dp: int = 1) -> dict[str, Any]:
    """Combine per-rank results: the job's loss per step (all replicas' mean), step times, op
    records ``(rank, step, op, start, end, wait)``, DP/optimizer records and gradients."""
    n = len(parts[0]["steps"])
    step_ms = [
        (max(p["steps"][i][1] for p in parts) - min(p["steps"][i][0] for p in parts)) * 1e3
        for i in range(n)
    ]
    grads: dict[str, torch.Tensor] = {}
    for p in sorted(parts, key=lambda q: -q["replica"]):  # replica 0's last
        grads.update(p["grads"])
    out: dict[str, Any] = {
        "losses": parts[0]["losses"],
        "step_ms": step_ms,
        "step_starts": [min(p["steps"][i][0] for p in parts) for i in range(n)],
        "warmup": warmup,
        "records": [(p["rank"], *r) for p in parts for r in p["records"]],
        "tail": [(p["rank"], *r) for p in parts for r in p["tail"]],
        "grads": grads,
        "peak_memory_gib": [p.get("peak_memory_gib") for p in sorted(parts, key=_rank)],
    }
    if "params" in parts[0]:
        reps: list[dict[str, torch.Tensor]] = [{} for _ in range(dp)]
        for p in parts:
            reps[p["replica"]].update(p["params"])
        out["params_by_replica"] = reps
    return out
