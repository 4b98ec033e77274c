"""Simulator speed: ops simulated per second and how time grows with ops.

Run:  python benchmarks/bench_simulator.py [--quick]

Prints a table (best of 3 runs per cell) for 1F1B, ZB-H1 and ZB-V plans from 8 stages x 64
micro-batches up to 64 stages x 512 micro-batches (one pipeline of an 8192-GPU job with data
parallelism 128), the networkx form's build+traverse time on the smaller sizes for comparison,
and a log-log slope of time against ops (1.0 = linear). An "op" is a compute action (F, B, W or
BW); transfers are simulated too but not counted.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from octopipe_core.graph import build_graph, simulate_graph
from octopipe_core.profile import FORMAT, Profile
from octopipe_core.schedules import build_plan
from octopipe_core.simulator import simulate


def profile(n_layers: int) -> Profile:
    lt = {
        "family": "mlp",
        "forward_ms": 1.0,
        "backward_input_ms": 1.0,
        "backward_weight_ms": 1.0,
        "activation_mib": 100,
        "weight_mib": 100,
        "output_mib": 64,
    }
    return Profile.from_dict(
        {
            "format": FORMAT,
            "name": "bench",
            "tokens_per_microbatch": 4096,
            "layer_types": {"x": lt},
            "layers": ["x"] * n_layers,
        }
    )


def best_of(fn, n: int = 3) -> float:
    best = math.inf
    for _ in range(n):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller sizes only")
    args = ap.parse_args()
    sizes = [(8, 64), (16, 128), (32, 256), (64, 512)]
    if args.quick:
        sizes = sizes[:2]
    print("| schedule | stages x micro-batches | ops | simulate_s | ops/s | networkx_s |")
    print("|---|---|---|---|---|---|")
    points: dict[str, list[tuple[int, float]]] = {}
    for sched in ("1f1b", "zb-h1", "zbv"):
        for p, m in sizes:
            stages = 2 * p if sched == "zbv" else p
            devices = p
            if sched == "zbv":
                devices = p // 2  # same number of stages as the others
            prof = profile(stages)
            plan = build_plan(prof, sched, devices, m)
            r = simulate(prof, plan)
            ops = len(r.ops)
            t = best_of(lambda prof=prof, plan=plan: simulate(prof, plan))
            nx_s = "-"
            if ops <= 30000:
                nx_s = f"{best_of(lambda p=prof, q=plan: simulate_graph(build_graph(p, q)), 1):.3f}"
            points.setdefault(sched, []).append((ops, t))
            print(
                f"| {sched} | {stages} x {m} | {ops:,} | {t:.3f} | {ops / t:,.0f} | {nx_s} |",
                flush=True,
            )
    print()
    for sched, pts in points.items():
        (o1, t1), (o2, t2) = pts[0], pts[-1]
        slope = math.log(t2 / t1) / math.log(o2 / o1)
        print(f"{sched}: time grows as ops^{slope:.2f} from {o1:,} to {o2:,} ops")


if __name__ == "__main__":
    main()
