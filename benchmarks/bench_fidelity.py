"""Predicted against measured steps, before and after calibration (CPU, 2 pinned gloo ranks).

1. ``octopipe profile`` times each stand-in layer alone (core 0): the *isolated* profile.
2. ``octopipe calibrate`` runs two plans with different partitions (ZB-H1 on the uniform
   partition, and the plan calibrate adds: interleaved 1F1B in as many chunks as there are
   layers per device, so one layer a stage; split and fused backwards; ``--cal-rounds``
   interleaved rounds of ``--cal-steps`` steps each) and fits a profile; the tuner tunes on it
   (``--tune-s``).
3. ``octopipe verify``'s machinery runs, interleaved in ``--rounds`` rounds of ``--steps``
   steps, the predicted plans (the tuned plan, the hand-made irregular plan, ZB-H1,
   interleaved 1F1B and 1F1B on the balanced partition) beside the two calibration plans.
4. ``octopipe calibrate --trace`` fits the *calibrated* profile again from the calibration
   plans' traces of those same rounds: measured side by side with the plans it predicts, so
   that the machine's drift between a calibration and a verification (several % on 2 shared
   cores) is not read as a model error. None of the predicted plans is a calibration plan.

The measured step is the whole training step (``result.json`` ``step_ms``: pipeline,
optimizer and the step's small all-reduce), as the calibrated profile predicts it.

Run: ``python benchmarks/bench_fidelity.py`` (hidden 128), and
``python benchmarks/bench_fidelity.py --hidden 512 --seq 64``; each prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from octopipe_core.executor.plans import irregular_plan  # noqa: E402
from octopipe_core.executor.verify import LocalJobs, export_jobs  # noqa: E402
from octopipe_core.plan import load_plan, save_plan  # noqa: E402
from octopipe_core.profile import Profile, load_profile  # noqa: E402
from octopipe_core.schedules import build_plan  # noqa: E402
from octopipe_core.simulator import simulate  # noqa: E402
from octopipe_core.tuner import tune  # noqa: E402
from octopipe_core.verify import Candidate, VerifyResult, verify  # noqa: E402

LAYERS = "embedding,mamba*2,attention,mlp,moe,mamba,mlp,attention,transformer_block,lm_head"
PEERS = ("zb-h1/balanced", "interleaved/balanced", "1f1b/balanced")


def _cli(args: list[str], core: int | None = None) -> str:
    pin = ["taskset", "-c", str(core)] if core is not None else []
    cmd = [*pin, sys.executable, "-m", "octopipe_core", *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args[:2])} failed:\n{proc.stderr[-3000:]}")
    sys.stderr.write(proc.stderr)
    return proc.stdout


def model_flags(a: argparse.Namespace) -> list[str]:
    return [
        "--hidden", str(a.hidden), "--seq", str(a.seq), "--microbatch-size", str(a.mbs),
        "--vocab", str(a.vocab), "--dtype", "float32",
    ]  # fmt: skip


def isolated_profile(a: argparse.Namespace, out: Path) -> Profile:
    core = sorted(os.sched_getaffinity(0))[0]
    _cli(
        ["profile", "--layers", LAYERS, *model_flags(a)[:-2], "--dtype", "float32",
         "--repeats", "15", "--warmup", "3", "--name", "bench", "--out", str(out)],
        core,
    )  # fmt: skip
    return load_profile(out)


def calibration_plans(a: argparse.Namespace, iso: Profile, tmp: Path) -> list[Path]:
    """ZB-H1 on the uniform partition and what ``calibrate`` adds to it (one layer a stage)."""
    from octopipe_core.commands.calibrate import second_plan

    zb = build_plan(iso, "zb-h1", 2, a.microbatches, partition="uniform")
    fine = second_plan(zb, iso)[1]
    paths = [tmp / "cal-zb-h1-uniform.json", tmp / "cal-interleaved-fine.json"]
    for plan, path in zip((zb, fine), paths, strict=True):
        save_plan(plan, path, iso)
    return paths


def calibrated_profile(
    a: argparse.Namespace, plans: list[str], tmp: Path, name: str, traces: Sequence[str] = ()
) -> tuple[Profile, Any]:
    """``octopipe calibrate`` on ``plans``: runs of its own, or the given ``traces``."""
    out = tmp / f"{name}.json"
    if traces:
        summary = _cli(
            ["calibrate", *plans, *[x for t in traces for x in ("--trace", t)], "--out",
             str(out), "--json"]
        )  # fmt: skip
        return load_profile(out), json.loads(summary)
    summary = _cli(
        ["calibrate", *plans, "--out", str(out), *model_flags(a), "--steps", str(a.cal_steps),
         "--rounds", str(a.cal_rounds), "--warmup", "2", "--json"]
    )  # fmt: skip
    return load_profile(out), json.loads(summary)


def candidates(cal: Profile, m: int, tune_s: float, cal_plans: list[Path]) -> list[Candidate]:
    """The predicted plans (tuned on ``cal``, the irregular plan, the peers), then the
    calibration plans (measured beside them, for the side-by-side calibration)."""
    res = tune(cal, devices=2, microbatches=m, time_budget_s=tune_s)
    out = [
        Candidate.of("tuned (calibrated)", res.plan, cal),
        Candidate.of("hand-irregular", irregular_plan(cal.num_layers, m), cal),
    ]
    for name in PEERS:
        sched, part = name.split("/")
        out.append(Candidate.of(name, build_plan(cal, sched, 2, m, partition=part), cal, "peer"))
    for path in cal_plans:
        out.append(Candidate.of(path.name, load_plan(path)[0], cal, "calibration"))
    return out


def report(
    a: argparse.Namespace,
    iso: Profile,
    first: Profile,
    cal: Profile,
    cands: list[Candidate],
    res: VerifyResult,
    cal_summary: dict[str, Any],
    wall_s: float,
) -> str:
    lines = [
        f"hidden {a.hidden}, seq {a.seq}, micro-batch {a.mbs}, vocab {a.vocab}, float32, "
        f"{a.microbatches} micro-batches; {a.rounds} rounds x {a.steps} measured steps per "
        f"candidate (+{a.warmup} warm-up per run), interleaved; wall {wall_s:.0f} s",
        "",
        "| plan | measured median ms (p25-p75) | isolated profile: predicted ms (error) | "
        "calibrated before: predicted ms (error) | calibrated side by side: predicted ms "
        "(error) |",
        "|---|---|---|---|---|",
    ]
    speedups: dict[str, list[float]] = {}
    for c in cands:
        r = res.row(c.name)
        cells = []
        for prof in (iso, first, cal):
            ms = simulate(prof, c.plan).step_time_ms
            cells.append(f"{ms:,.1f} ({(ms / r.measured_median_ms - 1) * 100:+.1f} %)")
            speedups.setdefault(c.name, []).append(ms)
        tag = " (calibration plan)" if c.source == "calibration" else ""
        lines.append(
            f"| {c.name}{tag} | {r.measured_median_ms:,.1f} ({r.p25_ms:,.1f}-{r.p75_ms:,.1f}) "
            f"| {' | '.join(cells)} |"
        )
    tuned = res.row(cands[0].name)
    peers = [res.row(p) for p in PEERS]
    best = min(peers, key=lambda r: r.measured_median_ms)
    sp = tuned.speedup_over[best.name]
    pred = speedups[best.name][2] / speedups[tuned.name][2]  # on the side-by-side profile
    lines += [
        "",
        f"Tuned over the measured best peer ({best.name}): measured {sp.median:.3f}x "
        f"(95 % CI {sp.ci95_lo:.3f}-{sp.ci95_hi:.3f}, {res.ci_method}), "
        f"predicted {pred:.3f}x side by side ({sp.predicted:.3f}x by the profile it was tuned "
        f"on); gap {(sp.median - pred) * 100:+.1f} points. Tuned slower than a peer: "
        + (", ".join(p.name for p in peers if p.measured_median_ms < tuned.measured_median_ms)
           or "none")
        + ".",
        f"Side-by-side calibration (on {', '.join(cal_summary['step_error_pct'])}): "
        + json.dumps(
            {k: cal_summary[k] for k in ("runtime", "p2p_latency_us", "step_error_pct")}
        ),
    ]  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--mbs", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8, help="measured steps per run")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--cal-steps", type=int, default=10, help="calibration steps per round")
    ap.add_argument("--cal-rounds", type=int, default=2)
    ap.add_argument("--tune-s", type=float, default=10.0)
    ap.add_argument("--keep", metavar="DIR", help="keep the profiles, plans and runs here (new)")
    ap.add_argument("--out", metavar="FILE", help="also write the report (Markdown) here")
    a = ap.parse_args()
    if a.keep and Path(a.keep).exists():
        raise SystemExit(f"--keep {a.keep}: exists; fix: name a new folder")
    t0 = time.time()
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(a.keep) if a.keep else Path(td)
        tmp.mkdir(parents=True, exist_ok=True)
        iso = isolated_profile(a, tmp / "isolated.json")
        cal_plans = calibration_plans(a, iso, tmp)
        first, _ = calibrated_profile(a, [str(p) for p in cal_plans], tmp, "calibrated-first")
        cands = candidates(first, a.microbatches, a.tune_s, cal_plans)
        for i, c in enumerate(cands):
            save_plan(c.plan, tmp / f"candidate-{i}.json", first)
        model = {
            "hidden": a.hidden, "seq": a.seq, "vocab": a.vocab, "microbatch_size": a.mbs,
            "dtype": "float32",
        }  # fmt: skip
        runtime = {"steps": a.steps, "warmup": a.warmup, "timeout_s": 120}
        jobs = export_jobs(cands, tmp / "verify", rounds=a.rounds, model=model, runtime=runtime)
        res = verify(
            cands,
            LocalJobs(jobs, timeout_s=900),
            rounds=a.rounds,
            progress=lambda s: print(s, file=sys.stderr, flush=True),
        )
        # the calibration plans' runs of these rounds: one trace each
        traces, plans = [], []
        for job, c in zip(jobs, cands, strict=True):
            if c.source == "calibration":
                for r in range(a.rounds):
                    traces.append(str(job / "out" / f"round-{r + 1}" / "trace_executed.json"))
                    plans.append(str(tmp / c.name))
        cal, summary = calibrated_profile(a, plans, tmp, "calibrated", traces)
    text = report(a, iso, first, cal, cands, res, summary, time.time() - t0)
    print(text)
    if a.out:
        cmd = "python benchmarks/bench_fidelity.py " + " ".join(sys.argv[1:])
        Path(a.out).write_text(
            f"`{cmd.strip()}` (load average {os.getloadavg()[0]:.1f})\n\n{text}\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
