"""Does ``tune`` keep its time budget? Wall time against ``time_budget_s`` on a few cells.

    python benchmarks/bench_budget.py [--budgets 0.5 2]

A tune always runs the peer schedules (its floor: it never returns a plan slower than a
fitting peer) and the bounds, then searches until the budget is spent. Each line prints the
budget, the wall time, how far past the budget it returned, and the time the peers alone
took (a tune whose budget is spent before they finish returns the best peer). The first
call also pays the imports, so a warm-up tune runs first.
"""

from __future__ import annotations

import argparse
import time

from octopipe_core.profile import load_sample
from octopipe_core.tuner import tune
from octopipe_core.tuner.climb import peer_candidates
from octopipe_core.tuner.evaluate import Evaluator

# (sample, devices, micro-batches, memory cap GiB): the dashboard's landing-page tunes, a
# memory-bound cell, and wide pipelines
CELLS = (
    ("jamba-v0.1", 16, 64, 50.0),
    ("nemotron-h-8b", 8, 32, 20.0),
    ("llama-3-8b", 16, 32, 80.0),
    ("nemotron-h-56b", 32, 64, 80.0),
    ("nemotron-h-56b", 64, 128, 80.0),
)


def peers_s(name: str, p: int, m: int, cap: float) -> float:
    """Seconds the peer schedules take on their own (no budget)."""
    t = time.perf_counter()
    peer_candidates(Evaluator(load_sample(name), p, m, cap))
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.5, 2.0])
    args = ap.parse_args()
    tune(load_sample("llama-3-8b"), 4, 8, time_budget_s=0.2)  # warm-up: imports, caches
    print("| cell | cap GiB | budget s | wall s | past the budget s | peers alone s |")
    print("|---|---|---|---|---|---|")
    for name, p, m, cap in CELLS:
        alone = peers_s(name, p, m, cap)
        for b in args.budgets:
            t = time.perf_counter()
            tune(load_sample(name), p, m, memory_gib=cap, time_budget_s=b, seed=0)
            wall = time.perf_counter() - t
            print(
                f"| {name} p={p} m={m} | {cap:g} | {b:g} | {wall:.2f} | {max(0.0, wall - b):.2f} "
                f"| {alone:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
