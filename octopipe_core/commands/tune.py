"""``octopipe tune``: co-optimize partition, placement and schedule, starting from the best peer.

Progress lines go to stderr while the search runs; the result goes to stdout (a summary, or one
JSON object with ``--json``). ``--out PLAN.json`` saves the plan with its profile embedded and
the memory cap in ``meta``, so ``octopipe simulate --plan PLAN.json`` reproduces its step time.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from octopipe_core.commands.argtypes import (
    DEVICES,
    MEMORY_GIB,
    MICROBATCHES,
    SEED,
    TIME_BUDGET_S,
    int_in,
)  # fmt: skip
from octopipe_core.commands.cluster_args import add_cluster_args, apply_cluster
from octopipe_core.commands.common import (
    add_out_args,
    add_profile_arg,
    check_writable,
    print_json,
    resolve_profile,
    table,
)  # fmt: skip
from octopipe_core.dp_order import order_w_for_dp
from octopipe_core.limits import check_size, check_tune_layers
from octopipe_core.plan import save_plan
from octopipe_core.profile import Profile
from octopipe_core.tuner import TuneProgress, TuneResult, tune
from octopipe_core.verify import MAX_CANDIDATES, VerifyResult


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune",
        help="search partition, placement and schedule together",
        description="Tune a pipeline plan with the bubble-aware iterative tuner. Exit code 0: "
        "the plan fits the memory cap; 3: no plan found fits it (the report says by how much).",
    )
    add_profile_arg(p)
    p.add_argument("--devices", type=DEVICES, required=True, metavar="D")
    p.add_argument("--microbatches", type=MICROBATCHES, required=True, metavar="M")
    p.add_argument(
        "--memory-gib",
        type=MEMORY_GIB,
        default=None,
        metavar="X",
        help="memory cap per device in GiB (default: the profile's device memory)",
    )
    p.add_argument(
        "--time-budget-s",
        type=TIME_BUDGET_S,
        default=30.0,
        metavar="S",
        help="search for this long (the tuner keeps restarting from new layouts and stops "
        "early only when a lower bound proves its plan optimal)",
    )
    p.add_argument(
        "--stop-at-convergence",
        action="store_true",
        help="stop as soon as the climbs from the peers and layout families converge "
        "(faster, may leave a few percent)",
    )
    p.add_argument("--seed", type=SEED, default=0, metavar="N")
    add_out_args(p, "PLAN.json", "save the tuned plan here (checked before the search)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--verify",
        type=int_in(1, MAX_CANDIDATES - 1),
        default=None,
        metavar="K",
        help="then measure the tuned plan (and any runners-up) against the K best peers on the "
        "executor here (`octopipe verify`'s defaults)",
    )
    add_cluster_args(p)
    p.set_defaults(func=run)


class LiveLines:
    """Progress lines on stderr: every new best plan, every restart, and a heartbeat every
    ``every_s`` seconds (the best so far and its gap to the strongest lower bound)."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.every_s = every_s
        self.best = float("inf")
        self.last = -1e9

    def __call__(self, e: TuneProgress) -> None:
        new_best = e.best_step_time_ms < self.best - 1e-9
        if not (
            new_best or e.phase in ("start", "restart") or e.elapsed_s - self.last >= self.every_s
        ):
            return
        self.best = min(self.best, e.best_step_time_ms)
        self.last = e.elapsed_s
        fits = "fits" if e.fits_memory else "OVER CAP"
        gap = ""
        if e.best_bound_ms > 0:
            gap = f", {100 * (e.best_step_time_ms / e.best_bound_ms - 1):+.2f}% vs bound"
        move = f": {e.move}" if e.move else ""
        print(
            f"[tune] {e.elapsed_s:7.2f}s it {e.iteration:4d} {e.phase:9s} best "
            f"{e.best_step_time_ms:10.2f} ms ({fits}{gap}){move}",
            file=sys.stderr,
            flush=True,
        )


def run(args: argparse.Namespace) -> int:
    out_path = check_writable(args.out, args.force) if args.out else None  # before the search
    check_size(2 * args.devices, args.microbatches, "tune")  # V layouts: 2 stages per device
    prof = apply_cluster(resolve_profile(args.profile), args, args.devices)
    check_tune_layers(prof.num_layers)
    if args.verify:  # before the search: the runs must be possible here
        from octopipe_core.commands.verify import check_local

        check_local(args.devices * (prof.deployment.layout.dp if prof.deployment else 1))
    res = tune(
        prof,
        args.devices,
        args.microbatches,
        memory_gib=args.memory_gib,
        time_budget_s=args.time_budget_s,
        seed=args.seed,
        progress=LiveLines(),
        stop_at_convergence=args.stop_at_convergence,
    )
    print(f"[tune] {res.stop_reason}", file=sys.stderr, flush=True)
    if prof.deployment is not None and prof.deployment.layout.dp > 1:
        pol = order_w_for_dp(prof, res.plan, args.memory_gib)  # W order for the DP reductions
        if pol.moves:
            print(
                f"[tune] W order for DP reductions: {len(pol.moves)} moves, "
                f"{pol.start_step_time_ms:.2f} -> {pol.step_time_ms:.2f} ms",
                file=sys.stderr,
            )
            res.plan, res.result = pol.plan, pol.result
    out = None
    if out_path is not None:
        save_plan(res.plan, out_path, prof)
        out = str(out_path)
    ver = (
        verify_tuned(res, prof, args, out_path.name if out_path else "tuned")
        if args.verify
        else None
    )
    if args.json:
        d = res.to_dict()
        d.pop("baselines")  # printed last, each peer's step time and fit only
        print_json(
            {
                "profile": prof.name,
                "devices": args.devices,
                "microbatches": args.microbatches,
                **d,
                "plan": out,
                "baselines": res.baselines.to_json(("step_time_ms", "fits_memory")),
                **({"verify": ver.to_dict()} if ver is not None else {}),
            }
        )
    else:
        print(summary(res, prof.name, out))
        if ver is not None:
            from octopipe_core.commands.verify import format_result

            print(f"\nverified by measurement (octopipe verify):\n{format_result(ver)}")
    return 0 if res.fits_memory else 3


def verify_tuned(
    res: TuneResult, prof: Profile, args: argparse.Namespace, name: str
) -> VerifyResult:
    """``--verify K``: the tuned plan, its runners-up (the best plans of other layouts its
    climbs reached) and the K best peers, measured with ``octopipe verify``'s defaults."""
    from octopipe_core.commands.verify import measure
    from octopipe_core.verify import Candidate, peer_candidates

    cands = [Candidate(name, res.plan, prof, "plan", res.step_time_ms)]
    cands += [Candidate.of(f"runner-up-{i + 1}", u, prof) for i, u in enumerate(res.runners_up)]
    peers = peer_candidates(prof, args.devices, args.microbatches, [], args.verify, args.memory_gib)
    ver = measure(cands[: MAX_CANDIDATES - len(peers)] + peers)
    assert ver is not None  # None only for export_only
    return ver


def summary(res: TuneResult, name: str, out: str | None) -> str:
    """A readable summary of a tuning run."""
    d = res.to_dict()
    bp = res.best_peer()
    rows: list[list[Any]] = [
        ["step_time_ms", res.step_time_ms],
        ["lower_bound_ms (compute / devices)", res.lower_bound_ms],
        [
            "gap to bound",
            f"{100 * d['gap_to_bound']:.2f}%" if d["gap_to_bound"] is not None else "-",
        ],
        [f"best_bound_ms ({d['best_bound']})", res.best_bound_ms],
        ["gap to best bound", f"{res.gap_to_best_bound_pct:.2f}%"],
        ["layout_bound_ms (any schedule of this layout)", d["layout_bound_ms"]],
        ["gap to layout bound (the schedule's share)", f"{d['gap_to_layout_bound_pct']:.2f}%"],
        ["fits_memory", res.fits_memory],
        ["max_peak_gib / cap", f"{max(res.peak_memory_gib):.2f} / {res.memory_cap_gib:g}"],
        ["best fitting peer", f"{bp[0]} {bp[1]:.2f} ms" if bp else "none fits"],
        ["speedup vs 1f1b/uniform", d["speedup_vs_1f1b_uniform"] or "-"],
        ["speedup vs best fitting peer", d["speedup_vs_best_peer"] or "-"],
        ["layout", f"{res.plan.meta['tuner']['layout']}, {res.plan.num_stages} stages"],
        ["search_time_s", res.search_time_s],
        ["stopped", res.stop_reason],
        ["iterations / evaluations", f"{res.iterations} / {res.evaluations}"],
        ["plan", out or "(not saved; pass --out PLAN.json)"],
    ]
    text = (
        f"{name}: tuned on {res.plan.num_devices} devices, {res.plan.num_microbatches} "
        f"micro-batches\n{table(rows, ['metric', 'value'])}"
    )
    if res.why:
        text += f"\nwhy not closer to the bound: {res.why}"
    return text
