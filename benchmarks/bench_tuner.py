"""Benchmark of the OctoPipe tuner; writes docs/benchmarks-tuner.md.

    nice python benchmarks/bench_tuner.py              # every section (about an hour, 2 cores)
    python benchmarks/bench_tuner.py --quick           # p = 8 and 16, short budgets (smoke)
    python benchmarks/bench_tuner.py --only curves     # one section, replaced in place
    python benchmarks/bench_tuner.py --scale 0.5       # every budget halved

Sections:

1. every sample at p in {8, 16, 32, 64} (where it has enough layers) and m in {2p, 4p, 8p},
   80 GiB cap: the tuned step vs the best fitting peer and the lower bounds of
   ``octopipe_core/bounds.py``; the same cell tuned without the cap, seeded with the capped
   plan (memory *binds* where that is faster); goal: within 2 % of ``best_bound_ms`` where
   memory does not bind, never slower than a fitting peer, removing the cap never slower;
2. the p = 64 case (nemotron-h-56b: 120 layers on 64 devices);
3. search-time curves: best step found vs time in one long run, and separate runs with
   shorter budgets (a longer budget must help or hold);
4. seed spread: the same cells tuned with seeds 0, 1, 2;
5. search efficiency against random searches from the same start (``tuner_sections.py``);
6. the exhaustive optimum on tiny crafted instances;
7. the time of one exact fill-aware partition (``fill_partition.py``) at 120 layers.

Budgets per cell grow with p x m (``budget_for``); progress lines go to stderr.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

from tuner_sections import PROFILES, exact_comparison, fmt_ms, log, search_efficiency

from octopipe_core.profile import load_sample
from octopipe_core.tuner import TuneProgress, tune

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "benchmarks-tuner.md"
SAMPLES = (*PROFILES, "tiny-hybrid")
SECTIONS = ("grid", "curves", "seeds", "search", "exact", "fill")
FULL_CMD = "python benchmarks/bench_tuner.py"
UNCAPPED_GIB = 1e6
CURVE_CELLS = [("nemotron-h-8b", 8, 32), ("jamba-v0.1", 16, 64), ("llama-3-8b", 32, 128),
               ("nemotron-h-56b", 64, 128)]  # fmt: skip
SEED_CELLS = [("llama-3-8b", 8, 32), ("nemotron-h-8b", 8, 64), ("jamba-v0.1", 16, 64),
              ("nemotron-h-56b", 16, 64), ("nemotron-h-8b", 32, 128),
              ("nemotron-h-56b", 64, 128)]  # fmt: skip


def cell_parser(doc: str) -> argparse.ArgumentParser:
    """The command line of a script that runs chosen grid cells (``PROFILE:P:M`` each, parsed
    to ``(name, p, m)``) with the grid's budgets times ``--scale``."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument(
        "cells", nargs="+", type=parse_cell, help="PROFILE:P:M, e.g. nemotron-h-56b:8:16"
    )
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every budget")
    return ap


def parse_cell(text: str) -> tuple[str, int, int]:
    """``PROFILE:P:M`` as ``(name, p, m)``; a one-line error otherwise."""
    name, *rest = text.split(":")
    if len(rest) != 2 or not all(x.isdigit() and int(x) > 0 for x in rest):
        raise argparse.ArgumentTypeError(
            f"cell '{text}': expected PROFILE:P:M with P devices and M micro-batches, "
            "e.g. nemotron-h-56b:8:16"
        )
    return name, int(rest[0]), int(rest[1])


def budget_for(p: int, m: int, scale: float) -> float:
    """Seconds of search for one cell: more for bigger pipelines (each plan costs more)."""
    size = p * m
    base = 8.0 if size <= 256 else 15.0 if size <= 2048 else 30.0 if p <= 32 else 60.0
    return base * scale


def cells(ps: list[int]) -> list[tuple[str, int, int]]:
    out = []
    for name in SAMPLES:
        n = load_sample(name).num_layers
        for p in ps:
            if p <= n:
                out += [(name, p, m) for m in (2 * p, 4 * p, 8 * p)]
    return out


# ---- 1. grid ------------------------------------------------------------------------------
def run_cell(name: str, p: int, m: int, scale: float) -> dict[str, Any]:
    prof = load_sample(name)
    b = budget_for(p, m, scale)
    log(f"{name} p={p} m={m}: {b:.0f} s capped + {b / 2:.0f} s uncapped ...")
    r = tune(prof, p, m, time_budget_s=b, seed=0)
    u = tune(prof, p, m, memory_gib=UNCAPPED_GIB, time_budget_s=b / 2, seed=0,
             seed_plans=[r.plan])  # fmt: skip
    bp = r.best_peer()
    bounds = r.bounds
    assert bounds is not None
    binds = u.step_time_ms < r.step_time_ms * (1 - 1e-3)
    row = {
        "profile": name, "p": p, "m": m, "tuned": r.step_time_ms, "fits": r.fits_memory,
        "peer": bp, "bound": bounds.best_ms, "bound_name": bounds.best_name,
        "bounds": bounds.to_dict(), "gap": r.gap_to_best_bound_pct, "uncapped": u.step_time_ms,
        "ugap": u.gap_to_best_bound_pct, "binds": binds, "budget": b,
        "not_slower": bp is None or r.step_time_ms <= bp[1] + 1e-6,
        "cap_ok": u.step_time_ms <= r.step_time_ms + 1e-6,
        "layout": f"{r.plan.meta['tuner']['layout']}/{r.plan.num_stages}",
        "layout_bound": r.layout_bound.ms,
        "recompute": len(r.plan.recompute), "time": r.search_time_s,
        "stop": r.stop_reason.split(":")[0], "peak": max(r.peak_memory_gib),
        "vs_1f1b": r.speedup_over("1f1b/uniform"),
    }  # fmt: skip
    log(f"  tuned {r.step_time_ms:,.1f} ms ({r.gap_to_best_bound_pct:+.2f}% vs "
        f"{bounds.best_name} bound), peer {fmt_ms(bp[1] if bp else None)}, uncapped "
        f"{u.step_time_ms:,.1f} ({u.gap_to_best_bound_pct:+.2f}%)")  # fmt: skip
    return row


def goal(r: dict[str, Any]) -> str:
    if r["binds"]:
        return "n/a (memory binds)"
    return "yes" if r["gap"] <= 2.0 + 1e-9 else "**no**"


def grid_lines(rows: list[dict[str, Any]]) -> list[str]:
    head = ("| profile | p | m | tuned ms | best fitting peer (ms) | x peer | x 1f1b/uniform | "
            "best bound ms (which) | gap | layout bound ms (schedule's share) | "
            "uncapped ms (gap) | memory binds | 2 % goal | layout/stages | recomputed stages | "
            "peak GiB | search s | stopped |")  # fmt: skip
    out = [head, "|" + "---|" * 18]
    for r in rows:
        bp = f"{r['peer'][0]} {fmt_ms(r['peer'][1])}" if r["peer"] else "none fits"
        xp = f"{r['peer'][1] / r['tuned']:.3f}" if r["peer"] else "-"
        x1 = f"{r['vs_1f1b']:.3f}" if r["vs_1f1b"] else "-"
        flags = "" if r["not_slower"] else " SLOWER THAN A PEER"
        flags += "" if r["cap_ok"] else " UNCAPPED SLOWER"
        out.append(
            f"| {r['profile']} | {r['p']} | {r['m']} | {fmt_ms(r['tuned'])} | {bp} | {xp} | {x1} "
            f"| {fmt_ms(r['bound'])} ({r['bound_name']}) | {r['gap']:+.2f}% | "
            f"{fmt_ms(r['layout_bound'])} ({_share(r):+.2f}%) | "
            f"{fmt_ms(r['uncapped'])} ({r['ugap']:+.2f}%) | {'yes' if r['binds'] else 'no'} | "
            f"{goal(r)}{flags} | {r['layout']} | {r['recompute']} | {r['peak']:.1f} | "
            f"{r['time']:.0f} | {r['stop']} |"
        )
    return out


def bounds_lines(rows: list[dict[str, Any]]) -> list[str]:
    keys = ("total_ms", "any_assignment_ms", "layer_ms", "granularity_ms", "packing_ms",
            "fill_packing_ms", "contiguous_ms")  # fmt: skip
    out = ["| profile | p | m | " + " | ".join(k[:-3] for k in keys) + " | tuned |",
           "|" + "---|" * (4 + len(keys))]  # fmt: skip
    for r in rows:
        b = r["bounds"]
        vals = " | ".join(fmt_ms(b[k]) if b[k] else "-" for k in keys)
        out.append(f"| {r['profile']} | {r['p']} | {r['m']} | {vals} | {fmt_ms(r['tuned'])} |")
    return out


def _share(r: dict[str, Any]) -> float:
    """The schedule's share of a cell's gap: tuned over the tuned layout's bound, in %."""
    return 100.0 * (r["tuned"] / r["layout_bound"] - 1.0)


def summary_lines(rows: list[dict[str, Any]]) -> list[str]:
    free = [r for r in rows if not r["binds"]]
    met = [r for r in free if r["gap"] <= 2.0 + 1e-9]
    miss = [r for r in free if r["gap"] > 2.0 + 1e-9]
    bind = [r for r in rows if r["binds"]]
    slower = [r for r in rows if not r["not_slower"]]
    capbad = [r for r in rows if not r["cap_ok"]]
    out = [
        f"* cells: {len(rows)}; never slower than a fitting peer: {len(rows) - len(slower)}/"
        f"{len(rows)}" + (f" (slower: {', '.join(map(_cell, slower))})" if slower else ""),
        f"* removing the cap never slower (uncapped search seeded with the capped plan): "
        f"{len(rows) - len(capbad)}/{len(rows)}",
        f"* within 2 % of `best_bound_ms` where memory does not bind: {len(met)}/{len(free)}",
    ]
    if miss:
        listed = ", ".join(f"{_cell(r)} {r['gap']:+.2f}% ({_share(r):+.2f}%)" for r in miss)
        out.append("* missed (gap to the best bound; in brackets the schedule's share, above "
                   f"the tuned layout's bound): {listed}")  # fmt: skip
    if bind:
        out.append(f"* memory binds in {len(bind)} cells: capped {_range([r['gap'] for r in bind])}"
                   f" above the bound, uncapped {_range([r['ugap'] for r in bind])}")  # fmt: skip
    peers = [r["peer"][1] / r["tuned"] for r in rows if r["peer"]]
    if peers:
        out.append(f"* speedup over the best fitting peer: {min(peers):.3f}x-{max(peers):.3f}x "
                   f"(median {statistics.median(peers):.3f}x)")  # fmt: skip
    return out


# ---- 3. curves ----------------------------------------------------------------------------
def curves(scale: float) -> list[str]:
    marks = [1, 2, 5, 10, 20, 40]
    long_b = 40.0 * scale
    shorter = [5.0 * scale, 15.0 * scale]
    head = ("| case | best bound ms | " + " | ".join(f"{x * scale:g} s" for x in marks)
            + " | " + " | ".join(f"run of {b:g} s" for b in shorter) + f" | run of {long_b:g} s "
            "| longer never worse |")  # fmt: skip
    out = [head, "|" + "---|" * (4 + len(marks) + len(shorter))]
    for name, p, m in CURVE_CELLS:
        prof = load_sample(name)
        log(f"curve {name} p={p} m={m} ({long_b:g} s + {sum(shorter):g} s) ...")
        pts: list[tuple[float, float]] = []

        def rec(e: TuneProgress, pts: list[tuple[float, float]] = pts) -> None:
            if e.fits_memory and (not pts or e.best_step_time_ms < pts[-1][1]):
                pts.append((e.elapsed_s, e.best_step_time_ms))

        runs = [tune(prof, p, m, time_budget_s=b, seed=0).step_time_ms for b in shorter]
        r = tune(prof, p, m, time_budget_s=long_b, seed=0, progress=rec)
        runs.append(r.step_time_ms)
        ok = all(b <= a + 1e-6 for a, b in pairwise(runs))
        cells_ = []
        for x in marks:
            got = [ms for el, ms in pts if el <= x * scale]
            cells_.append(f"{fmt_ms(got[-1])} ({100 * (got[-1] / r.best_bound_ms - 1):+.2f}%)"
                          if got else "(peers)")  # fmt: skip
        out.append(
            f"| {name} p={p} m={m} | {fmt_ms(r.best_bound_ms)} | "
            + " | ".join(cells_)
            + " | "
            + " | ".join(fmt_ms(x) for x in runs)
            + f" | {'yes' if ok else 'NO'} |"
        )
    return out


# ---- 4. seeds -----------------------------------------------------------------------------
def seeds(scale: float) -> list[str]:
    out = ["| case | budget s | seed 0 ms | seed 1 ms | seed 2 ms | spread | best gap |",
           "|" + "---|" * 7]  # fmt: skip
    for name, p, m in SEED_CELLS:
        prof = load_sample(name)
        b = budget_for(p, m, scale)
        log(f"seeds {name} p={p} m={m} ({b:g} s x 3) ...")
        rs = [tune(prof, p, m, time_budget_s=b, seed=k) for k in range(3)]
        ms = [r.step_time_ms for r in rs]
        spread = 100 * (max(ms) / min(ms) - 1)
        gap = min(r.gap_to_best_bound_pct for r in rs)
        out.append(f"| {name} p={p} m={m} | {b:g} | " + " | ".join(fmt_ms(x) for x in ms)
                   + f" | {spread:.2f}% | {gap:+.2f}% |")  # fmt: skip
    return out


# ---- 7. fill-aware partition time ---------------------------------------------------------
def fill_times() -> list[str]:
    from octopipe_core.tuner.evaluate import Evaluator
    from octopipe_core.tuner.layouts import family_placement

    prof = load_sample("nemotron-h-56b")
    out = ["| p | m | layout (stages) | objective ms | checks | seconds |", "|" + "---|" * 6]
    for p, m in ((16, 64), (32, 128), (32, 256), (64, 128), (64, 512)):
        for fam in ("seq", "v", "fold8", "fold24", "fold56"):
            r = int(fam[4:]) if fam.startswith("fold") else 0
            place = family_placement(fam, p) if r <= p else []
            if not place or len(place) > prof.num_layers:
                continue
            ev = Evaluator(prof, p, m, 80.0)  # a fresh cache: every solve is timed
            t0 = time.perf_counter()
            res = ev.fill_partition(place)
            took = time.perf_counter() - t0
            out.append(f"| {p} | {m} | {fam} ({len(place)}) | {fmt_ms(res.objective_ms)} | "
                       f"{res.checks} | {took:.2f} |")  # fmt: skip
    return out


# ---- document -----------------------------------------------------------------------------
def block(name: str, lines: list[str]) -> list[str]:
    """``lines`` between the markers that ``--only`` uses to replace a section in place."""
    return [f"<!-- bench:{name} -->", *lines, "", f"<!-- /bench:{name} -->"]


def splice(text: str, name: str, lines: list[str]) -> str:
    """Replace the marker-delimited block ``name`` of ``text`` with ``lines``."""
    a, b = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    i, j = text.find(a), text.find(b)
    if i < 0 or j < i:
        raise SystemExit(f"no {a} ... {b} block in the document; run the full benchmark first")
    return text[:i] + "\n".join(block(name, lines)) + text[j + len(b) :]


def section(name: str, quick: bool, scale: float) -> list[str]:
    t0, load0 = time.perf_counter(), _load()
    if name == "grid":
        ps = [8, 16] if quick else [8, 16, 32, 64]
        rows = [run_cell(n, p, m, scale) for n, p, m in cells(ps)]
        p64 = [r for r in rows if r["p"] == 64]
        body = [
            "## 1. Tuned plans vs the best fitting peer and the lower bounds", "",
            "*gap* = tuned / `best_bound_ms` - 1 (the strongest bound valid for every plan); "
            "*uncapped* = the same cell without the memory cap, seeded with the capped plan; "
            "memory *binds* where that is more than 0.1 % faster; *2 % goal* applies where it "
            "does not. Speedups are peer step / tuned step.", "",
            "### Summary", "", *summary_lines(rows), "",
            *grid_lines(rows), "",
            "### Every bound per cell (ms; `contiguous` holds only for one contiguous stage "
            "per device)", "", *bounds_lines(rows), "",
            "## 2. The p = 64 case (nemotron-h-56b, 120 layers on 64 devices)", "",
            *(grid_lines(p64) if p64 else ["(not run: --quick)"]),
        ]  # fmt: skip
    elif name == "curves":
        body = ["## 3. Search-time curves (best step found vs time; gap to the best bound)",
                "", *curves(scale)]  # fmt: skip
    elif name == "seeds":
        body = ["## 4. Seed spread", "", *seeds(scale)]
    elif name == "search":
        budgets = [0.25, 0.5, 2.0] if quick else [0.25, 0.5, 1.0, 2.0, 6.0]
        body = ["## 5. Search efficiency: tuner vs random search (same start, same simulator)",
                "", *search_efficiency(budgets)]  # fmt: skip
    elif name == "exact":
        body = ["## 6. Tuner vs exhaustive optimum (crafted `hybrid-n` profiles)", "",
                *exact_comparison()]  # fmt: skip
    else:
        body = ["## 7. Exact fill-aware partition time (nemotron-h-56b, 120 layers)", "",
                "Bisection on the step time, one DP test per check; exact for these nested "
                "layouts.", "", *fill_times()]  # fmt: skip
    took = (time.perf_counter() - t0) / 60
    return [*body, "", f"_{took:.1f} min; 1-minute load average {load0} at the start, "
            f"{_load()} at the end ({_cpus()} CPU(s) shared with other jobs)._"]  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="p=8,16 only, short budgets")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every budget")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--only", choices=SECTIONS, help="regenerate one section in place")
    args = ap.parse_args()
    scale = args.scale * (0.4 if args.quick else 1.0)
    if args.only:
        out = Path(args.out)
        text = splice(out.read_text(), args.only, section(args.only, args.quick, scale))
        out.write_text(text)
        log(f"replaced section {args.only!r} of {out}")
        return 0
    t0 = time.perf_counter()
    parts = [block(name, section(name, args.quick, scale)) for name in SECTIONS]
    total = (time.perf_counter() - t0) / 60
    q = " --quick" if args.quick else ""
    doc = [
        "# Tuner benchmark", "",
        f"Generated by `nice {FULL_CMD}{q}` on {time.strftime('%Y-%m-%d')} ({total:.0f} min; "
        f"`--only SECTION` regenerates one of {', '.join(SECTIONS)} in place). Machine: "
        f"{platform.machine()}, Python {platform.python_version()}, {_cpus()} CPU(s) shared "
        "with other jobs. Step times come from the simulator on the bundled (analytic) sample "
        "profiles, 80 GiB per device. Bounds: `octopipe_core/bounds.py`.", "",
    ]  # fmt: skip
    for pt in parts:
        doc += [*pt, ""]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(doc))
    print("\n".join(doc))
    log(f"wrote {args.out} in {total:.1f} min")
    return 0


def _range(xs: list[float]) -> str:
    return f"{min(xs):+.2f}% to {max(xs):+.2f}%" if xs else "-"


def _cell(r: dict[str, Any]) -> str:
    return f"{r['profile']} p={r['p']} m={r['m']}"


def _load() -> str:
    import os

    return f"{os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "n/a"


def _cpus() -> int:
    import os

    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


if __name__ == "__main__":
    sys.exit(main())
