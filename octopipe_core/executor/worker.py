"""Worker entry point of one rank, under torchrun (``python -m octopipe_core.executor.worker
CONFIG``) or forked by ``octopipe run``'s launcher (``executor.local_launch``).

Trains the job (``train.execute``; the job folder is the config's folder: data paths,
checkpoints, STOP/CHECKPOINT files). Rank 0 writes ``result.json`` (losses, step times, op
records), ``trace_executed.json`` and, with ``--grads``, ``grads.pt`` (the first step's reduced
gradients) into ``--out`` (default: ``<job>/out``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

from octopipe_core.errors import OctoPipeError
from octopipe_core.executor.harness import leave_process_group
from octopipe_core.executor.job_config import load_job_config
from octopipe_core.executor.runtime import PeerError, init_distributed
from octopipe_core.executor.trace import records_trace, result_steps, write_trace
from octopipe_core.executor.train import execute, install_signal_handler
from octopipe_core.executor.trust import strip_cwd_from_path


def write_outputs(res: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if res["grads"]:
        torch.save(res["grads"], out / "grads.pt")
    summary = {k: v for k, v in res.items() if k not in ("grads", "params_by_replica")}
    (out / "result.json").write_text(json.dumps(summary))
    trace = records_trace(
        res["records"],
        tail=res["tail"],
        peak_memory_gib=res["peak_memory_gib"],
        layout=res.get("layout"),
        steps=result_steps(res),
    )
    write_trace(trace, out / "trace_executed.json")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="octopipe-worker")
    ap.add_argument("config")
    ap.add_argument("--out", default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--backend", default=None)
    ap.add_argument("--grads", action="store_true", help="write the first step's gradients")
    ap.add_argument("--no-resume", action="store_true", help="ignore existing checkpoints")
    args = ap.parse_args(argv)
    strip_cwd_from_path()  # a job folder run from inside must not import its own files
    try:
        cfg = load_job_config(args.config)
    except OctoPipeError as e:
        print(f"octopipe worker: error: {e}", file=sys.stderr, flush=True)
        return 2
    rt = cfg.setdefault("runtime", {})
    torch.set_num_threads(int(rt.get("threads", 1)))
    timeout = float(rt.get("timeout_s", 45))
    try:
        rank, _, device = init_distributed(args.backend or rt.get("backend", "auto"), timeout)
    except OctoPipeError as e:
        print(f"octopipe worker: error: {e}", file=sys.stderr, flush=True)
        return 2
    pin = os.environ.get("OCTOPIPE_PIN", "")
    if pin:
        # Pins the calling (compute) thread only; the process group's I/O threads, created
        # above, keep every core ("OCTOPIPE_PIN=all" pins them too: set before init).
        cores = sorted(os.sched_getaffinity(0))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        os.sched_setaffinity(0, {cores[local % len(cores)]})
    steps = args.steps if args.steps is not None else int(rt.get("steps", 1))
    warmup = args.warmup if args.warmup is not None else int(rt.get("warmup", 0))
    install_signal_handler()
    job = Path(args.config).resolve().parent
    out = Path(args.out) if args.out else job / "out"
    try:
        res = execute(
            cfg,
            device,
            steps,
            warmup,
            job_dir=job,
            out_dir=out,
            record=("grads",) if args.grads else (),
            resume=False if args.no_resume else None,
        )
    except PeerError as e:
        print(f"octopipe worker: error: {e}", file=sys.stderr, flush=True)
        os._exit(3)  # do not wait in the process-group teardown for a dead peer
    except Exception as e:  # a peer error raised while posting, a model or data error
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(
            f"octopipe worker: error: rank {rank}: {type(e).__name__}: {msg}",
            file=sys.stderr,
            flush=True,
        )
        if not isinstance(e, OctoPipeError):
            traceback.print_exc()
        os._exit(3)
    if rank == 0 and res is not None:
        write_outputs(res, out)
        n = len(res["losses"])
        last = f"; last loss {res['losses'][-1]:.6g}" if n else ""
        print(f"octopipe worker: {n} step(s) from step {res['start_step']}{last}", flush=True)
    leave_process_group()


if __name__ == "__main__":
    raise SystemExit(main())
