"""Peak memory of a training job on the CPU: measured against the simulator's prediction.

A Llama-shaped bfloat16 model (``bench_gpu:llama3_8b`` at a small hidden size, with the real
model's proportions: seq = 2 x hidden, vocab = 31 x hidden) is profiled with
``octopipe profile``; a plan on ``--devices`` devices is simulated on that profile and
exported; then each rank (gloo; receives posted when needed, as on NCCL) trains ``--steps``
steps in a child process of its own while a dispatch mode reads glibc's bytes in use
(``mallinfo2``: heap plus mmapped blocks) after every torch op. A rank's measured peak is taken
above the bytes in use before its job started (the model's code already imported); the report
names the op and the call stack at the peak, and with ``--tensors`` the CPU tensors Python can
reach at that moment. Linux with glibc only.

The GPU counterpart (the CUDA allocator's own peak) is in ``bench_gpu.py``.

Run: ``python benchmarks/bench_memory.py [--hidden 512 --blocks 4 --schedule 1f1b --devices 1
--microbatches 4 --tensors]`` (20-40 s on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HOOK = "bench_gpu:llama3_8b"


def tensor_mib() -> float:
    """MiB of the CPU tensors Python can reach now (``gc``), each storage counted once."""
    import gc

    import torch

    seen: dict[int, int] = {}
    for o in gc.get_objects():
        if isinstance(o, torch.Tensor) and o.device.type == "cpu":
            try:
                st = o.untyped_storage()
            except (RuntimeError, NotImplementedError):  # tensors without storage
                continue
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values()) / 2**20


def worker(config: str, steps: int, rank: int, world: int, tensors: bool) -> None:
    """Child: run rank ``rank`` of ``config`` in this process under the sampling dispatch mode
    and print one JSON line (peak and baseline bytes, the op and stack at the peak; with
    ``tensors``, the reachable tensors' MiB at the peak, which costs a heap walk per MiB of
    new peak)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from octopipe_core.executor.profiler import glibc_in_use

    reader = glibc_in_use()
    if reader is None:
        raise SystemExit("bench_memory: needs glibc's mallinfo2 (Linux, glibc 2.33 or later)")
    in_use = reader

    peak: dict[str, Any] = {"bytes": 0, "op": "", "stack": [], "tensor_mib": None}

    class Sample(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kw: Any = None) -> Any:
            out = func(*args, **(kw or {}))
            used = in_use()
            if tensors and used > peak["bytes"] + 2**20:
                peak["tensor_mib"] = tensor_mib() - base_tensors
            if used > peak["bytes"]:
                frames = traceback.extract_stack()[:-1]
                peak.update(
                    bytes=used,
                    op=str(func),
                    stack=[f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames
                           if "octopipe_core" in f.filename][-6:],
                )  # fmt: skip
            return out

    from octopipe_core.executor import worker as w

    def report(code: int = 0) -> None:
        print(json.dumps({"base": base, **peak}), flush=True)
        os._exit(code)

    w.leave_process_group = report  # type: ignore[assignment]
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      # receives posted when needed, as on NCCL (gloo's default posts a whole
                      # step's receives at its start: buffers the GPU path never holds)
                      OCTOPIPE_PREPOST="none")  # fmt: skip
    torch.set_num_threads(1)
    # the model's code is imported before the baseline: its Python objects are not the job's
    import bench_gpu  # noqa: F401
    from transformers.models.llama import modeling_llama  # noqa: F401

    base_tensors = tensor_mib() if tensors else 0.0
    base = in_use()
    with Sample():
        w.main([config, "--steps", str(steps), "--backend", "gloo", "--no-resume"])


def octopipe(*args: str) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "benchmarks")]))
    p = subprocess.run([sys.executable, "-m", "octopipe_core", *args], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=900)  # fmt: skip
    if p.returncode != 0:
        raise SystemExit(f"octopipe {args[0]} failed:\n{p.stderr[-3000:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--devices", type=int, default=1, help="pipeline devices (one rank each)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--worker", metavar="CONFIG", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument(
        "--tensors", action="store_true", help="also sum the reachable tensors at the peak (slow)"
    )
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.steps, args.rank, args.devices, args.tensors)
        return 0
    from octopipe_core.plan import save_plan
    from octopipe_core.profile import load_profile
    from octopipe_core.schedules import build_plan
    from octopipe_core.simulator import simulate

    h = args.hidden
    sizes = ["--hidden", str(h), "--seq", str(2 * h), "--vocab", str(31 * h),
             "--microbatch-size", "1", "--dtype", "bfloat16"]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        layers = f"embedding,block=transformer_block*{args.blocks},lm_head"
        octopipe("profile", "--model", HOOK, "--layers", layers, *sizes, "--repeats", "2",
                 "--warmup", "1", "--out", str(tmp / "prof.json"))  # fmt: skip
        prof = load_profile(tmp / "prof.json")
        plan = build_plan(prof, args.schedule, args.devices, args.microbatches)
        sim = simulate(prof, plan)
        save_plan(plan, tmp / "plan.json", prof)
        octopipe("export", str(tmp / "plan.json"), "--out", str(tmp / "job"), "--model", HOOK,
                 *sizes, "--steps", str(args.steps))  # fmt: skip
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "benchmarks")]),
                   MASTER_PORT=str(29400 + os.getpid() % 500))  # fmt: skip
        job = str(tmp / "job" / "executor_config.json")
        extra = ["--tensors"] if args.tensors else []
        cmd = [sys.executable, __file__, "--worker", job, "--steps", str(args.steps),
               "--devices", str(args.devices), *extra]  # fmt: skip
        pipe = subprocess.PIPE
        procs = [
            subprocess.Popen([*cmd, "--rank", str(r)], env=env, stdout=pipe, stderr=pipe, text=True)
            for r in range(args.devices)
        ]
        results = []
        for r, proc in enumerate(procs):
            out, err = proc.communicate(timeout=900)
            lines = [ln for ln in out.splitlines() if ln.startswith("{")]
            if proc.returncode != 0 or not lines:
                raise SystemExit(f"rank {r} failed:\n{out[-2000:]}{err[-3000:]}")
            results.append(json.loads(lines[-1]))
    print(
        f"model: Llama-shaped, hidden {h}, seq {2 * h}, vocab {31 * h}, {args.blocks} blocks, "
        f"bfloat16; {args.schedule}, {args.devices} device(s), {args.microbatches} "
        f"micro-batches, {args.steps} steps; measured: glibc bytes in use above the start"
    )
    for d, res in enumerate(results):
        meas = (res["bytes"] - res["base"]) / 2**30
        pred = sim.peak_memory_gib[d]
        print(
            f"d{d}: simulated peak_memory_gib {pred:.3f} (static {sim.static_mib[d] / 1024:.3f}),"
            f" measured {meas:.3f}, error (simulated / measured - 1) {pred / meas - 1:+.1%}"
        )
        if res["tensor_mib"] is not None:
            print(f"    tensors reachable at the peak: {res['tensor_mib'] / 1024:.3f} GiB")
        print(f"    at the peak: {res['op']}, in " + " <- ".join(reversed(res["stack"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
