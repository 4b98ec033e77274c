"""Benchmark of the OctoPipe tuner; writes docs/benchmarks-tuner.md.

    python benchmarks/bench_tuner.py            # full run, about 10-15 minutes on 2 cores
    python benchmarks/bench_tuner.py --quick    # p=4 and p=8 only, short budgets (smoke test)

Sections:

1. every sample profile at p in {4, 8, 16}, m in {2p, 4p, 8p}: tuned step time vs the lower
   bound (total compute / devices) and vs every peer (uniform and balanced partitions), with a
   "why" for cells more than 5 % above the bound;
2. search time at p=8, m=32 (goal <= 10 s) and p=32, m=128 (goal <= 60 s);
3. random search over the same moves with the same time budget;
4. exhaustive optimum on small crafted instances (goal: tuner within 1 %).

Progress lines go to stderr. Device memory is each profile's (80 GiB).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path
from typing import Any

from octopipe_core.profile import load_sample
from octopipe_core.schedules import PARTITIONS, SCHEDULES
from octopipe_core.tuner import tune
from octopipe_core.tuner.crafted import hybrid
from octopipe_core.tuner.exact import exact_optimum
from octopipe_core.tuner.random_search import random_search

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "benchmarks-tuner.md"
PROFILES = ("llama-3-8b", "nemotron-h-8b", "nemotron-h-56b", "jamba-v0.1")
# peers that optimise one phase only: the schedule or placement with Megatron's uniform
# partition, or the partition (balanced) with plain 1F1B
SINGLE_PHASE = (*(f"{s}/uniform" for s in SCHEDULES), "1f1b/balanced")


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def budget_for(p: int, m: int, scale: float) -> float:
    return scale * {4: 4.0, 8: 10.0, 16: 15.0}.get(p, 10.0)


def fmt_ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def peer_cell(v: dict[str, Any]) -> str:
    if "error" in v:
        return "n/a"
    return fmt_ms(v["step_time_ms"]) + ("" if v["fits_memory"] else " (OOM)")


def best_of(baselines: dict[str, dict[str, Any]], keys: tuple[str, ...] | None = None):
    ok = [
        (k, v["step_time_ms"])
        for k, v in baselines.items()
        if "error" not in v and v["fits_memory"] and (keys is None or k in keys)
    ]
    return min(ok, key=lambda kv: kv[1]) if ok else None


def grid(ps: list[int], scale: float) -> tuple[list[dict[str, Any]], list[str]]:
    rows: list[dict[str, Any]] = []
    lines: list[str] = []
    for name in PROFILES:
        prof = load_sample(name)
        for p in ps:
            for m in (2 * p, 4 * p, 8 * p):
                b = budget_for(p, m, scale)
                log(f"{name} p={p} m={m} budget {b:.0f}s ...")
                r = tune(prof, p, m, time_budget_s=b, seed=0)
                d = r.to_dict()
                bp = best_of(r.baselines)
                sp = best_of(r.baselines, SINGLE_PHASE)
                gap = r.step_time_ms / r.lower_bound_ms - 1
                row = {
                    "profile": name, "p": p, "m": m, "tuned": r.step_time_ms,
                    "lb": r.lower_bound_ms, "gap": gap, "fits": r.fits_memory,
                    "best_peer": bp, "single": sp,
                    "vs_1f1b": d["speedup_vs_1f1b_uniform"],
                    "vs_single": (sp[1] / r.step_time_ms) if sp else None,
                    "vs_best": (bp[1] / r.step_time_ms) if bp else None,
                    "time": r.search_time_s, "t_best": r.time_to_best_s,
                    "converged": r.converged, "budget": b, "why": r.why,
                    "layout": f"{r.plan.meta['tuner']['layout']}/{r.plan.num_stages}",
                    "baselines": r.baselines, "balance": r.balance_ms,
                    "floor": r.granularity_ms,
                    "not_slower": bp is None or r.step_time_ms <= bp[1] + 1e-6,
                }  # fmt: skip
                rows.append(row)
                log(
                    f"  tuned {r.step_time_ms:,.1f} ms, bound {r.lower_bound_ms:,.1f} "
                    f"(+{100 * gap:.1f}%), best peer {bp[0] + ' ' + fmt_ms(bp[1]) if bp else '-'}"
                    f", {r.search_time_s:.1f}s"
                )
    lines.append(
        "| profile | p | m | tuned ms | bound ms | gap | floor ms | balance ms | gap to balance | "
        "best fitting peer (ms) | x 1f1b/uniform | x best single-phase | x best peer | layout | "
        "search s | goal | why |"
    )
    lines.append("|" + "---|" * 17)
    for r in rows:
        goal = "n/a (m<4p)" if r["m"] < 4 * r["p"] else ("yes" if r["gap"] <= 0.05 else "no")
        if not r["not_slower"]:
            goal += ", SLOWER THAN A PEER"
        bp = f"{r['best_peer'][0]} {fmt_ms(r['best_peer'][1])}" if r["best_peer"] else "none fits"
        sx = lambda x: f"{x:.3f}" if x else "-"  # noqa: E731
        why = r["why"] if r["gap"] > 0.05 else ""
        lines.append(
            f"| {r['profile']} | {r['p']} | {r['m']} | {fmt_ms(r['tuned'])} | {fmt_ms(r['lb'])} "
            f"| {100 * r['gap']:.1f}% | {fmt_ms(r['floor'])} | {fmt_ms(r['balance'])} | "
            f"{100 * (r['tuned'] / r['balance'] - 1):.1f}% | {bp} | {sx(r['vs_1f1b'])} | "
            f"{sx(r['vs_single'])} | "
            f"{sx(r['vs_best'])} | {r['layout']} | {r['time']:.1f} | {goal} | {why} |"
        )
    return rows, lines


def peers_table(rows: list[dict[str, Any]]) -> list[str]:
    keys = [f"{s}/{p}" for s in SCHEDULES for p in PARTITIONS]
    head = "| profile | p | m | tuned | " + " | ".join(keys) + " |"
    lines = [head, "|" + "---|" * (4 + len(keys))]
    for r in rows:
        cells = [peer_cell(r["baselines"].get(k, {"error": ""})) for k in keys]
        lines.append(
            f"| {r['profile']} | {r['p']} | {r['m']} | {fmt_ms(r['tuned'])} | "
            + " | ".join(cells)
            + " |"
        )
    return lines


def search_time_checks(scale: float, big: bool) -> list[str]:
    lines = [
        "| profile | p | m | budget s | search s | converged | time to best s | tuned ms | "
        "gap | goal |",
        "|" + "---|" * 10,
    ]
    cases = [(n, 8, 32, 10.0) for n in PROFILES]
    if big:
        cases += [("llama-3-8b", 32, 128, 60.0), ("nemotron-h-8b", 32, 128, 60.0)]
    for name, p, m, goal in cases:
        prof = load_sample(name)
        log(f"search time {name} p={p} m={m} (goal {goal:.0f}s) ...")
        r = tune(prof, p, m, time_budget_s=goal * min(1.0, scale), seed=0)
        ok = "yes" if r.search_time_s <= goal + 0.5 else "no"
        lines.append(
            f"| {name} | {p} | {m} | {goal:.0f} | {r.search_time_s:.1f} | "
            f"{'yes' if r.converged else 'no (budget)'} | {r.time_to_best_s:.1f} | "
            f"{fmt_ms(r.step_time_ms)} | {100 * (r.step_time_ms / r.lower_bound_ms - 1):.1f}% "
            f"| {ok} |"
        )
        log(f"  {r.search_time_s:.1f}s, converged={r.converged}")
    return lines


def random_comparison(budgets: list[float], seeds: int = 3) -> list[str]:
    lines = [
        "| profile | p | m | start (best peer) ms | "
        + " | ".join(f"tuner {b:g}s | random {b:g}s (mean / best of {seeds})" for b in budgets)
        + " | tuner time to reach random's best at the longest budget |",
        "|" + "---|" * (4 + 2 * len(budgets) + 1),
    ]
    cases = [(n, 8, 32) for n in PROFILES] + [("nemotron-h-8b", 4, 16), ("jamba-v0.1", 16, 64)]
    wins = ties = total = mean_wins = 0
    margins: list[float] = []
    for name, p, m in cases:
        prof = load_sample(name)
        cells = []
        start = beat = None
        for b in budgets:
            log(f"random search {name} p={p} m={m} budget {b:g}s ...")
            t = tune(prof, p, m, time_budget_s=b, seed=0)
            rs = [random_search(prof, p, m, time_budget_s=b, seed=k).step_time_ms
                  for k in range(seeds)]  # fmt: skip
            mean, best = sum(rs) / len(rs), min(rs)
            start = t.start_step_time_ms
            total += 1
            wins += t.step_time_ms < best - 1e-6
            ties += abs(t.step_time_ms - best) <= 1e-6
            mean_wins += t.step_time_ms < mean - 1e-6
            margins.append(mean / t.step_time_ms - 1)
            cells += [fmt_ms(t.step_time_ms), f"{fmt_ms(mean)} / {fmt_ms(best)}"]
            beat = next(
                (h["elapsed_s"] for h in t.history
                 if h["phase"] not in ("restart", "kick") and h["step_time_ms"] <= best + 1e-6),
                None,
            )  # fmt: skip
            log(f"  tuner {t.step_time_ms:,.1f} vs random mean {mean:,.1f} best {best:,.1f}")
        lines.append(
            f"| {name} | {p} | {m} | {fmt_ms(start)} | " + " | ".join(cells)
            + f" | {'-' if beat is None else f'{beat:.2f} s'} |"
        )  # fmt: skip
    lines += [
        "",
        f"Tuner strictly better than the best of {seeds} random runs in {wins}/{total} "
        f"(case, budget) pairs, equal in {ties}, worse in {total - wins - ties}; better than "
        f"the random runs' mean in {mean_wins}/{total} (random mean slower by "
        f"{100 * sum(margins) / len(margins):.2f} % on average, at most "
        f"{100 * max(margins):.2f} %). Random search samples a phase, builds that phase's "
        "moves for its current plan and evaluates one at random; the tuner ranks phases by "
        "bubble size and moves by analytic promise, and restarts from other layouts.",
    ]
    return lines


def exact_comparison() -> list[str]:
    lines = [
        "| instance | layers | p | m | stages/device | exact ms | exact search s | nodes | "
        "tuner ms | tuner s | gap |",
        "|" + "---|" * 11,
    ]
    for n, p, m, spd in ((6, 2, 3, 3), (6, 3, 3, 2), (7, 2, 4, 3), (8, 2, 4, 3), (6, 3, 4, 2),
                         (8, 3, 2, 2)):  # fmt: skip
        prof = hybrid(n)
        log(f"exact hybrid-{n} p={p} m={m} ...")
        t = tune(prof, p, m, time_budget_s=10, seed=0)
        e = exact_optimum(prof, p, m, max_stages_per_device=spd, time_limit_s=90)
        gap = t.step_time_ms / e.step_time_ms - 1
        done = "" if e.complete else " (time limit: best found)"
        lines.append(
            f"| hybrid-{n} | {n} | {p} | {m} | <= {spd} | {e.step_time_ms:.3f}{done} | "
            f"{e.search_time_s:.1f} | {e.nodes} | {t.step_time_ms:.3f} | {t.search_time_s:.2f} "
            f"| {100 * gap:+.2f}% |"
        )
        log(f"  exact {e.step_time_ms:.3f} ({e.search_time_s:.1f}s) tuner {t.step_time_ms:.3f}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="p=4,8 only, short budgets")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    t0 = time.perf_counter()
    scale = 0.4 if args.quick else 1.0
    ps = [4, 8] if args.quick else [4, 8, 16]
    cmd = "python benchmarks/bench_tuner.py" + (" --quick" if args.quick else "")
    rows, grid_lines = grid(ps, scale)
    st_lines = search_time_checks(scale, big=not args.quick)
    rs_lines = random_comparison([0.5, 2.0] if args.quick else [0.5, 2.0, 6.0])
    ex_lines = exact_comparison()
    total = time.perf_counter() - t0
    ok_rows = [r for r in rows if r["m"] >= 4 * r["p"]]
    within = sum(r["gap"] <= 0.05 for r in ok_rows)
    slower = [r for r in rows if not r["not_slower"]]
    llama = [r for r in rows if r["profile"] == "llama-3-8b"]
    missed = [r for r in ok_rows if r["gap"] > 0.05]
    miss_bal = [r["balance"] / r["lb"] - 1 for r in missed]
    miss_res = [r["tuned"] / r["balance"] - 1 for r in missed]
    miss_floor = [max(0.0, r["floor"] / r["lb"] - 1) for r in missed]
    doc = [
        "# Tuner benchmark",
        "",
        "Generated by:",
        "",
        f"    {cmd}",
        "",
        f"Machine: {platform.machine()}, Python {platform.python_version()}, "
        f"{_cpus()} CPU(s) shared with other jobs; total run time {total / 60:.1f} min. "
        "All numbers come from the simulator on the bundled (analytic, unmeasured) sample "
        "profiles, 80 GiB per device.",
        "",
        "Definitions: *bound* = total compute / devices (`lower_bound_ms`); *gap* = tuned / "
        "bound - 1; *best fitting peer* = the fastest of the 14 peer plans (7 schedules x "
        "uniform/balanced partitions) that fits in memory; *single-phase peers* = every peer "
        "with the uniform partition (schedule or placement only) and 1f1b/balanced (partition "
        "only); speedups are peer step time / tuned step time. *goal* = within 5 % of the bound "
        "(required when m >= 4p). *floor* = a proven lower bound on the busiest device's compute "
        "with indivisible layers (mean, largest layer, and k+1 times the (k*p+1)-th largest "
        "layer). *balance* = the smallest busiest-device compute among the "
        "device-balanced partitions of every layout family and the tuned plan (found by search, "
        "not proven optimal): layers are indivisible, so the bound can be out of reach. "
        "*layout* = the tuned placement family / number of stages.",
        "",
        "## Summary",
        "",
        f"* never slower than a fitting peer: {len(rows) - len(slower)}/{len(rows)} cells"
        + (f" (slower: {', '.join(_cell(r) for r in slower)})" if slower else ""),
        f"* within 5 % of the bound where m >= 4p: {within}/{len(ok_rows)} cells",
        f"* where the 5 % goal is missed (m >= 4p), the busiest device's compute alone (the best "
        f"device split found, layers being indivisible) is already {_range(miss_bal)} over the "
        f"bound (proven floor: {_range(miss_floor)} over); the tuned step is "
        f"{_range(miss_res)} over that split",
        f"* llama-3-8b at least matches the best fitting peer: "
        f"{sum(r['not_slower'] for r in llama)}/{len(llama)} cells",
        "",
        "## 1. Tuned plans vs the bound and the peers",
        "",
        *grid_lines,
        "",
        "### Every peer (step time ms; OOM = over the 80 GiB cap, n/a = cannot be built)",
        "",
        *peers_table(rows),
        "",
        "## 2. Search time",
        "",
        *st_lines,
        "",
        "## 3. Tuner vs random search (same moves, same budget, same start)",
        "",
        *rs_lines,
        "",
        "## 4. Tuner vs exhaustive optimum (crafted `hybrid-n` profiles)",
        "",
        "The exact search enumerates every contiguous partition, every placement with at most "
        "the given stages per device, and every schedule running each stage's F, B, W in "
        "micro-batch order (branch and bound), under the memory cap.",
        "",
        *ex_lines,
        "",
    ]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(doc))
    print("\n".join(doc))
    log(f"wrote {args.out} in {total / 60:.1f} min")
    return 0


def _range(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{100 * min(xs):.1f}-{100 * max(xs):.1f} %"


def _cell(r: dict[str, Any]) -> str:
    return f"{r['profile']} p={r['p']} m={r['m']}"


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


if __name__ == "__main__":
    raise SystemExit(main())
