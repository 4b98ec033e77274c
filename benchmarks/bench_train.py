"""Executor step time and simulator replay error of a PP x DP training job (gloo, CPU).

Runs the same plan (ZB-H1, balanced, 2 pipeline devices) as an exported training job at DP 1
(2 ranks) and DP 2 (4 ranks; AdamW, clipping, per-stage gradient all-reduce launched after each
stage's last W), ``--warmup`` + ``--steps`` steps each, and reports the median step time and
tokens/s. Replay: the simulator fed what was measured in the DP 2 run (per (stage, kind) op
durations and the P2P latency, ``replay_profile``), deployed on a one-node cluster whose
link has the measured P2P latency and the bandwidth that makes the model's all-reduce as long
as a measured one (micro-benchmark on the same 4 ranks, both DP groups at once, the largest
stage's gradient size), and whose memory bandwidth is fitted to the measured optimizer step;
its step time against the measured median step. The DP 1 run is replayed the same way
without the cluster (pipeline only).

With ``--calibrated``, each run is also predicted from a profile that ``octopipe calibrate
--dp`` fitted at that DP on two other plans (``calibrated_ms``, ``calibrated_err``), against
the isolated-layer profile it starts from (``isolated_ms``, ``isolated_err``).

Run: ``python benchmarks/bench_train.py [--calibrated]`` (prints JSON lines; about 2 minutes
on 2 cores, 4 with ``--calibrated``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from octopipe_core.cluster import Cluster  # noqa: E402
from octopipe_core.commands.run import launch  # noqa: E402
from octopipe_core.executor.export import export_job  # noqa: E402
from octopipe_core.executor.harness import leave_process_group  # noqa: E402
from octopipe_core.layout import GRAD_FRACTION, deploy  # noqa: E402
from octopipe_core.plan import Plan  # noqa: E402
from octopipe_core.profile import FORMAT, Profile  # noqa: E402
from octopipe_core.schedules import build_plan  # noqa: E402
from octopipe_core.simulator import simulate  # noqa: E402

LAYERS = ["embedding", "attention", "mlp", "attention", "mlp", "attention", "mlp", "lm_head"]


# ---- replay: the simulator fed one run's own measured op durations ------------------------
def compute_ops(
    res: dict[str, Any], steps: list[int], with_mb: bool = False
) -> list[tuple[Any, ...]]:
    """(rank, stage, kind, [mb,] start_s, busy_ms) of each compute op: the rank's time since
    its previous compute op (posting comm ops included), waits excluded."""
    out: list[tuple[Any, ...]] = []
    by_rank_step: dict[tuple[int, int], list[Any]] = {}
    for rec in res["records"]:
        by_rank_step.setdefault((rec[0], rec[1]), []).append(rec)
    for (rank, step), recs in by_rank_step.items():
        if step not in steps:
            continue
        prev = recs[0][3]
        for _, _, op, start, end, wait in recs:
            if "SEND" in op or "RECV" in op:
                continue
            kind = "".join(c for c in op if c.isalpha())
            stage = int(op[: len(op) - len(op.lstrip("0123456789"))])
            ms = (end - prev - wait) * 1e3
            if with_mb:
                out.append((rank, stage, kind, op[len(str(stage)) + len(kind) :], start, ms))
            else:
                out.append((rank, stage, kind, start, ms))
            prev = end
    return out


def effective_durations(res: dict[str, Any], steps: list[int]) -> dict[tuple[int, str], float]:
    """Mean per (stage, kind) of each compute op's busy time (ms), waits excluded."""
    per: dict[tuple[int, str], list[float]] = {}
    for _, stage, kind, _, ms in compute_ops(res, steps):
        per.setdefault((stage, kind), []).append(ms)
    return {k: statistics.mean(v) for k, v in per.items()}


def transfer_latency_us(res: dict[str, Any], steps: list[int]) -> float:
    """Mean time (10% trimmed) from a send's post to the end of a receive the consumer waited
    for. The distribution is bimodal on a loaded CPU (tens of us, or a scheduler slice when the
    sender's or receiver's I/O thread must wait for a core), so the mean, not the median, is
    the constant latency that reproduces the step time."""
    posted: dict[tuple[int, str], float] = {}
    lat: list[float] = []
    recs = [r for r in res["records"] if r[1] in steps]
    for _, step, op, _, end, _ in recs:
        if "SEND" in op:
            posted[(step, op.replace("SEND", "MSG"))] = end
    for _, step, op, start, _, wait in recs:
        if wait <= 1e-4 or "SEND" in op or "RECV" in op:  # waited at least 0.1 ms
            continue
        kind = "".join(c for c in op if c.isalpha())
        stage = int(op[: len(op) - len(op.lstrip("0123456789"))])
        mb = op[len(str(stage)) + len(kind) :]
        src = f"{stage - 1}MSG_F{mb}" if kind == "F" else f"{stage + 1}MSG_B{mb}"
        if (step, src) in posted:
            lat.append((start - posted[(step, src)]) * 1e6)
    if not lat:
        return 50.0
    lat.sort()
    cut = len(lat) // 10
    return max(0.0, statistics.mean(lat[cut : len(lat) - cut] or lat))


def replay_profile(
    plan: Plan, base: Profile, dur: dict[tuple[int, str], float], lat_us: float
) -> Profile:
    """One layer type per layer; each stage's measured times spread evenly over its layers."""
    types: dict[str, dict[str, Any]] = {}
    for s, (lo, hi) in enumerate(plan.partition):
        n = hi - lo
        f = dur.get((s, "F"), 0.0)
        if (s, "BW") in dur:
            b, w = dur[(s, "BW")], 0.0
        else:
            b, w = dur.get((s, "B"), 0.0), dur.get((s, "W"), 0.0)
        for i in range(lo, hi):
            types[f"L{i}"] = {
                "family": base.layer(i).family,
                "forward_ms": f / n,
                "backward_input_ms": b / n,
                "backward_weight_ms": w / n if w / n >= 1e-6 else 0.0,  # profile resolution
                "activation_mib": 0.0,
                "weight_mib": 0.0,
                "output_mib": 1e-9,
            }
    return Profile.from_dict(
        {
            "format": FORMAT,
            "name": "replay",
            "tokens_per_microbatch": base.tokens_per_microbatch,
            "device": {
                "name": "replay",
                "memory_gib": 1e5,  # the largest a profile accepts: no cap
                "p2p_gbps": 1e6,
                "p2p_latency_us": lat_us,
            },
            "layer_types": types,
            "layers": [f"L{i}" for i in range(base.num_layers)],
        }
    )


def base_profile() -> Profile:
    lt = {"forward_ms": 1.0, "backward_input_ms": 1.0, "backward_weight_ms": 1.0,
          "activation_mib": 0.0, "weight_mib": 0.0, "output_mib": 0.0}  # fmt: skip
    return Profile.from_dict(
        {
            "format": FORMAT,
            "name": "bench-train",
            "tokens_per_microbatch": 1,
            "layer_types": {f: {**lt, "family": f} for f in dict.fromkeys(LAYERS)},
            "layers": LAYERS,
        }
    )


def layer_grad_mib(args: argparse.Namespace) -> list[float]:
    """float32 gradient MiB of each stand-in layer at the benchmark's sizes."""
    from octopipe_core.executor.models import ModelSettings, build_layers

    st = ModelSettings(hidden=args.hidden, seq=args.seq, vocab=args.vocab, dtype="float32")
    layers = build_layers(LAYERS, st.resolved(LAYERS))
    return [sum(p.numel() for p in m.parameters()) * 4 / 2**20 for m in layers if m is not None]


def run_job(plan: Plan, args: argparse.Namespace, dp: int, tmp: Path) -> dict[str, Any]:
    model = {"hidden": args.hidden, "seq": args.seq, "vocab": args.vocab,
             "microbatch_size": args.mbs, "dtype": "float32"}  # fmt: skip
    job = export_job(
        plan, base_profile(), tmp / f"job-dp{dp}", model=model,
        runtime={"steps": args.steps, "warmup": args.warmup, "timeout_s": 120},
        layout={"dp": dp, "order": "tp-pp-dp"}, train={"lr": 1e-3},
    )  # fmt: skip
    # ranks 0..1 are replica 0's devices; pinned to core rank % 2, both replicas of a device
    # share its core (as the simulator's devices, each with its own timeline)
    env = {"OCTOPIPE_PIN": "1", "OMP_NUM_THREADS": "1"}
    proc = launch(job / "executor_config.json", job / "out", 2 * dp, [], 900, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"job dp{dp} failed:\n{proc.stderr[-3000:]}")
    return json.loads((job / "out" / "result.json").read_text())  # type: ignore[no-any-return]


def _allreduce_worker(rank: int, port: int, sizes: list[int], reps: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from octopipe_core.executor.mesh import JobLayout, build_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=4, timeout=timedelta(seconds=120))  # fmt: skip
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank % 2]})
    mesh = build_mesh(JobLayout(pp=2, dp=2, order="tp-pp-dp"), "cpu")
    times = {}
    for n in sizes:
        t = torch.zeros(n)
        ms = []
        for _ in range(reps):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t, group=mesh.dp_group)
            ms.append((time.perf_counter() - t0) * 1e3)
        times[n] = statistics.median(ms)
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    leave_process_group()


def allreduce_ms(grad_mib: float) -> tuple[float, float]:
    """Measured median ms of a 2-member all-reduce of ``grad_mib`` (both DP groups at once)
    and the byte count it moved."""
    import torch.multiprocessing as mp

    from octopipe_core.executor.harness import free_port

    big = max(1, int(grad_mib * 2**20 / 4))
    with tempfile.TemporaryDirectory() as td:
        out = os.path.join(td, "t.json")
        mp.spawn(_allreduce_worker, args=(free_port(), [1, big], 30, out), nprocs=4, join=True)
        times = {int(k): v for k, v in json.loads(Path(out).read_text()).items()}
    return times[big], big * 4.0


def replay(
    plan: Plan, res: dict[str, Any], grad_mib: list[float], allreduce: tuple[float, float] | None
) -> dict[str, float]:
    """Simulated step of a run from its own measured durations (see the docstring); with
    ``allreduce`` (measured ms, bytes) deployed as DP 2 on a fitted one-node cluster."""
    w = res["warmup"]
    steps = list(range(w, len(res["step_ms"])))
    dur = effective_durations(res, steps)
    # messages are matched by name: use replica 0's ranks (0 and 1 in the tp-pp-dp order)
    lat_us = transfer_latency_us({"records": [r for r in res["records"] if r[0] < 2]}, steps)
    prof = replay_profile(plan, base_profile(), dur, lat_us).to_dict()
    for i, name in enumerate(prof["layers"]):
        prof["layer_types"][name]["weight_mib"] = grad_mib[i] / GRAD_FRACTION
    prof["device"]["memory_gib"] = 1e5  # the largest a profile accepts: no cap
    p = Profile.from_dict(prof)
    sim_pp = simulate(p, plan)
    if allreduce is None:
        return {"replay_ms": sim_pp.step_time_ms, "replay_compute_end_ms": sim_pp.compute_end_ms,
                "p2p_latency_us": lat_us}  # fmt: skip
    opt = [b - a for _, step, name, a, b in res["tail"] if name == "OPT" and step in steps]
    opt_ms = statistics.median(opt) * 1e3
    per_dev = [sum(grad_mib[i] for i in range(*plan.partition[s]))
               for s in range(plan.num_stages)]  # fmt: skip
    static = max(sum(per_dev[s] for s in range(plan.num_stages) if plan.placement[s] == d)
                 for d in range(plan.num_devices)) / GRAD_FRACTION  # fmt: skip
    hbm = static * 1.75 * 2**20 / (opt_ms / 1e3 * 0.6 * 1e9)
    # the ring all-reduce of 2 members costs wire + 2 latencies: the link's latency is the
    # measured P2P latency, its bandwidth makes the model's all-reduce the measured one
    ar_ms, ar_bytes = allreduce
    bw = ar_bytes / 1e9 / max(1e-6, (ar_ms - 2 * lat_us / 1e3) / 1e3)
    cluster = Cluster.from_dict(
        {"format": "octopipe.cluster/v1", "name": "this-cpu", "nodes": 1, "gpus_per_node": 4,
         "gpu": {"name": "cpu-rank", "memory_gib": 1e4, "hbm_gbytes_per_s": hbm},
         "intra_node": {"name": "gloo", "bandwidth_gbytes_per_s": bw, "latency_us": lat_us},
         "inter_node": {"name": "gloo", "bandwidth_gbytes_per_s": bw, "latency_us": lat_us}}
    )  # fmt: skip
    sim = simulate(deploy(p, cluster, pp=2, dp=2, order="tp-pp-dp"), plan)
    return {"replay_ms": sim.step_time_ms, "replay_compute_end_ms": sim.compute_end_ms,
            "replay_pipeline_only_ms": sim_pp.step_time_ms,
            "replay_exposed_tail_ms": sim.exposed_tail_ms, "optimizer_ms": opt_ms,
            "allreduce_ms": ar_ms, "p2p_latency_us": lat_us, "fitted_gbytes_per_s": bw}  # fmt: skip


def tail_parts_ms(res: dict[str, Any], steps: list[int]) -> dict[str, float]:
    """Median over steps and ranks of the loop's tail parts: the wait for the DP reductions
    (from the rank's last compute op), the small all-reduce, the optimizer."""
    last: dict[tuple[int, int], float] = {}
    for rank, step, _, _, end, _ in res["records"]:
        last[(rank, step)] = max(last.get((rank, step), 0.0), end)
    parts: dict[str, list[float]] = {"dp_wait_ms": [], "sync_ms": [], "optimizer_ms": []}
    sync_start: dict[tuple[int, int], float] = {}
    for rank, step, name, a, b in res["tail"]:
        if step not in steps:
            continue
        if name == "SYNC":
            sync_start[(rank, step)] = a
            parts["sync_ms"].append((b - a) * 1e3)
        elif name == "OPT":
            parts["optimizer_ms"].append((b - a) * 1e3)
    for key, a in sync_start.items():
        parts["dp_wait_ms"].append((a - last[key]) * 1e3)
    return {k: statistics.median(v) for k, v in parts.items() if v}


def exposed_tail_ms(res: dict[str, Any], steps: list[int]) -> float:
    """Median over steps of (step end - last compute op end on any rank)."""
    out = []
    for i in steps:
        last = max(r[4] for r in res["records"] if r[1] == i)
        out.append((res["step_starts"][i] + res["step_ms"][i] / 1e3 - last) * 1e3)
    return statistics.median(out)


def calibrated_ms(plan: Plan, args: argparse.Namespace, dp: int, tmp: Path) -> dict[str, Any]:
    """The step of ``plan`` at ``dp`` simulated on a profile calibrated at that DP: ``octopipe
    profile`` of the stand-in layers (the prior), then ``octopipe calibrate --dp`` on two
    other plans (1F1B on its balanced partition, interleaved 1F1B on the uniform one)."""
    from octopipe_core.plan import save_plan
    from octopipe_core.profile import load_profile

    flags = ["--hidden", str(args.hidden), "--seq", str(args.seq), "--microbatch-size",
             str(args.mbs), "--vocab", str(args.vocab), "--dtype", "float32"]  # fmt: skip
    iso_path = tmp / "isolated.json"
    if not iso_path.exists():
        _cli(["profile", "--layers", ",".join(LAYERS), *flags, "--repeats", "15", "--warmup",
              "3", "--name", "bench-train", "--out", str(iso_path)])  # fmt: skip
    iso = load_profile(iso_path)
    paths = []
    for sched, part in (("1f1b", "balanced"), ("interleaved", "uniform")):
        path = tmp / f"cal-dp{dp}-{sched}.json"
        save_plan(build_plan(iso, sched, 2, args.microbatches, partition=part), path, iso)
        paths.append(str(path))
    out = tmp / f"calibrated-dp{dp}.json"
    argv = ["calibrate", *paths, "--out", str(out), "--dp", str(dp), *flags, "--steps",
            str(args.steps), "--warmup", str(args.warmup), "--json"]  # fmt: skip
    summary = json.loads(_cli(argv))
    cal = load_profile(out)
    return {
        "calibrated_ms": simulate(cal, plan).step_time_ms,
        "isolated_ms": simulate(iso, plan).step_time_ms,
        "calibration": {k: summary[k] for k in ("runtime", "step_error_pct")},
    }


def _cli(argv: list[str]) -> str:
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "octopipe_core", *argv], cwd=ROOT,
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"octopipe {argv[0]} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--mbs", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument(
        "--calibrated",
        action="store_true",
        help="also predict each run from a profile calibrated at its DP (octopipe calibrate)",
    )
    args = ap.parse_args()
    t0 = time.time()
    plan = build_plan(base_profile(), "zb-h1", 2, args.microbatches, partition="balanced")
    grad_mib = layer_grad_mib(args)
    tokens = args.microbatches * args.mbs * args.seq
    rows = {}
    with tempfile.TemporaryDirectory() as td:
        for dp in (1, 2):
            res = run_job(plan, args, dp, Path(td))
            w = res["warmup"]
            meas = res["step_ms"][w:]
            med = statistics.median(meas)
            tail = exposed_tail_ms(res, list(range(w, len(res["step_ms"]))))
            parts = tail_parts_ms(res, list(range(w, len(res["step_ms"]))))
            rows[dp] = {"dp": dp, "ranks": 2 * dp, "step_ms_median": med,
                        "step_ms_p25_p75": statistics.quantiles(meas, n=4)[::2],
                        "tokens_per_s": tokens * dp / med * 1e3,
                        "exposed_tail_ms": tail, "tail_parts": parts}  # fmt: skip
            ar = None
            if dp == 2:
                stage_mib = max(sum(grad_mib[i] for i in range(*r)) for r in plan.partition)
                ar = allreduce_ms(stage_mib)
            rows[dp] |= replay(plan, res, grad_mib, ar)
            rows[dp]["replay_err"] = rows[dp]["replay_ms"] / med - 1
            rows[dp]["compute_span_ms"] = med - tail
            rows[dp]["compute_replay_err"] = rows[dp]["replay_compute_end_ms"] / (med - tail) - 1
            if args.calibrated:
                rows[dp] |= calibrated_ms(plan, args, dp, Path(td))
                rows[dp]["calibrated_err"] = rows[dp]["calibrated_ms"] / med - 1
                rows[dp]["isolated_err"] = rows[dp]["isolated_ms"] / med - 1
            print(json.dumps(rows[dp]), flush=True)
    print(json.dumps({"wall_s": time.time() - t0, "load": os.getloadavg()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
