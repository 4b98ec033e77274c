"""``octopipe export``: write a self-contained job folder for a plan (torchrun, torch CSV)."""

from __future__ import annotations

import argparse

from octopipe_core.commands.common import plan_with_profile
from octopipe_core.errors import OctoPipeError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write a runnable job folder for a plan",
        description="Write executor config, launch.sh (torchrun), PyTorch schedule CSV + "
        "side-car, and a Chrome trace of the simulated timeline into --out.",
    )
    p.add_argument("plan", metavar="PLAN.json")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--force", action="store_true", help="write into a non-empty DIR")
    p.add_argument("--profile", metavar="FILE", help="profile, if the plan has none embedded")
    add_model_args(p)
    p.set_defaults(func=run)


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and data of the executed job (CPU-small by default)")
    g.add_argument("--hidden", type=int, default=16)
    g.add_argument("--seq", type=int, default=8)
    g.add_argument("--vocab", type=int, default=64)
    g.add_argument("--microbatch-size", type=int, default=2)
    g.add_argument("--dtype", choices=("float64", "float32", "bfloat16"), default="float64")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument(
        "--model",
        default="",
        metavar="MODULE:FUNCTION",
        help="your own model: a factory returning the layers in profile order",
    )
    g.add_argument("--steps", type=int, default=1, help="training steps per run")
    g.add_argument("--warmup", type=int, default=0, help="extra steps before the measured ones")
    g.add_argument(
        "--timeout", type=float, default=45, help="seconds a rank waits for a peer before failing"
    )
    g.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")


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


def check_factory(spec: str) -> None:
    """Fail early (at export) on a malformed or unimportable ``module:function``."""
    import importlib.util

    mod, _, fn = spec.partition(":")
    if not mod or not fn or not fn.isidentifier():
        raise OctoPipeError(
            f"export: --model {spec!r}: expected module:function; fix: e.g. m:build"
        )
    try:
        found = importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise OctoPipeError(
            f"export: --model {spec!r}: module {mod!r} not found; fix: check PYTHONPATH "
            "(the job's workers need it too)"
        )


def run(args: argparse.Namespace) -> int:
    from octopipe_core.executor.export import export_job

    plan, prof = plan_with_profile(args.plan, args.profile)
    model, runtime = model_settings(args)
    out = export_job(plan, prof, args.out, force=args.force, model=model, runtime=runtime)
    print(
        f"exported {plan.name or 'plan'} ({plan.num_devices} ranks, {plan.num_stages} stages) "
        f"to {out}/"
    )
    for f in (
        "executor_config.json",
        "launch.sh",
        "schedule.csv",
        "schedule.json",
        "trace_simulated.json",
        "plan.json",
    ):
        print(f"  {f}")
    print(f"run it: octopipe run {out} --check   (or {out}/launch.sh)")
    return 0
