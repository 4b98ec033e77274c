"""Measured profiles of the user's own model: ``octopipe profile --links`` and ``--model``.

1. ``profile --links`` between 2 local gloo processes: bandwidth and latency.
2. For ``llama_tiny`` and ``hybrid_tiny`` (transformers, CPU, float32): ``profile --model``
   (its wall time and the per-type F/B/W), with the measured link as the profile's p2p figures;
   then 1F1B and ZB-H1 plans on 2 devices are simulated on that profile (prediction) and run on
   2 gloo ranks (``octopipe run``, median of the measured steps): prediction error =
   predicted / measured - 1.

Prints a Markdown section (paste into ``docs/benchmarks.md``). Run:
``python benchmarks/bench_profile_model.py [--hidden 64 --seq 128 --steps 5]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from octopipe_core.cluster import load_cluster  # noqa: E402
from octopipe_core.plan import save_plan  # noqa: E402
from octopipe_core.profile import load_profile  # noqa: E402
from octopipe_core.schedules import build_plan  # noqa: E402
from octopipe_core.simulator import simulate  # noqa: E402

MODELS = {
    "llama_tiny": "embedding,block=transformer_block*6,lm_head",
    "hybrid_tiny": "embedding,m=mamba*2,a=attention,m*2,a,lm_head",
}


def octopipe(*args: str) -> tuple[float, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "octopipe_core", *args], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=1800)  # fmt: skip
    if p.returncode != 0:
        raise SystemExit(f"octopipe {' '.join(args)} failed:\n{p.stderr[-3000:]}")
    return time.perf_counter() - t, p.stdout


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    lines = [f"load average at start: {os.getloadavg()[0]:.1f}", ""]
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        wall, _ = octopipe("profile", "--links", "--nproc", "2", "--out", str(tmp / "links.json"))
        link = load_cluster(tmp / "links.json").intra_node
        lines.append(
            f"* `profile --links --nproc 2` ({wall:.1f} s): gloo loopback "
            f"{link.bandwidth_gbytes_per_s:.2f} GB/s, {link.latency_us:.0f} us latency"
        )
        sizes = ["--hidden", str(args.hidden), "--seq", str(args.seq), "--vocab", "256"]
        for name, layers in MODELS.items():
            spec = f"octopipe_core.executor.hf:{name}"
            prof_path = tmp / f"{name}.json"
            wall, _ = octopipe("profile", "--model", spec, "--layers", layers, *sizes,
                               "--p2p-gbps", f"{link.bandwidth_gbytes_per_s:.4f}",
                               "--p2p-latency-us", f"{link.latency_us:.2f}",
                               "--out", str(prof_path))  # fmt: skip
            prof = load_profile(prof_path)
            types = ", ".join(
                f"{t.name} F/B/W {t.forward_ms:.2f}/{t.backward_input_ms:.2f}/"
                f"{t.backward_weight_ms:.2f} ms"
                for t in prof.layer_types
            )
            lines.append(f"* `{name}` profile ({len(prof.layers)} layers, {wall:.1f} s): {types}")
            for sched in ("1f1b", "zb-h1"):
                plan = build_plan(prof, sched, 2, args.microbatches)
                pred = simulate(prof, plan).step_time_ms
                save_plan(plan, tmp / "plan.json", prof)
                job = tmp / f"job-{name}-{sched}"
                octopipe("export", str(tmp / "plan.json"), "--out", str(job), "--model", spec,
                         *sizes, "--microbatch-size", "1", "--dtype", "float32")  # fmt: skip
                octopipe("run", str(job), "--steps", str(args.steps), "--warmup", "2")
                res = json.loads((job / "out" / "result.json").read_text())
                meas = statistics.median(res["step_ms"][res["warmup"] :])
                lines.append(
                    f"  * {sched}, {args.microbatches} micro-batches on 2 gloo ranks: predicted "
                    f"{pred:.1f} ms, measured {meas:.1f} ms (median of {args.steps}), "
                    f"error {pred / meas - 1:+.0%}"
                )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
