"""Run several executor configs in one local process group (tests, benchmarks).

``run_local(configs, world)`` spawns ``world`` processes (gloo, 127.0.0.1, a free port), runs
every config in turn in the same group, and returns rank 0's results. Batching many checks per
launch keeps distributed test suites fast.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from octopipe_core.executor.local_launch import CHECKPOINT_MODULE
from octopipe_core.executor.local_launch import PRELOAD as RANK_PRELOAD
from octopipe_core.executor.train import execute


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Imported once by the fork server; every local rank is forked from it with these modules loaded
# (a fresh interpreter per rank would import torch again: about 2 s of CPU each).
PRELOAD = ["octopipe_core.executor.train", *RANK_PRELOAD, CHECKPOINT_MODULE]


def _with_env(rank: int, fn: Callable[..., None], env: dict[str, str], *args: Any) -> None:
    os.environ.clear()  # the caller's environment now, not the fork server's at its start
    os.environ.update(env)
    fn(rank, *args)


def start_local(fn: Callable[..., None], args: tuple[Any, ...], nprocs: int) -> None:
    """Run ``fn(rank, *args)`` in ``nprocs`` local processes and wait for all of them (an
    error in one raises here, as ``torch.multiprocessing.spawn`` does).

    The processes are forked from a fork server that has imported torch once, and get the
    caller's current environment; ``fn`` must be a module-level function."""
    mp.set_forkserver_preload(PRELOAD)
    mp.start_processes(
        _with_env,
        args=(fn, dict(os.environ), *args),
        nprocs=nprocs,
        join=True,
        start_method="forkserver",
    )


def leave_process_group(code: int = 0) -> NoReturn:
    """Leave the process group together, then end the process without the interpreter's
    teardown.

    A gloo I/O thread or work object destroyed during interpreter finalization aborts the
    process ("terminate called without an active exception") after a run that succeeded;
    ``os._exit`` skips that teardown once every output is written and flushed."""
    try:
        dist.barrier()
        dist.destroy_process_group()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _worker(
    rank: int,
    world: int,
    port: int,
    configs: list[dict[str, Any]],
    out: str,
    steps: int,
    warmup: int,
    timeout_s: float,
    record: tuple[str, ...],
    job_dirs: list[str | None],
) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )
    results = []
    for cfg, jd in zip(configs, job_dirs, strict=True):
        res = execute(cfg, torch.device("cpu"), steps, warmup, job_dir=jd, record=record)
        if rank == 0:
            results.append(res)
    if rank == 0:
        torch.save(results, out)  # tensors and plain data only
    leave_process_group()


def run_local(
    configs: list[dict[str, Any]],
    world: int,
    steps: int = 1,
    warmup: int = 0,
    timeout_s: float = 60.0,
    record: tuple[str, ...] = ("grads",),
    job_dirs: list[str | None] | None = None,
) -> list[dict[str, Any]]:
    """Results (rank 0's merged dicts) of each config, run on ``world`` local gloo ranks
    (``world`` = pp x dp of every config); ``job_dirs``: each config's job folder (data,
    checkpoints), or None."""
    dirs = job_dirs if job_dirs is not None else [None] * len(configs)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "results.pt")
        start_local(
            _worker,
            (world, free_port(), configs, out, steps, warmup, timeout_s, record, dirs),
            world,
        )
        return torch.load(out, weights_only=True)
