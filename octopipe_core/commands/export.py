"""``octopipe export``: write a self-contained job folder for a plan (torchrun, SLURM, torch
CSV): model, pp x dp layout, data, optimizer and checkpoint settings."""

from __future__ import annotations

import argparse
from typing import Any

from octopipe_core.commands.argtypes import (
    COUNT,
    NONNEG,
    PEER_TIMEOUT_S,
    SEED,
    STEPS,
    STEPS0,
    WARMUP,
    float_in,
    int_in,
)  # fmt: skip
from octopipe_core.commands.common import plan_with_profile
from octopipe_core.errors import OctoPipeError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write a runnable training job folder for a plan",
        description="Write executor config, launch.sh (torchrun), slurm.sbatch, PyTorch "
        "schedule CSV + side-car, and a Chrome trace of the simulated timeline into --out.",
    )
    p.add_argument("plan", metavar="PLAN.json")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--force", action="store_true", help="write into a non-empty DIR")
    p.add_argument("--profile", metavar="FILE", help="profile, if the plan has none embedded")
    add_model_args(p)
    add_training_args(p)
    p.set_defaults(func=run)


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model of the executed job (CPU-small by default)")
    g.add_argument("--hidden", type=int_in(1, 65_536), default=16)
    g.add_argument("--seq", type=int_in(1, 1_048_576), default=8)
    g.add_argument("--vocab", type=int_in(1, 10_000_000), default=64)
    g.add_argument("--microbatch-size", type=int_in(1, 65_536), default=2)
    g.add_argument("--dtype", choices=("float64", "float32", "bfloat16"), default="float64")
    g.add_argument("--seed", type=SEED, default=0)
    g.add_argument(
        "--model",
        default="",
        metavar="MODULE:FUNCTION",
        help="your own model: a factory returning the layers in profile order",
    )
    g.add_argument("--steps", type=STEPS, default=1, help="training steps (the step to stop at)")
    g.add_argument("--warmup", type=WARMUP, default=0, help="extra steps before the timed ones")
    g.add_argument(
        "--timeout",
        type=PEER_TIMEOUT_S,
        default=45,
        help="seconds a rank waits for a peer before failing",
    )
    g.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")


def add_training_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("layout, data, optimizer and checkpoints")
    g.add_argument(
        "--dp", type=COUNT, default=None, help="data-parallel replicas (default: the plan's layout)"
    )
    g.add_argument("--zero1", action="store_true", default=None, help="shard optimizer state")
    g.add_argument("--order", choices=("tp-dp-pp", "tp-pp-dp"), default=None, help="rank order")
    g.add_argument("--nnodes", type=COUNT, default=None, help="nodes in launch.sh / slurm.sbatch")
    g.add_argument(
        "--data",
        default="",
        metavar="FILE",
        help="flat binary token file (uint16 ids as nanoGPT's train.bin); default: synthetic",
    )
    g.add_argument("--token-dtype", choices=("uint16", "uint32"), default="uint16")
    g.add_argument(
        "--data-hook", default="", metavar="MODULE:FUNCTION", help="your own batches per step"
    )
    g.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    g.add_argument("--lr", type=float_in(0, 10, lo_open=True), default=1e-3)
    g.add_argument(
        "--min-lr", type=float_in(0, 10), default=1e-4, help="end of the cosine schedule"
    )
    g.add_argument("--lr-warmup-steps", type=STEPS0, default=0)
    g.add_argument("--weight-decay", type=float_in(0, 10), default=0.01)
    g.add_argument("--clip", type=NONNEG, default=1.0, help="max gradient norm (0: off)")
    g.add_argument("--checkpoint-every", type=STEPS0, default=0, metavar="N", help="0: on request")
    g.add_argument("--checkpoint-dir", default="checkpoints", help="relative to the job folder")


def model_settings(args: argparse.Namespace) -> tuple[dict[str, object], dict[str, object]]:
    for k in ("hidden", "seq", "vocab", "microbatch_size", "steps"):
        if getattr(args, k) < 1:
            raise OctoPipeError(f"export: --{k.replace('_', '-')}: must be >= 1; fix: use 1+")
    if args.model:
        check_factory(args.model)
    model = {
        "hidden": args.hidden,
        "seq": args.seq,
        "vocab": args.vocab,
        "microbatch_size": args.microbatch_size,
        "dtype": args.dtype,
        "seed": args.seed,
        "factory": args.model,
    }
    runtime = {
        "steps": args.steps,
        "warmup": args.warmup,
        "timeout_s": args.timeout,
        "backend": args.backend,
    }
    return model, runtime


def training_settings(args: argparse.Namespace) -> dict[str, Any]:
    """``layout``, ``data``, ``train`` and ``checkpoint`` keyword arguments of ``export_job``."""
    if args.data and args.data_hook:
        raise OctoPipeError("export: --data and --data-hook: pick one; fix: drop one of them")
    if args.dp is not None and args.dp < 1:
        raise OctoPipeError("export: --dp: must be >= 1; fix: use 1+")
    if args.data:
        data = {"kind": "tokens", "path": args.data, "token_dtype": args.token_dtype}
    elif args.data_hook:
        check_factory(args.data_hook, "--data-hook")
        data = {"kind": "hook", "hook": args.data_hook}
    else:
        data = {"kind": "synthetic"}
    train = {
        "optimizer": args.optimizer,
        "lr": args.lr,
        "min_lr": min(args.min_lr, args.lr),
        "warmup_steps": args.lr_warmup_steps,
        "weight_decay": args.weight_decay,
        "clip": args.clip,
    }
    return {
        "layout": {"dp": args.dp, "zero1": args.zero1, "order": args.order},
        "data": data,
        "train": train,
        "checkpoint": {"every": args.checkpoint_every, "dir": args.checkpoint_dir},
        "nnodes": args.nnodes,
    }


def check_factory(spec: str, flag: str = "--model") -> None:
    """Fail early (at export) on a malformed or unimportable ``module:function``."""
    import importlib.util

    mod, _, fn = spec.partition(":")
    if not mod or not fn or not fn.isidentifier():
        raise OctoPipeError(f"export: {flag} {spec!r}: expected module:function; fix: e.g. m:build")
    try:
        found = importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise OctoPipeError(
            f"export: {flag} {spec!r}: module {mod!r} not found; fix: check PYTHONPATH "
            "(the job's workers need it too)"
        )


def check_token_data(data: dict[str, Any], model: dict[str, Any], dp: int) -> str:
    """Validate a token file that exists here; a note when it does not (it may exist only
    where the job runs)."""
    if data.get("kind") != "tokens":
        return ""
    from pathlib import Path

    from octopipe_core.executor.data import check_token_file

    if not Path(data["path"]).is_file():
        return f"note: token file {data['path']} is not here; it must exist where the job runs"
    n = check_token_file(
        data["path"], data["token_dtype"], int(model["vocab"]), int(model["seq"]), dp
    )
    return f"token file {data['path']}: {n:,} tokens ({data['token_dtype']})"


def run(args: argparse.Namespace) -> int:
    from octopipe_core.executor.export import export_job, job_layout

    plan, prof = plan_with_profile(args.plan, args.profile)
    model, runtime = model_settings(args)
    extra = training_settings(args)
    lay = job_layout(plan, prof, extra["layout"])
    note = check_token_data(extra["data"], model, int(lay["dp"]))
    out = export_job(plan, prof, args.out, force=args.force, model=model, runtime=runtime, **extra)
    world = int(lay["pp"]) * int(lay["dp"])
    print(
        f"exported {plan.name or 'plan'} ({plan.num_stages} stages; PP{lay['pp']} x DP{lay['dp']}"
        f"{' zero1' if lay['zero1'] else ''} = {world} ranks) to {out}/"
    )
    dep = prof.deployment or plan.deployment
    if dep is not None and dep.layout.tp > 1:
        print(f"  note: TP{dep.layout.tp} of the layout is not executed: one rank per device")
    if note:
        print(f"  {note}")
    for f in sorted(p.name for p in out.iterdir()):
        print(f"  {f}")
    print(f"run it: octopipe run {out} --check   (or {out}/launch.sh, or sbatch slurm.sbatch)")
    return 0
