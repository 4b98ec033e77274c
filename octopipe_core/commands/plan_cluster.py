"""``octopipe plan-cluster``: rank TP x PP x DP layouts of a GPU budget for a global batch.

Progress lines go to stderr; the ranked table (or ``--json``) to stdout; ``--out`` saves the
best plan with its profile, cluster and layout embedded, so ``octopipe simulate --plan`` gives
the same step time.
"""

from __future__ import annotations

import argparse
import re
import sys

from octopipe_core.cluster import list_cluster_samples, resolve_cluster
from octopipe_core.cluster_plan import ClusterPlanResult, micro_batch_samples, rank_layouts
from octopipe_core.commands.argtypes import COUNT, TIME_BUDGET_S
from octopipe_core.commands.common import (
    add_profile_arg,
    check_writable,
    print_json,
    resolve_profile,
    table,
)
from octopipe_core.errors import OctoPipeError
from octopipe_core.layout import ORDERS, Layout
from octopipe_core.plan import save_plan


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan-cluster",
        help="rank TP x PP x DP layouts of a cluster for a global batch",
        description="Search every TP x PP x DP split of a GPU budget (and its micro-batch count "
        "for the global batch), tune the promising ones on the cluster's links, and rank them.",
    )
    add_profile_arg(p)
    p.add_argument(
        "--cluster", required=True, metavar="C",
        help=f"cluster .json or bundled sample ({', '.join(list_cluster_samples())})",
    )  # fmt: skip
    p.add_argument("--global-batch", type=COUNT, required=True, metavar="B", help="sequences/step")
    p.add_argument(
        "--seq", type=COUNT, default=None, metavar="S",
        help="sequence length in tokens (default: one sequence per micro-batch)",
    )  # fmt: skip
    p.add_argument(
        "--gpus", type=COUNT, default=None, metavar="N", help="GPU budget (default: all)"
    )
    p.add_argument(
        "--layout", default=None, metavar="TPxPPxDP",
        help="tune only this layout, e.g. 1x8x16 (with --zero1 and --order)",
    )  # fmt: skip
    p.add_argument("--zero1", action="store_true", help="with --layout: ZeRO-1")
    p.add_argument("--order", choices=ORDERS, default="tp-dp-pp", help="with --layout")
    p.add_argument("--time-budget-s", type=TIME_BUDGET_S, default=45.0, metavar="S")
    p.add_argument("--max-tuned", type=COUNT, default=6, metavar="K", help="layouts to tune")
    p.add_argument("--top", type=COUNT, default=15, metavar="K", help="rows to print")
    p.add_argument("--out", default=None, metavar="PLAN.json", help="save the best plan here")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.time_budget_s > 0:
        raise OctoPipeError(f"field '--time-budget-s': got {args.time_budget_s}; fix: use > 0")
    if args.out is not None:
        check_writable(args.out, args.force)  # before the search: writable, not a folder
    prof = resolve_profile(args.profile)
    cluster = resolve_cluster(args.cluster)
    layouts = None
    if args.layout:
        m = re.fullmatch(r"(\d+)x(\d+)x(\d+)", args.layout)
        if not m:
            raise OctoPipeError(
                f"field '--layout': got {args.layout!r}; fix: write TPxPPxDP, e.g. 1x8x16"
            )
        tp, pp, dp = (int(x) for x in m.groups())
        per = dp * micro_batch_samples(prof, args.seq)
        if tp < 1 or pp < 1 or dp < 1 or args.global_batch % per:
            raise OctoPipeError(
                f"field '--layout': {args.layout} needs a global batch divisible by DP x "
                f"micro-batch = {per}; fix: change --global-batch or the layout"
            )
        lay = Layout(pp=pp, dp=dp, tp=tp, zero1=args.zero1, order=args.order)
        layouts = [(lay, args.global_batch // per)]

    def progress(msg: str, frac: float) -> None:
        print(f"[plan-cluster] {100 * frac:5.1f}% {msg}", file=sys.stderr, flush=True)

    res = rank_layouts(
        prof, cluster, args.global_batch, seq=args.seq, gpus=args.gpus or (
            layouts[0][0].gpus if layouts else None),
        time_budget_s=args.time_budget_s, layouts=layouts, max_tuned=args.max_tuned,
        progress=progress,
    )  # fmt: skip
    best = res.best
    if args.out and best is not None and best.plan is not None:
        save_plan(best.plan, args.out, best.profile)
    if args.json:
        print_json(
            {
                "profile": prof.name,
                "cluster": cluster.name,
                "gpus": res.gpus,
                "global_batch": res.global_batch,
                "search_time_s": round(res.search_time_s, 3),
                "best": best.to_dict() if best else None,
                "plan": args.out if best else None,
                "rows": [r.to_dict() for r in res.rows],
                "notes": res.notes,
            }
        )
    else:
        print(report(res, prof.name, cluster.name, args.top, args.out))
    return 0 if best is not None else 3


def report(res: ClusterPlanResult, profile: str, cluster: str, top: int, out: str | None) -> str:
    """The ranked table, then what was left out and where the best plan went."""
    rows = []
    for i, r in enumerate(res.rows[:top], start=1):
        d = r.to_dict()
        rows.append([
            i, d["layout"], d["order"], d["microbatches"], d["schedule"] or "-",
            d["step_time_ms"] if d["step_time_ms"] is not None else "-",
            d["tokens_per_gpu_per_s"], d["peak_memory_gib"], r.fits_memory, r.why[:70],
        ])  # fmt: skip
    head = (
        f"{profile} on {cluster}: {res.gpus} GPUs, global batch {res.global_batch}, "
        f"{len(res.rows)} layouts ranked in {res.search_time_s:.1f} s"
    )
    cols = ["rank", "layout", "order", "microbatches", "schedule", "step_time_ms",
            "tokens/GPU/s", "peak_memory_gib", "fits", "why"]  # fmt: skip
    text = f"{head}\n{table(rows, cols)}"
    if len(res.rows) > top:
        text += f"\n({len(res.rows) - top} more rows: --top N or --json)"
    for n in res.notes[:8]:
        text += f"\nnote: {n}"
    best = res.best
    if best is None:
        text += "\nno layout fits the memory cap; see the why column"
    else:
        where = out or "(not saved; pass --out PLAN.json)"
        text += f"\nbest: {best.layout.label()} {best.layout.order}, {best.schedule}: {where}"
    return text
