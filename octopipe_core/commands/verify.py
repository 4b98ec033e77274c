"""``octopipe verify``: run plan files and peer schedules on the executor, interleaved in
rounds, and set their measured step times against the simulator's predictions (the logic is in
``octopipe_core/verify.py`` and ``octopipe_core/executor/verify.py``)."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from octopipe_core.commands.argtypes import JOB_TIMEOUT_S, int_in
from octopipe_core.commands.common import (
    add_out_args,
    check_writable,
    print_json,
    save_plan_file,
    table,
)  # fmt: skip
from octopipe_core.commands.export import add_model_args, model_settings
from octopipe_core.errors import OctoPipeError
from octopipe_core.executor import verify as jobs
from octopipe_core.plan import load_plan
from octopipe_core.verify import (
    MAX_LOCAL_RANKS,
    Candidate,
    Runner,
    VerifyResult,
    check_budget,
    parse_peers,
    peer_candidates,
    plan_candidates,
    verify,
)  # fmt: skip

ROUNDS = int_in(1, 100)
STEPS, WARMUP, ROUNDS_DEFAULT, RUN_TIMEOUT_S = 5, 1, 3, 600.0  # per round; rounds; per run


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="measure plans and peers on the executor against their predicted step times",
        description="Export each plan file and each peer (built on the first plan's profile, "
        "devices and micro-batches) with the same model, run each --steps measured steps "
        "(after --warmup untimed ones) per round for --rounds rounds here, the order rotated "
        "each round, and print predicted vs measured step times and the measured speedups "
        "over the peers with 95 %% confidence intervals.",
    )
    p.add_argument("plans", nargs="*", metavar="PLAN.json", help="plan files (profile embedded)")
    p.add_argument(
        "--peers",
        default="",
        metavar="LIST",
        help="peers: SCHEDULE[/PARTITION],... (partition default balanced), and/or best:K "
        "(the K fastest simulated peers that fit memory)",
    )
    p.add_argument("--rounds", type=ROUNDS, default=ROUNDS_DEFAULT, help="rounds of runs")
    p.add_argument(
        "--run-timeout",
        type=JOB_TIMEOUT_S,
        default=RUN_TIMEOUT_S,
        metavar="S",
        help="wall-clock limit of each run (s)",
    )
    p.add_argument(
        "--workdir",
        metavar="DIR",
        help="keep the job folders here (new or empty; default: a temporary folder, removed)",
    )
    p.add_argument(
        "--export-only",
        action="store_true",
        help="only write the job folders and DIR/run_all.sh (for a cluster); needs --workdir",
    )
    p.add_argument(
        "--collect",
        metavar="DIR",
        help="read the results of DIR's runs (after run_all.sh) and print the table",
    )
    add_out_args(p, "PLAN.json", "save the measured best candidate's plan here")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_model_args(p)
    p.set_defaults(func=run, steps=STEPS, warmup=WARMUP, backend="gloo")


def run(args: argparse.Namespace) -> int:
    out = check_writable(args.out, args.force) if args.out else None
    if args.collect:
        if args.plans or args.peers or args.export_only or args.workdir:
            raise OctoPipeError(
                "verify --collect: takes no plans, --peers, --workdir or --export-only; fix: "
                "pass only --collect DIR (and --out, --json)"
            )
        return collect(Path(args.collect), args.json, out)
    if not args.plans:
        raise OctoPipeError("verify: PLAN.json: missing; fix: pass a plan file (or --collect DIR)")
    if args.export_only and not args.workdir:
        raise OctoPipeError("verify --export-only: needs --workdir DIR; fix: add --workdir DIR")
    if args.workdir:
        jobs.check_workdir(args.workdir)
    names, best = parse_peers(args.peers)
    model, runtime = model_settings(args)
    check_budget(len(args.plans) + len(names) + best, args.rounds, args.steps, args.warmup)
    cands = plan_candidates(args.plans)
    first = cands[0].plan
    cap = first.meta.get("memory_cap_gib")
    cands += peer_candidates(
        cands[0].profile, first.num_devices, first.num_microbatches, names, best, cap,
        int(first.meta.get("chunks", 2)),
    )  # fmt: skip
    res = measure(
        cands,
        rounds=args.rounds,
        model=model,
        runtime=runtime,
        run_timeout_s=args.run_timeout,
        workdir=args.workdir,
        export_only=args.export_only,
    )
    if res is None:
        return 0
    if out is not None:
        best_c = next(c for c in cands if c.name == res.best)
        save_plan_file(out, best_c.plan, best_c.profile)
    return report(res, args.json, out)


def collect(workdir: Path, as_json: bool, out: Path | None) -> int:
    """``--collect DIR``: the table of DIR's runs; ``--out`` saves the best job's plan."""
    res = jobs.collect(workdir)
    if out is not None:
        cands = jobs.load_manifest(workdir)["candidates"]
        job = next(c["job"] for c in cands if c["name"] == res.best)
        plan, prof = load_plan(workdir / job / "plan.json")
        if prof is None:
            raise OctoPipeError(f"{workdir / job}/plan.json: no profile; fix: re-export the jobs")
        save_plan_file(out, plan, prof)
    return report(res, as_json, out)


def measure(
    cands: Sequence[Candidate],
    *,
    rounds: int | None = None,
    model: dict[str, Any] | None = None,
    runtime: dict[str, Any] | None = None,
    run_timeout_s: float | None = None,
    workdir: str | None = None,
    export_only: bool = False,
    progress: Callable[[str], None] | None = None,
    runner: Callable[[list[Path], float, str], Runner] = jobs.LocalJobs,
) -> VerifyResult | None:
    """Export ``cands`` into ``workdir`` (default: a temporary folder, removed) and run them
    here in rounds (defaults: ``ROUNDS_DEFAULT``, ``STEPS``, ``WARMUP``, ``RUN_TIMEOUT_S``),
    each run's line to ``progress`` (default: stderr) through ``runner`` (default: the local
    launcher); with ``export_only``, stop after writing the folders (returns None)."""
    from octopipe_core.executor.export import DEFAULT_MODEL

    rounds = ROUNDS_DEFAULT if rounds is None else rounds
    run_timeout_s = RUN_TIMEOUT_S if run_timeout_s is None else run_timeout_s
    model = {**DEFAULT_MODEL, **(model or {})}
    runtime = {"steps": STEPS, "warmup": WARMUP, "timeout_s": 45,
               "backend": "gloo", **(runtime or {})}  # fmt: skip
    check_budget(len(cands), rounds, int(runtime["steps"]), int(runtime["warmup"]))
    settings = {
        "rounds": rounds,
        "steps_per_round": runtime["steps"],
        "warmup_steps_per_round": runtime["warmup"],
        "backend": runtime["backend"],
        "model": {k: v for k, v in model.items() if k not in ("input", "loss")},
        "workdir": workdir,
    }
    folder = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="octopipe-verify-"))
    try:
        paths = jobs.export_jobs(
            cands, folder, rounds=rounds, model=model, runtime=runtime, settings=settings
        )
        if export_only:
            print(
                f"exported {len(paths)} jobs to {folder}/; run them: {folder}/run_all.sh (or "
                f"`sbatch run_all.sh --slurm`), then: octopipe verify --collect {folder}"
            )
            return None
        check_local(max(jobs.job_world(p) for p in paths))
        run = runner(paths, run_timeout_s, str(runtime["backend"]))
        res = verify(cands, run, rounds=rounds, progress=progress or _stderr)
    finally:
        if not workdir:
            shutil.rmtree(folder, ignore_errors=True)
    res.settings = settings
    return res


def check_local(world: int) -> None:
    """Refuse a job of more ranks than this machine runs (``MAX_LOCAL_RANKS``)."""
    if world > MAX_LOCAL_RANKS:
        raise OctoPipeError(
            f"verify: a job of {world} ranks, over the {MAX_LOCAL_RANKS} run on one machine; "
            "fix: `octopipe verify --workdir DIR --export-only`, then DIR/run_all.sh on the cluster"
        )


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def report(res: VerifyResult, as_json: bool, out: Path | None) -> int:
    if as_json:
        print_json({**res.to_dict(), "plan": str(out) if out else None})
    else:
        print(format_result(res))
        if out is not None:
            print(f"saved the measured best ({res.best}) to {out}")
    return 0


def format_result(res: VerifyResult) -> str:
    """The table of a verification, with the notes that say how to read it."""
    header = ["candidate", "predicted_ms", "measured_median_ms", "p25-p75_ms", "error_%",
              "steps"] + [f"vs {p} (x, 95% CI)" for p in res.peers]  # fmt: skip
    rows: list[list[Any]] = []
    for r in res.rows:
        cells: list[Any] = [
            r.name + (" *" if r.name == res.best else ""),
            r.predicted_ms,
            r.measured_median_ms,
            f"{r.p25_ms:,.1f}-{r.p75_ms:,.1f}",
            f"{r.error_pct:+.1f}",
            r.steps,
        ]
        for p in res.peers:
            s = r.speedup_over.get(p)
            cells.append(f"{s.median:.3f} [{s.ci95_lo:.3f}, {s.ci95_hi:.3f}]" if s else "-")
        rows.append(cells)
    st = res.settings
    return "\n".join(
        [
            table(rows, header),
            f"* measured best: {res.best}; {st.get('rounds', '?')} rounds x "
            f"{st.get('steps_per_round', '?')} steps (after {st.get('warmup_steps_per_round', '?')}"
            " warm-up) per candidate, order rotated each round",
            f"vs PEER: the peer's measured median step / the candidate's; {res.ci_method}",
            "error_%: predicted / measured - 1 (the prediction is the profile's hardware; the "
            "runs measure this machine with the exported model)",
        ]
    )
