"""Sections 5 and 6 of the tuner benchmark (``bench_tuner.py``): search efficiency against
random searches from the same start, and the exhaustive optimum on tiny crafted instances.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from octopipe_core.profile import load_sample
from octopipe_core.tuner import TuneProgress, tune
from octopipe_core.tuner.crafted import hybrid
from octopipe_core.tuner.exact import exact_optimum
from octopipe_core.tuner.random_search import random_plan_search, random_search

PROFILES = ("llama-3-8b", "nemotron-h-8b", "nemotron-h-56b", "jamba-v0.1")


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def fmt_ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


Curve = list[tuple[float, float]]  # (elapsed s, best-so-far step ms), improvements only
METHODS = ("tuner", "random moves", "random plans")


def _recorder(curve: Curve) -> Callable[[TuneProgress], None]:
    """A progress callback that appends each new best fitting step time to ``curve``."""

    def rec(e: TuneProgress) -> None:
        if e.fits_memory and (not curve or e.best_step_time_ms < curve[-1][1]):
            curve.append((e.elapsed_s, e.best_step_time_ms))

    return rec


def best_at(curve: Curve, t: float, start: float) -> float:
    """Best step time found by ``t`` seconds (the start plan if nothing was reported yet)."""
    return min([start, *(ms for el, ms in curve if el <= t)])


def time_to(curve: Curve, target: float) -> float | None:
    """First time the best-so-far step reached ``target`` ms (None: never)."""
    return next((el for el, ms in curve if ms <= target), None)


def _median(xs: list[float]) -> float:
    ys = sorted(xs)
    n = len(ys)
    return ys[n // 2] if n % 2 else (ys[n // 2 - 1] + ys[n // 2]) / 2


def _fmt_t(t: float | None, limit: float) -> str:
    return f"> {limit:g} s" if t is None or t == float("inf") else f"{t:.2f} s"


def search_efficiency(budgets: list[float], seeds: int = 3) -> list[str]:
    """Anytime comparison of the tuner, random-move search and random-plan sampling.

    Each method runs once per (case, seed) for the longest budget with a progress callback;
    its best-so-far step at a shorter budget is read off that curve (the search does not look
    at its budget, so a shorter run follows the same path and stops there).
    """
    horizon = max(budgets)
    cases = [(n, 8, 32) for n in PROFILES] + [("nemotron-h-8b", 4, 16), ("jamba-v0.1", 16, 64)]
    # per method: one list per budget of gap-closed fractions, and times to within 0.5 %
    gaps: dict[str, list[list[float]]] = {k: [[] for _ in budgets] for k in METHODS}
    reach: dict[str, list[float]] = {k: [] for k in METHODS}
    rows: list[str] = []
    for name, p, m in cases:
        prof = load_sample(name)
        log(f"search efficiency {name} p={p} m={m} ({horizon:g} s per run) ...")
        curves: dict[str, list[Curve]] = {k: [] for k in METHODS}
        start = float("inf")
        for k in METHODS:
            runs = 1 if k == "tuner" else seeds
            for seed in range(runs):
                c: Curve = []
                fn = {"tuner": tune, "random moves": random_search,
                      "random plans": random_plan_search}[k]  # fmt: skip
                r = fn(prof, p, m, time_budget_s=horizon, seed=seed, progress=_recorder(c))
                start = r.start_step_time_ms
                # a last move may end past the budget: what it found then does not count
                curves[k].append([(el, ms) for el, ms in c if el <= horizon])
        ref = min([start, *(ms for cs in curves.values() for c in cs for _, ms in c)])
        span = start - ref
        target = ref * 1.005
        who = [k for k in METHODS if any(c and c[-1][1] <= ref + 1e-9 for c in curves[k])]
        first = True
        for k in METHODS:
            cells = []
            for i, b in enumerate(budgets):
                ms = [best_at(c, b, start) for c in curves[k]]
                gc = [(start - x) / span if span > 0 else 1.0 for x in ms]
                gaps[k][i] += gc
                cells.append(f"{fmt_ms(sum(ms) / len(ms))} ({100 * sum(gc) / len(gc):.0f} %)")
            ts = [time_to(c, target) for c in curves[k]]
            tv = [float("inf") if t is None else t for t in ts]
            reach[k] += tv
            tcell = _fmt_t(_median(tv), horizon)
            if len(ts) > 1:
                tcell += " (" + " / ".join(_fmt_t(t, horizon) for t in ts) + ")"
            label = k if k == "tuner" else f"{k} (mean of {seeds})"
            lead = (
                f"| {name} p={p} m={m} | {fmt_ms(start)} | {fmt_ms(ref)} ({', '.join(who)}) "
                if first
                else "| | | "
            )
            rows.append(f"{lead}| {label} | " + " | ".join(cells) + f" | {tcell} |")
            first = False
            log(f"  {k}: " + ", ".join(cells) + f"; to 0.5 %: {tcell}")
    head = [
        "| case | start (best peer) ms | best found ms (by) | method | "
        + " | ".join(f"{b:g} s" for b in budgets)
        + " | time to within 0.5 % of best found: median (per seed) |",
        "|" + "---|" * (5 + len(budgets)),
    ]
    parts = []
    for i, b in enumerate(budgets):
        per = ", ".join(
            f"{k} {100 * _median(gaps[k][i]):.0f} / {100 * sum(gaps[k][i]) / len(gaps[k][i]):.0f} %"
            for k in METHODS
        )
        parts.append(f"{b:g} s: {per}")
    times = ", ".join(
        f"{k} {_fmt_t(_median(reach[k]), horizon)} "
        f"({sum(t < float('inf') for t in reach[k])}/{len(reach[k])} runs get there)"
        for k in METHODS
    )
    summary = [
        f"**Summary.** Gap closed (median / mean over runs: {len(cases)} tuner runs, "
        f"{len(cases) * seeds} of each random search): " + "; ".join(parts) + ". "
        f"Median time to within 0.5 % of the best plan found: {times}.",
    ]
    return [
        *summary,
        "",
        "Every method starts from the best fitting peer plan and uses the same simulator; "
        "*gap closed* = (start - step) / (start - best found), where *best found* is the best "
        f"plan any run of any method found for the case within {horizon:g} s. Cells: step time "
        "ms (gap closed) at each budget, the mean over seeds for the random searches (the tuner "
        "is deterministic: seed 0). *Random moves* = `random_search`: the tuner's moves, a "
        "random phase and a random move each step, kept if faster. *Random plans* = "
        "`random_plan_search`: independent random plans (a random layout family, hence stage "
        "count and placement, a random contiguous partition, the tuner's list scheduler), best "
        f"kept. Each method runs once per seed for {horizon:g} s with a progress callback; the "
        "value at a shorter budget is its best-so-far at that time (the start plan while the "
        "14 peers are still being simulated). Times are wall-clock on a shared 2-core machine.",
        "",
        *head,
        *rows,
    ]


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
