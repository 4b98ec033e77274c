"""``octopipe calibrate``: fit a profile to real runs of plans (``octopipe_core.calibrate``).

Each plan is exported with the model flags of ``octopipe export`` and run here for a few steps
through ``octopipe run``'s launcher (the same backend and ranks as the job), or its traces are
read with ``--trace``; the fit's figures and residuals are printed, and the calibrated
profile is written to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from octopipe_core.calibrate import Fit, Record, RunData, TailRecord, fit_profile
from octopipe_core.commands.argtypes import COUNT, int_in
from octopipe_core.commands.common import check_writable, plan_with_profile, print_json, write_text
from octopipe_core.commands.export import add_model_args, model_settings
from octopipe_core.errors import OctoPipeError
from octopipe_core.plan import Plan
from octopipe_core.profile import Profile

MAX_PLANS = 8
MAX_STEPS = 200
MAX_DP = 16


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate",
        help="fit a profile to real runs of plans (per-op fixed costs, layer times, latency)",
        description="Run each plan for a few steps on the executor (export's model flags; "
        "one process per rank, as `octopipe run`), or read traces it recorded (--trace), and "
        "fit the profile to the ops measured: layer times per type and kind, a fixed cost per "
        "op, p2p latency and the step's tail. With one plan, a second one with another "
        "partition is added, so that layer costs can be told apart.",
    )
    p.add_argument("plans", nargs="*", metavar="PLAN.json")
    p.add_argument("--out", required=True, metavar="PROFILE.json", help="calibrated profile")
    p.add_argument("--force", action="store_true", help="overwrite an existing --out")
    p.add_argument(
        "--trace",
        action="append",
        default=[],
        metavar="FILE",
        help="fit from a trace_executed.json already recorded (repeat; pairs with the plans in "
        "order, else the job folder's executor_config.json is read)",
    )
    p.add_argument("--profile", metavar="FILE", help="profile, if the plan has none embedded")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--rounds",
        type=int_in(1, 10),
        default=2,
        help="runs of each plan, interleaved (each --steps steps after --warmup)",
    )
    p.add_argument(
        "--dp",
        type=COUNT,
        default=1,
        help="data-parallel replicas of the runs (the step's tail is fitted at this DP)",
    )
    add_model_args(p)
    p.set_defaults(func=run, steps=10, warmup=2)


def run(args: argparse.Namespace) -> int:
    out = check_writable(args.out, args.force)  # before any work
    if not args.plans and not args.trace:
        raise OctoPipeError("calibrate: nothing to fit; fix: give PLAN.json files or --trace")
    if len(args.plans) > MAX_PLANS or len(args.trace) > MAX_PLANS:
        raise OctoPipeError(f"calibrate: at most {MAX_PLANS} plans or traces; fix: give fewer")
    if args.steps * args.rounds > MAX_STEPS:
        raise OctoPipeError(
            f"calibrate: --steps {args.steps} x --rounds {args.rounds} is over {MAX_STEPS} "
            "steps a plan; fix: 2 rounds of 10 steps fit well"
        )
    if args.dp > MAX_DP:
        raise OctoPipeError(
            f"calibrate: --dp {args.dp} is over {MAX_DP} replicas on this machine; fix: calibrate "
            "at a smaller DP, or record traces where the job runs and pass --trace"
        )
    if args.trace:
        runs, prior, meta = _from_traces(args)
    else:
        runs, prior, meta = _from_runs(args)
    fit = fit_profile(prior, runs, meta)
    write_text(out, json.dumps(fit.profile.to_dict(), indent=1) + "\n")
    if args.json:
        print_json(_summary(fit, out))
        return 0
    for line in fit.report():
        print(line)
    print(f"wrote {out} (simulate and tune with --profile {out})")
    return 0


def _summary(fit: Fit, out: Path) -> dict[str, Any]:
    rt = fit.profile.runtime.to_dict()
    return {
        "out": str(out),
        "runtime": rt,
        "p2p_latency_us": fit.profile.device.p2p_latency_us,
        "p2p_gbps": fit.profile.device.p2p_gbps,
        "residuals": fit.residuals(),
        "step_error_pct": fit.step_error_pct(),
        "measured_median_ms": {r.name: statistics.median(r.step_ms()) for r in fit.runs},
    }


def _say(msg: str) -> None:
    print(f"calibrate: {msg}", file=sys.stderr, flush=True)


FINE_STAGES = 64  # the most stages the added calibration plan has


def second_plan(plan: Plan, profile: Profile) -> tuple[str, Plan]:
    """A plan to calibrate beside ``plan`` (same devices and micro-batches): interleaved 1F1B
    in as many chunks as the layers allow (up to ``FINE_STAGES`` stages), so that most stages
    hold one layer. Such stages time each layer type on its own, inside the pipeline, and
    tell a fixed cost per op from a layer's time (a one-layer stage pays it once per layer)."""
    from octopipe_core.schedules import build_plan

    p = plan.num_devices
    chunks = max(2, min(profile.num_layers, FINE_STAGES) // p)
    if chunks * p <= profile.num_layers:
        fine = build_plan(profile, "interleaved", p, plan.num_microbatches, chunks=chunks)
        if fine.partition != plan.partition:
            return f"interleaved-x{chunks}/uniform", fine
    for sched, part in (("1f1b", "uniform"), ("1f1b", "balanced")):
        other = build_plan(profile, sched, p, plan.num_microbatches, partition=part)
        if other.partition != plan.partition:
            return f"{sched}/{part}", other
    raise OctoPipeError(
        "calibrate: no peer plan has another partition; fix: give two plans with different "
        "partitions"
    )


def _from_runs(args: argparse.Namespace) -> tuple[list[RunData], Profile, dict[str, Any]]:
    from octopipe_core.commands.run import launch
    from octopipe_core.executor.export import export_job
    from octopipe_core.executor.mesh import config_layout

    named: list[tuple[str, Plan]] = []
    prior: Profile | None = None
    for path in args.plans:
        plan, prof = plan_with_profile(path, args.profile)
        if prior is not None and prof.layers != prior.layers:
            raise OctoPipeError(
                f"calibrate: {path}: another model than {args.plans[0]}; fix: calibrate plans "
                "of one model"
            )
        prior = prior or prof
        named.append((Path(path).name, plan))
    assert prior is not None
    if len({tuple(p.partition) for _, p in named}) < 2:
        named.append(second_plan(named[0][1], prior))
        _say(f"added {named[-1][0]} (another partition, so that layer costs can be told apart)")
    model, runtime = model_settings(args)
    runtime.update(steps=args.steps, warmup=args.warmup)
    backend = args.backend if args.backend != "auto" else "gloo"
    per_plan: list[list[RunData]] = [[] for _ in named]
    with tempfile.TemporaryDirectory(prefix="octopipe-calibrate-") as td:
        jobs = [
            export_job(
                plan, prior, Path(td) / f"job-{i}", model=model, runtime=runtime,
                layout={"dp": args.dp},
            )
            for i, (_, plan) in enumerate(named)
        ]  # fmt: skip
        world = config_layout(json.loads((jobs[0] / "executor_config.json").read_text())).world
        pin = {"OCTOPIPE_PIN": "1"} if world <= (os.cpu_count() or 1) else {}
        for r in range(args.rounds):  # interleaved, so that drift hits every plan alike
            for i in [(r + j) % len(named) for j in range(len(named))]:
                name, plan = named[i]
                _say(
                    f"round {r + 1}/{args.rounds}: running {name} ({world} ranks, "
                    f"{args.warmup} warm-up + {args.steps} steps)"
                )
                out = jobs[i] / "out" / f"round-{r + 1}"
                proc = launch(
                    jobs[i] / "executor_config.json", out, world, ["--no-resume"],
                    args.timeout * 4 + 120, env=pin, backend=backend,
                )  # fmt: skip
                if proc.returncode != 0:
                    raise OctoPipeError(
                        f"calibrate: the run of {name} failed (exit {proc.returncode}): "
                        f"{proc.stderr.strip().splitlines()[-1:] or ['no output']}; fix: check "
                        f"that `octopipe export {name} --out JOB && octopipe run JOB` works"
                    )
                res = json.loads((out / "result.json").read_text())
                per_plan[i].append(run_from_result(name, plan, res))
                med = statistics.median(per_plan[i][-1].step_ms())
                _say(f"    {name}: step median {med:.3f} ms")
    runs = [merge_runs(rs) for rs in per_plan]
    meta = {
        "from": "runs",
        "plans": [n for n, _ in named],
        "backend": args.backend,
        "steps": args.steps,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "ranks": world,
        "dp": args.dp,
        "model": {k: v for k, v in model.items() if v not in ("", None)},
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "prior": prior.name,
    }
    return runs, _as_executed(prior, model), meta


def _job_config_of(trace: Path) -> Path | None:
    """The ``executor_config.json`` of the job a trace came from: ``JOB/out/`` (``octopipe
    run``) or ``JOB/out/round-R/`` (``octopipe verify``)."""
    for up in trace.resolve().parents[1:3]:
        if (up / "executor_config.json").is_file():
            return up / "executor_config.json"
    return None


def _as_executed(prior: Profile, model: dict[str, Any]) -> Profile:
    """The prior named and sized for the model that ran (tokens per micro-batch)."""
    from dataclasses import replace

    tokens = int(model["seq"]) * int(model["microbatch_size"])
    return replace(prior, name=f"{prior.name} (calibrated)", tokens_per_microbatch=tokens)


def merge_runs(runs: list[RunData]) -> RunData:
    """One ``RunData`` of several runs of one plan (their steps numbered apart)."""
    if len(runs) == 1:
        return runs[0]
    records: list[Record] = []
    tail: list[TailRecord] = []
    steps: dict[int, tuple[float, float]] = {}
    for k, r in enumerate(runs):
        off = k * STEP_OFFSET
        records += [(a, st + off, op, s, e, w) for a, st, op, s, e, w in r.records]
        tail += [(a, st + off, n, s, e) for a, st, n, s, e in r.tail]
        steps |= {st + off: v for st, v in r.steps.items()}
    first = runs[0]
    return RunData(first.name, first.plan, records, tail, steps, first.device_of)


STEP_OFFSET = 10**7  # step numbers of merged runs: run k's step i is k * STEP_OFFSET + i


def run_from_result(name: str, plan: Plan, res: dict[str, Any]) -> RunData:
    """A ``RunData`` from ``octopipe run``'s ``result.json`` (warm-up steps left out)."""
    from octopipe_core.executor.mesh import JobLayout

    lay = JobLayout.from_dict(res.get("layout"), plan.num_devices, "result.json")
    start, warm = int(res.get("start_step", 0)), int(res["warmup"])
    steps = {
        start + i: (s, s + ms / 1e3)
        for i, (s, ms) in enumerate(zip(res["step_starts"], res["step_ms"], strict=True))
        if i >= warm
    }
    return RunData(
        name,
        plan,
        [tuple(r) for r in res["records"]],  # type: ignore[misc]
        [tuple(t) for t in res["tail"]],  # type: ignore[misc]
        steps,
        {r: lay.coords(r) for r in range(lay.world)},
    )


def _from_traces(args: argparse.Namespace) -> tuple[list[RunData], Profile, dict[str, Any]]:
    from octopipe_core.executor.job_config import load_job_config
    from octopipe_core.executor.trace_read import load_executed_trace

    if args.plans and len(args.plans) != len(args.trace):
        raise OctoPipeError(
            f"calibrate: {len(args.plans)} plans for {len(args.trace)} traces; fix: give one plan "
            "per --trace, in order, or none (each trace's job folder is read)"
        )
    runs: list[RunData] = []
    prior: Profile | None = None
    warmups = []
    model: dict[str, Any] = {}
    for i, tpath in enumerate(args.trace):
        trace = load_executed_trace(tpath)
        cfg_path = _job_config_of(Path(tpath))
        cfg = load_job_config(cfg_path) if cfg_path is not None else {}
        warm = int(cfg.get("runtime", {}).get("warmup", 1))  # no job folder: skip one step
        if args.plans:
            plan, prof = plan_with_profile(args.plans[i], args.profile)
            name = Path(args.plans[i]).name
        elif cfg_path is not None:
            from octopipe_core.executor.runtime import config_parts

            plan, prof, _, _ = config_parts(cfg)
            name = cfg_path.parent.name
        else:
            raise OctoPipeError(
                f"calibrate: --trace {tpath}: no executor_config.json in the job folder above "
                "it; fix: give the plan of each trace as PLAN.json, in order"
            )
        model = cfg.get("model", model)
        prior = prior or prof
        first = min(trace.step_spans, default=0)
        steps = {k: v for k, v in trace.step_spans.items() if k >= first + warm}
        device_of = {r: trace.device_of(r) for r in {rec[0] for rec in trace.records}}
        runs.append(RunData(name, plan, trace.records, trace.tail, steps, device_of))
        warmups.append(warm)
    # several traces of one plan (rounds of it): one run, their steps numbered apart
    by_name: dict[str, list[RunData]] = {}
    for r in runs:
        same = by_name.setdefault(r.name, [])
        if same and same[0].plan.to_dict() != r.plan.to_dict():
            raise OctoPipeError(
                f"calibrate: two different plans are named {r.name}; fix: give each plan a "
                "file name of its own"
            )
        same.append(r)
    runs = [merge_runs(rs) for rs in by_name.values()]
    assert prior is not None
    meta = {
        "from": "traces",
        "plans": [r.name for r in runs],
        "traces": [Path(t).name for t in args.trace],
        "steps": [len(r.steps) for r in runs],
        "warmup": warmups,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "prior": prior.name,
    }
    if "seq" in model and "microbatch_size" in model:
        return runs, _as_executed(prior, model), meta
    from dataclasses import replace

    return runs, replace(prior, name=f"{prior.name} (calibrated)"), meta
