"""``octopipe run``: launch an exported job on this machine (gloo, CPU), all its pp x dp
ranks on one node (``executor.local_launch``: one process per rank, as under torchrun);
``--check`` compares the first step with a single-process reference on the union of every
replica's batch."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from octopipe_core.commands.argtypes import JOB_TIMEOUT_S, STEPS, WARMUP
from octopipe_core.errors import OctoPipeError
from octopipe_core.executor.ckpt_trust import CHECKPOINT_DIR_ENV, TRUST_ENV
from octopipe_core.executor.job_config import load_job_config
from octopipe_core.executor.local_launch import DIE_WITH_PARENT_ENV
from octopipe_core.executor.trust import confirm_user_code


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run an exported job locally (one process per rank, gloo, CPU)",
        description="Launch DIR/executor_config.json on this machine, one process per rank "
        "(pipeline devices x DP replicas). --steps N trains up to step N (resuming from the "
        "latest checkpoint in the job folder, if any). With --check, also run the "
        "single-process reference and compare the first step's loss and gradients.",
    )
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--check", action="store_true", help="compare with a 1-process reference")
    p.add_argument("--steps", type=STEPS, default=None, help="train up to this step")
    p.add_argument("--warmup", type=WARMUP, default=None, help="extra steps, not timed")
    p.add_argument("--no-resume", action="store_true", help="ignore the job's checkpoints")
    p.add_argument(
        "--timeout",
        type=JOB_TIMEOUT_S,
        default=600,
        help="wall-clock limit of the job (s)",
    )
    p.add_argument("--backend", choices=("gloo", "nccl", "auto"), default="gloo")
    p.add_argument(
        "--trust",
        action="store_true",
        help="run a job not exported on this machine that imports your code, or resume from "
        "a checkpoint no job on this machine wrote (see README)",
    )
    p.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="keep this run's checkpoints in DIR (default: the config's folder inside the job)",
    )
    p.add_argument(
        "--import-cwd",
        action="store_true",
        help="let workers import modules from the current directory (off by default)",
    )
    p.set_defaults(func=run)


def worker_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a job's processes: one compute thread unless set, this
    checkout importable first, then ``env``."""
    e = dict(os.environ)
    e.setdefault("OMP_NUM_THREADS", "1")
    root = str(Path(__file__).resolve().parents[2])
    e["PYTHONPATH"] = root + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.update(env or {})
    return e


def launch(
    cfg_path: Path,
    out: Path,
    nproc: int,
    extra: list[str],
    timeout: float,
    env: dict[str, str] | None = None,
    backend: str = "gloo",
) -> subprocess.CompletedProcess[str]:
    """Run the worker on ``cfg_path`` in ``nproc`` local ranks on ``backend``, with the worker
    arguments ``extra`` (``executor.local_launch``: forked from one interpreter with gloo, a
    fresh interpreter per rank otherwise)."""
    cmd = [
        sys.executable,
        "-m",
        "octopipe_core.executor.local_launch",
        f"--nproc={nproc}",
        *([] if backend == "gloo" else ["--exec"]),
        "--",
        str(cfg_path),
        "--out",
        str(out),
        "--backend",
        backend,
        *extra,
    ]
    return run_process_group(cmd, worker_env(env), timeout)


def end_process_group(proc: subprocess.Popen[Any]) -> None:
    """End ``proc`` and every process it started in its new session (SIGTERM, then SIGKILL
    to whatever is left); return once none is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:  # the launcher is gone; its workers may not be
            time.sleep(0.2)


class Stopped(Exception):
    """This process got SIGTERM or SIGHUP while a job ran (the job has been ended)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum: int, _frame: object) -> None:
    raise Stopped(signum)


def run_process_group(
    cmd: list[str], env: dict[str, str], timeout: float, cwd: str | Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` (in ``cwd``) in its own session with its output in files (not pipes, so a
    dead agent whose workers live on cannot block the read). On a timeout, Ctrl-C, SIGTERM or
    SIGHUP to this process, or once the agent has exited, every process of the session is
    ended: nothing is left running (``Stopped`` is raised for a signal). If this process dies
    without a word (SIGKILL), the launcher gets SIGTERM from the kernel and ends its ranks
    (``executor.local_launch``: ``OCTOPIPE_DIE_WITH_PARENT``)."""
    main_thread = threading.current_thread() is threading.main_thread()
    old = {}
    if main_thread:  # signal handlers only exist there
        for sig in (signal.SIGTERM, signal.SIGHUP):
            old[sig] = signal.signal(sig, _stop)
    env = {**env, DIE_WITH_PARENT_ENV: "1"}
    try:
        with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f:
            proc = subprocess.Popen(
                cmd, env=env, cwd=cwd, stdout=out_f, stderr=err_f, start_new_session=True
            )
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                end_process_group(proc)
                raise OctoPipeError(
                    f"run: the job did not finish within {timeout:.0f} s and was stopped "
                    "(every rank ended); fix: raise --timeout or check the worker logs"
                ) from None
            except (KeyboardInterrupt, Stopped):
                end_process_group(proc)
                raise
            finally:
                end_process_group(proc)
            out_f.seek(0)
            err_f.seek(0)
            stdout = out_f.read().decode("utf-8", "replace")
            stderr = err_f.read().decode("utf-8", "replace")
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def run(args: argparse.Namespace) -> int:
    d = Path(args.dir)
    cfg_path = d / "executor_config.json"
    if not cfg_path.is_file():
        raise OctoPipeError(
            f"run: {cfg_path}: file not found; fix: export a job first (octopipe export "
            "PLAN.json --out DIR)"
        )
    cfg = load_job_config(cfg_path)
    confirm_user_code(cfg, d, args.trust)
    preflight(cfg, cfg_path)
    from octopipe_core.executor.mesh import config_layout
    from octopipe_core.executor.runtime import pick_backend

    nproc = config_layout(cfg).world
    backend = pick_backend(args.backend, nproc)  # NCCL without a GPU per rank: one line
    ck_dir = checkpoint_dir(cfg, d, args.checkpoint_dir)  # inside the job, or the user's
    resume = not (args.no_resume or args.check)
    start = resume_step(cfg, d, ck_dir, args.trust) if resume else None
    if start is not None:
        rt = cfg.get("runtime", {})
        steps = args.steps if args.steps is not None else int(rt.get("steps", 1))
        warmup = args.warmup if args.warmup is not None else int(rt.get("warmup", 0))
        if start >= steps + warmup:  # answered here, without launching a single rank
            print(f"nothing to run: the job is at step {start} already (--steps)")
            return 0
    extra: list[str] = []
    if args.check:
        extra.append("--grads")
    if args.no_resume or args.check:
        extra.append("--no-resume")
    if args.steps is not None:
        extra += ["--steps", str(args.steps)]
    if args.warmup is not None:
        extra += ["--warmup", str(args.warmup)]
    from octopipe_core.executor import checkpoint as ckpt

    theirs = ckpt.foreign_steps(ck_dir, d, start or 0)
    if theirs:
        raise OctoPipeError(
            f"run: {theirs[0]} (and {len(theirs) - 1} more) was not written by this job, and "
            "a checkpoint of this run could overwrite it; fix: move it away, or name another "
            "folder with --checkpoint-dir DIR"
        )
    out = d / "out"
    t0 = time.perf_counter()
    env = {"OCTOPIPE_IMPORT_CWD": "1"} if args.import_cwd else {}
    if args.checkpoint_dir:
        env[CHECKPOINT_DIR_ENV] = str(ck_dir.resolve())
    if args.trust:
        env[TRUST_ENV] = "1"
    proc = launch(cfg_path, out, nproc, extra, args.timeout, env or None, args.backend)
    wall = time.perf_counter() - t0
    sys.stdout.write(proc.stdout)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-6000:])
        errs = summarize_failure(proc.stderr)
        raise OctoPipeError(
            f"run: the job failed (launcher exit {proc.returncode}) after {wall:.1f} s: "
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
    peaks = [g for g in res.get("peak_memory_gib", []) if g is not None]
    if peaks:
        print(f"peak_memory_gib (CUDA allocator, largest rank) {max(peaks):.3f}")
    print(f"outputs: {out}/result.json, trace_executed.json, train_log.jsonl")
    if args.check:
        return check(cfg, out, res, d, "cuda" if backend == "nccl" else "cpu")
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
    model = cfg.get("model") or {}
    if not model.get("factory"):  # the stand-in layers: what every rank here would hold
        from octopipe_core.executor.models import check_memory

        families = [lt.family for lt in prof.layer_costs()]
        check_memory(
            families, int(model.get("hidden", 16)), int(model.get("seq", 8)),
            int(model.get("vocab", 64)), int(model.get("microbatch_size", 2)),
            str(model.get("dtype", "float64")), config_layout(cfg).dp, f"run: {path}",
        )  # fmt: skip
    config_layout(cfg)  # a bad layout is reported before anything is launched


def checkpoint_dir(cfg: dict[str, Any], job: Path, override: str | None) -> Path:
    """Where the job keeps its checkpoints: ``override`` (``--checkpoint-dir``, checked to be
    a folder it can write) or the config's folder, which must lie inside the job."""
    from octopipe_core.executor.settings import CheckpointSettings

    cks = CheckpointSettings.from_dict(cfg.get("checkpoint"))
    path = cks.path(job, override)
    if override:
        p = Path(override)
        parent = p if p.exists() else next(a for a in p.absolute().parents if a.exists())
        if (p.exists() and not p.is_dir()) or not os.access(parent, os.W_OK | os.X_OK):
            raise OctoPipeError(
                f"run: --checkpoint-dir {p}: not a folder this user can write; fix: name "
                "another folder"
            )
    return path


def resume_step(
    cfg: dict[str, Any], job: Path, ck_dir: Path | None = None, trust: bool = False
) -> int | None:
    """The step the job would resume from (its latest checkpoint), or None; a checkpoint of
    another layout or partition, or one no job on this machine wrote (loading it would run
    code from it) without ``trust``, is refused here, before anything is launched."""
    from octopipe_core.executor import checkpoint as ckpt
    from octopipe_core.executor.mesh import config_layout
    from octopipe_core.executor.settings import CheckpointSettings

    cks = CheckpointSettings.from_dict(cfg.get("checkpoint"))
    if not cks.resume:
        return None
    found = ckpt.latest(ck_dir if ck_dir is not None else cks.path(job))
    if found is None:
        return None
    if not trust:
        ckpt.check_trusted(found)
    part = [(int(a), int(b)) for a, b in cfg["plan"]["partition"]]
    return ckpt.saved_step(found, ckpt.job_meta(config_layout(cfg).to_dict(), part))


def summarize_failure(log: str) -> list[str]:
    """The workers' own error lines, then the launcher's (which rank ended how).

    >>> summarize_failure("octopipe launch: rank 1 exited with code -9 (SIGKILL)")
    ['rank 1 exited with code -9 (SIGKILL)']
    """
    lines = [ln.strip() for ln in log.splitlines()]
    errs = [ln for ln in lines if "octopipe worker: error" in ln][:4]
    return errs + [
        ln.removeprefix("octopipe launch: ") for ln in lines if ln.startswith("octopipe launch: ")
    ]


def check(
    cfg: dict[str, Any], out: Path, res: dict[str, Any], job: Path, device: str = "cpu"
) -> int:
    """Compare the first step's loss and reduced gradients with the single-process reference
    on the union of every replica's batch, computed on ``device`` (the job's device type)."""
    import torch

    from octopipe_core.executor.models import ModelSettings
    from octopipe_core.executor.reference import check_against_reference
    from octopipe_core.profile import Profile

    fams = [lt.family for lt in Profile.from_dict(cfg["plan"]["profile"]).layer_costs()]
    grads = torch.load(out / "grads.pt", weights_only=True)
    ref_loss, loss_diff, diff, missing = check_against_reference(
        cfg, fams, res["losses"][0], grads, job, torch.device(device)
    )
    dtype = ModelSettings.from_dict(cfg["model"]).dtype
    tol = {"float64": 1e-9, "float32": 1e-4}.get(dtype, 5e-2)
    print(f"reference loss {ref_loss:.12g}; loss_diff {loss_diff:.3e}")
    print(f"max_abs_grad_diff {diff:.3e} over {len(grads)} tensors (tolerance {tol:g})")
    if missing:
        print(f"missing gradients: {missing[:5]}")
    ok = not missing and diff <= tol and loss_diff <= tol
    print("check: OK" if ok else "check: MISMATCH")
    return 0 if ok else 1
