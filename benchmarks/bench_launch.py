"""Start-up cost of a local job: ``octopipe run``'s launcher (ranks forked from one interpreter
that imported torch once) against torchrun (a fresh interpreter per rank), side by side.

The same exported PP2 x DP2 job (4 ranks, gloo, 2 steps) runs ``--reps`` times each way,
alternating; the benchmark prints the median wall time of each and their ratio, and the CPU
time of each launch (its process and every rank, from ``RUSAGE_CHILDREN``).

Run: ``python benchmarks/bench_launch.py [--reps 3]`` (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from octopipe_core.cli import main as cli  # noqa: E402
from octopipe_core.commands.run import worker_env  # noqa: E402
from octopipe_core.plan import save_plan  # noqa: E402
from octopipe_core.profile import load_sample  # noqa: E402
from octopipe_core.schedules import build_plan  # noqa: E402


def timed(cmd: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of ``cmd`` (with every process it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=worker_env())
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[2]} failed:\n{proc.stderr[-3000:]}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return wall, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        prof = load_sample("tiny-hybrid")
        plan = Path(tmp) / "plan.json"
        save_plan(build_plan(prof, "1f1b", 2, 4), plan, prof)
        job = Path(tmp) / "job"
        assert cli(["export", str(plan), "--out", str(job), "--dp", "2", "--steps", "2"]) == 0
        cfg = str(job / "executor_config.json")
        worker = [cfg, "--backend", "gloo", "--no-resume", "--out", str(job / "out")]
        ways = {
            "octopipe launcher": [sys.executable, "-m", "octopipe_core.executor.local_launch",
                                  "--nproc", "4", "--", *worker],
            "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone",
                         "--nproc-per-node", "4", "-m", "octopipe_core.executor.worker",
                         *worker],
        }  # fmt: skip
        got: dict[str, list[tuple[float, float]]] = {k: [] for k in ways}
        for rep in range(args.reps):
            for name, cmd in ways.items():
                got[name].append(timed(cmd))
                print(f"rep {rep + 1}: {name}: {got[name][-1][0]:.2f} s", flush=True)
    med = {k: statistics.median(w for w, _ in v) for k, v in got.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in got.items()}
    print(f"4-rank job (PP2 x DP2, 2 steps, gloo), median of {args.reps}:")
    for k in ways:
        print(f"  {k:18s} wall_s {med[k]:6.2f}   cpu_s {cpu[k]:6.2f}")
    ratio = med["torchrun"] / med["octopipe launcher"]
    print(f"  torchrun / launcher wall: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
