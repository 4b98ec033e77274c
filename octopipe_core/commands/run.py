"""``octopipe run``: launch an exported job on this machine (torchrun, gloo, CPU), all its
pp x dp ranks on one node; ``--check`` compares the first step with a single-process
reference on the union of every replica's batch."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from octopipe_core.errors import OctoPipeError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run an exported job locally (torchrun, gloo, CPU)",
        description="Launch DIR/executor_config.json with torchrun, one process per rank "
        "(pipeline devices x DP replicas). --steps N trains up to step N (resuming from the "
        "latest checkpoint in the job folder, if any). With --check, also run the "
        "single-process reference and compare the first step's loss and gradients.",
    )
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--check", action="store_true", help="compare with a 1-process reference")
    p.add_argument("--steps", type=int, default=None, help="train up to this step")
    p.add_argument("--warmup", type=int, default=None, help="extra steps, not timed")
    p.add_argument("--no-resume", action="store_true", help="ignore the job's checkpoints")
    p.add_argument("--timeout", type=float, default=600, help="wall-clock limit of the job (s)")
    p.add_argument("--backend", choices=("gloo", "nccl", "auto"), default="gloo")
    p.set_defaults(func=run)


def launch(
    cfg_path: Path,
    out: Path,
    nproc: int,
    extra: list[str],
    timeout: float,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """torchrun (single node, local rendezvous) the worker on ``cfg_path``."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "octopipe_core.executor.worker",
        str(cfg_path),
        "--out",
        str(out),
        *extra,
    ]
    e = dict(os.environ)
    e.setdefault("OMP_NUM_THREADS", "1")
    root = str(Path(__file__).resolve().parents[2])
    e["PYTHONPATH"] = root + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.update(env or {})
    try:
        return subprocess.run(cmd, env=e, timeout=timeout, text=True, capture_output=True)
    except subprocess.TimeoutExpired as ex:
        raise OctoPipeError(
            f"run: the job did not finish within {timeout:.0f} s; fix: raise --timeout or check "
            "the worker logs"
        ) from ex


def run(args: argparse.Namespace) -> int:
    d = Path(args.dir)
    cfg_path = d / "executor_config.json"
    if not cfg_path.is_file():
        raise OctoPipeError(
            f"run: {cfg_path}: file not found; fix: export a job first (octopipe export "
            "PLAN.json --out DIR)"
        )
    cfg = json.loads(cfg_path.read_text())
    preflight(cfg, cfg_path)
    from octopipe_core.executor.mesh import config_layout

    nproc = config_layout(cfg).world
    extra = ["--backend", args.backend]
    if args.check:
        extra.append("--grads")
    if args.no_resume or args.check:
        extra.append("--no-resume")
    if args.steps is not None:
        extra += ["--steps", str(args.steps)]
    if args.warmup is not None:
        extra += ["--warmup", str(args.warmup)]
    out = d / "out"
    t0 = time.perf_counter()
    proc = launch(cfg_path, out, nproc, extra, args.timeout)
    wall = time.perf_counter() - t0
    sys.stdout.write(proc.stdout)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-6000:])
        errs = summarize_failure(proc.stderr)
        raise OctoPipeError(
            f"run: the job failed (torchrun exit {proc.returncode}) after {wall:.1f} s: "
            + (" | ".join(errs) or "see the log above")
            + "; fix: see the worker error above"
        )
    res = json.loads((out / "result.json").read_text())
    ms = res["step_ms"][res["warmup"] :]
    if not res["losses"]:
        print(f"nothing to run: the job is at step {res['start_step']} already (--steps)")
        return 0
    print(
        f"ran {nproc} ranks in {wall:.1f} s; loss {res['losses'][-1]:.12g}; "
        f"step_ms median {sorted(ms)[len(ms) // 2] if ms else 0.0:.3f} over {len(ms)} step(s)"
    )
    print(f"outputs: {out}/result.json, trace_executed.json, train_log.jsonl")
    if args.check:
        return check(cfg, out, res, d)
    return 0


def preflight(cfg: dict[str, Any], path: Path) -> None:
    """Validate the plan and check the lowered comm order offline, before launching."""
    from octopipe_core.executor.checker import check_lowered
    from octopipe_core.executor.lowering import lowered_from_strings
    from octopipe_core.executor.mesh import config_layout
    from octopipe_core.plan import plan_from_dict, validate_plan
    from octopipe_core.profile import Profile

    try:
        plan_d = cfg["plan"]
        plan = plan_from_dict(plan_d, str(path))
        prof = Profile.from_dict(plan_d["profile"], f"{path}#profile")
        lowered = cfg["lowered"]
    except (KeyError, TypeError) as e:
        raise OctoPipeError(
            f"run: {path}: missing field {e}; fix: re-export the job with octopipe export"
        ) from None
    validate_plan(plan, prof.num_layers, src=str(path))
    check_lowered(lowered_from_strings(plan, lowered))
    config_layout(cfg)  # a bad layout is reported before anything is launched


def summarize_failure(log: str) -> list[str]:
    """The workers' own error lines and torchrun's root cause (rank, exit code / signal)."""
    lines = log.splitlines()
    errs = [ln.strip() for ln in lines if "octopipe worker: error" in ln][:4]
    if "Failures:" in log:
        rank = ""
        seen = set()
        for ln in log[log.index("Failures:") :].splitlines():
            key, _, val = ln.strip().partition(":")
            if key.strip() == "rank":
                rank = val.strip().split()[0]
            elif key.strip() == "exitcode" and rank and rank not in seen:
                seen.add(rank)
                errs.append(f"rank {rank} exited with code {val.strip()}")
    return errs


def check(cfg: dict[str, Any], out: Path, res: dict[str, Any], job: Path) -> int:
    """Compare the first step's loss and reduced gradients with the single-process reference
    on the union of every replica's batch."""
    import torch

    from octopipe_core.executor.data import config_batches
    from octopipe_core.executor.models import ModelSettings
    from octopipe_core.executor.reference import compare_grads, reference_run
    from octopipe_core.profile import Profile

    prof = Profile.from_dict(cfg["plan"]["profile"])
    st = ModelSettings.from_dict(cfg["model"])
    m = int(cfg["plan"]["num_microbatches"])
    batches = config_batches(cfg, 0, job)
    ref_loss, ref_grads = reference_run([lt.family for lt in prof.layer_costs()], st, m, batches)
    grads = torch.load(out / "grads.pt", weights_only=True)
    diff, missing = compare_grads(grads, ref_grads)
    loss = res["losses"][0]
    tol = {"float64": 1e-9, "float32": 1e-4}.get(st.dtype, 5e-2)
    print(f"reference loss {ref_loss:.12g}; loss_diff {abs(loss - ref_loss):.3e}")
    print(f"max_abs_grad_diff {diff:.3e} over {len(ref_grads)} tensors (tolerance {tol:g})")
    if missing:
        print(f"missing gradients: {missing[:5]}")
    ok = not missing and diff <= tol and abs(loss - ref_loss) <= tol
    print("check: OK" if ok else "check: MISMATCH")
    return 0 if ok else 1
