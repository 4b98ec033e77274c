"""One-GPU check: measured Llama-3-8B-sized layers against the analytic cost model, one-GPU jobs
on NCCL against the single-process reference, and the simulator's predicted step time and peak
memory against measured runs.

1. Ceilings: a bf16 8192^3 matrix product (TFLOP/s) and a 2 GiB device-to-device copy (GB/s,
   bytes read + written), random data, median of 10 after 3 warm-ups.
2. Profile: ``octopipe profile --model bench_gpu:llama3_8b`` at the ``llama-3-8b`` preset's shape
   (hidden 4096, SwiGLU 14336, 32 heads / 8 kv, vocab 128,256, seq 8,192, micro-batch 1, bf16,
   sdpa attention); per layer type the measured F/B/W ms, activation MiB and parameters against
   ``costmodel``'s preset (analytic: 989 TFLOP/s x efficiency, an H800/H100-class GPU, whose
   dense bf16 rate the H200 shares).
3. NCCL correctness: ``octopipe run --backend nccl --check`` of float64 one-GPU jobs (the
   stand-in layers and ``hf:llama_tiny``; 1F1B and a 2-chunk interleaved plan): loss and
   gradient difference to the single-process reference (on the CPU).
4. Prediction: one-GPU plans (1F1B and ZB-H1) on the measured profile, exported with the same
   hook (bf16) and run on NCCL: predicted vs measured median step, simulated vs measured peak
   memory (the CUDA caching allocator's ``max_memory_allocated``).

One GPU gives one NCCL rank: NCCL refuses two ranks on one device, so point-to-point transfers
between pipeline ranks are not exercised here.

Run: ``python benchmarks/bench_gpu.py [--out FILE]`` (5-6 minutes on an H200; the report is
``docs/benchmarks-gpu.md``). ``--small --device cpu`` runs the same path at toy
sizes on gloo (a dry run of the script).
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
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from octopipe_core.costmodel import PRESETS, derive_profile, layer_params  # noqa: E402
from octopipe_core.plan import save_plan  # noqa: E402
from octopipe_core.profile import load_profile  # noqa: E402
from octopipe_core.schedules import build_plan  # noqa: E402
from octopipe_core.simulator import simulate  # noqa: E402

HOOK = "bench_gpu:llama3_8b"
LLAMA_TINY = "octopipe_core.executor.hf:llama_tiny"
ENDS = ("embedding", "lm_head")


def llama3_8b(
    layers: list[int], model_families: list[str], hidden: int, vocab: int, seq: int, seed: int
) -> list[nn.Module]:
    """Model hook: Llama-3-8B's decoder layer shape at any hidden size (head size 128, 4 query
    heads per kv head, SwiGLU width 3.5 x hidden); every middle layer is a decoder layer."""
    from transformers import LlamaConfig

    from octopipe_core.executor.hf import build_hf_layers, llama_parts

    heads = max(1, hidden // 128)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 7 // 2,
        num_hidden_layers=max(1, sum(f not in ENDS for f in model_families)),
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 4),
        max_position_embeddings=max(seq, 128),
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    cfg._attn_implementation = "sdpa"
    return build_hf_layers(llama_parts(cfg), layers, model_families, seed)


def octopipe(*args: str, timeout: float = 900) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "benchmarks")])
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "octopipe_core", *args], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=timeout)  # fmt: skip
    say(f"  octopipe {args[0]} ... {time.perf_counter() - t:.1f} s (exit {p.returncode})")
    if p.returncode != 0:
        tail = p.stdout[-2000:] + p.stderr[-3000:]
        raise RuntimeError(f"octopipe {' '.join(args)} failed:\n{tail}")
    return p.stdout


def say(msg: str) -> None:
    print(msg, flush=True)


def timed_ms(fn: Any, dev: torch.device, reps: int = 10, warm: int = 3) -> float:
    for _ in range(warm):
        fn()
    out = []
    for _ in range(reps):
        if dev.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(out)


def ceilings(dev: torch.device, small: bool) -> list[str]:
    n = 1024 if small else 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    ms = timed_ms(lambda: a @ b, dev)
    src = torch.randn((64 if small else 2048) * 2**18, device=dev)  # 4 B each: MiB x 2^18
    dst = torch.empty_like(src)
    cms = timed_ms(lambda: dst.copy_(src), dev)
    gb = 2 * src.numel() * 4 / 1e9
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    return [
        f"* device: {name}; torch {torch.__version__}"
        + (f", CUDA {torch.version.cuda}" if dev.type == "cuda" else ""),
        f"* bf16 {n}^3 matrix product: {2 * n**3 / ms / 1e9:,.1f} TFLOP/s ({ms:.3f} ms)",
        f"* device copy of {src.numel() * 4 / 2**30:.2f} GiB: {gb / cms * 1e3:,.0f} GB/s "
        "(read + written)",
    ]


def profile_section(args: argparse.Namespace, tmp: Path) -> tuple[list[str], Path]:
    layers = f"embedding,block=transformer_block*{args.blocks},lm_head"
    prof_path = tmp / "llama.json"
    t = time.perf_counter()
    octopipe("profile", "--model", HOOK, "--layers", layers, *args.sizes, "--dtype", "bfloat16",
             "--device", args.device, "--repeats", str(args.repeats), "--warmup", "3",
             "--threads", str(min(8, os.cpu_count() or 1)),
             "--name", "llama-3-8b-shape-measured", "--out", str(prof_path))  # fmt: skip
    wall = time.perf_counter() - t
    prof = load_profile(prof_path)
    cfg = PRESETS["llama-3-8b"]
    ana = derive_profile(cfg)["layer_types"]
    fams = ["embedding", "transformer_block", "lm_head"]
    with torch.device("meta"):
        built = llama3_8b([0, 1, 2], fams, args.hidden, args.vocab, args.seq, 0)
    rows = [
        f"`octopipe profile` of {len(prof.layers)} layers ({layers}) took {wall:.0f} s. "
        f"Analytic: `costmodel` preset `llama-3-8b` (hidden {cfg.hidden}, seq {cfg.seq_len}); "
        "ratio = measured / analytic.",
        "",
        "| layer type | F ms meas / analytic | B ms meas / analytic | W ms meas / analytic "
        "| F+B+W ratio | activation MiB meas / analytic | B workspace MiB meas "
        "| parameters M meas / analytic |",
        "|---|---|---|---|---|---|---|---|",
    ]
    tm = prof.type_map()
    for name, fam, mod in zip(("embedding", "block", "lm_head"), fams, built, strict=True):
        m, a = tm[name], ana[fam]
        tot_m = m.forward_ms + m.backward_input_ms + m.backward_weight_ms
        tot_a = a["forward_ms"] + a["backward_input_ms"] + a["backward_weight_ms"]
        n_meas = sum(p.numel() for p in mod.parameters()) / 1e6
        n_ana = layer_params(cfg, fam) / 1e6
        rows.append(
            f"| {fam} | {m.forward_ms:.2f} / {a['forward_ms']:.2f} "
            f"| {m.backward_input_ms:.2f} / {a['backward_input_ms']:.2f} "
            f"| {m.backward_weight_ms:.2f} / {a['backward_weight_ms']:.2f} "
            f"| {tot_m / tot_a:.2f} | {m.activation_mib:,.0f} / {a['activation_mib']:,.0f} "
            f"| {m.workspace_mib:,.0f} | {n_meas:,.1f} / {n_ana:,.1f} |"
        )
    return rows, prof_path


def nccl_checks(args: argparse.Namespace, tmp: Path) -> list[str]:
    rows = ["| model | plan (1 GPU) | loss diff | max grad diff | result |", "|" + "---|" * 5]
    stand = "embedding,mamba*2,attention,mlp,moe,mamba,mlp,attention,transformer_block,lm_head"
    for label, model, layers in (
        ("stand-in layers", "", stand),
        ("hf:llama_tiny", LLAMA_TINY, "embedding,b=attention*4,lm_head"),
    ):
        prof = tmp / "small.json"
        model_args = ["--model", model] if model else []
        octopipe("profile", "--layers", layers, *model_args, "--hidden", "64", "--seq", "32",
                 "--vocab", "128", "--repeats", "2", "--warmup", "1",
                 "--out", str(prof))  # fmt: skip
        for sched, extra in (("1f1b", []), ("interleaved", ["--chunks", "2"])):
            plan = tmp / f"small-{sched}.json"
            octopipe("simulate", "--profile", str(prof), "--schedule", sched, "--devices", "1",
                     "--microbatches", "4", *extra, "--out", str(plan), "--force")  # fmt: skip
            job = tmp / f"check-{label.replace(':', '-').replace(' ', '-')}-{sched}"
            octopipe("export", str(plan), "--out", str(job), *model_args, "--hidden", "64",
                     "--seq", "32", "--vocab", "128", "--dtype", "float64",
                     "--backend", args.backend, "--steps", "1")  # fmt: skip
            try:
                out = octopipe("run", str(job), "--check", "--backend", args.backend)
                res = "OK" if "check: OK" in out else "MISMATCH"
            except RuntimeError as e:
                out, res = str(e), "MISMATCH"
            loss = _after(out, "loss_diff ")
            grad = _after(out, "max_abs_grad_diff ")
            rows.append(f"| {label} | {sched} | {loss} | {grad} | {res} |")
    return rows


def _after(text: str, key: str) -> str:
    for line in text.splitlines():
        if key in line:
            return line.split(key, 1)[1].split()[0].rstrip(";")
    return "-"


def prediction(args: argparse.Namespace, tmp: Path, prof_path: Path) -> list[str]:
    prof = load_profile(prof_path)
    rows = [
        f"{args.microbatches} micro-batches of {args.seq} tokens, {args.steps} measured steps "
        f"after 2 warm-ups, AdamW on float32 master weights, "
        f"`octopipe run --backend {args.backend}`.",
        "",
        "| plan (1 GPU) | predicted step ms | measured median ms (min-max) | error "
        "| simulated peak GiB | measured peak GiB | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for sched in ("1f1b", "zb-h1"):
        plan = build_plan(prof, sched, 1, args.microbatches)
        sim = simulate(prof, plan)
        path = tmp / f"pred-{sched}.json"
        save_plan(plan, path, prof)
        job = tmp / f"pred-{sched}"
        octopipe("export", str(path), "--out", str(job), "--model", HOOK, *args.sizes,
                 "--dtype", "bfloat16", "--backend", args.backend, "--steps", str(args.steps),
                 "--warmup", "2", "--optimizer", "adamw")  # fmt: skip
        # more CPU threads for building the 1.9-billion-parameter model on the host (the
        # GPU's steps do not use them); an edited job needs --trust
        cfg_path = job / "executor_config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["runtime"]["threads"] = min(8, os.cpu_count() or 1)
        cfg_path.write_text(json.dumps(cfg))
        octopipe("run", str(job), "--backend", args.backend, "--trust")
        res = json.loads((job / "out" / "result.json").read_text())
        ms = res["step_ms"][res["warmup"] :]
        meas = statistics.median(ms)
        peak = max((g for g in res["peak_memory_gib"] if g is not None), default=0.0)
        sim_peak = sim.peak_memory_gib[0]
        rows.append(
            f"| {sched} | {sim.step_time_ms:,.1f} | {meas:,.1f} ({min(ms):,.1f}-{max(ms):,.1f}) "
            f"| {sim.step_time_ms / meas - 1:+.1%} | {sim_peak:.2f} | "
            + (f"{peak:.2f} | {sim_peak / peak - 1:+.1%} |" if peak else "- (no CUDA) | - |")
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--small", action="store_true", help="toy sizes (a dry run)")
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", default="", help="also write the report here (Markdown)")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: no CUDA device; fix: run on a GPU machine, or --small --device cpu")
        return 2
    args.backend = "nccl" if args.device == "cuda" else "gloo"
    args.hidden, args.seq, args.vocab = (256, 256, 1024) if args.small else (4096, 8192, 128256)
    args.sizes = ["--hidden", str(args.hidden), "--seq", str(args.seq), "--vocab",
                  str(args.vocab), "--microbatch-size", "1"]  # fmt: skip
    dev = torch.device(args.device)
    lines = ["# One-GPU check", "", f"Command: `python benchmarks/bench_gpu.py"
             f"{' --small --device cpu' if args.small else ''}`.", ""]  # fmt: skip
    failed = 0
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        prof_path: Path | None = None
        for title, fn in (
            ("1. Ceilings", lambda: ceilings(dev, args.small)),
            ("2. Measured layer profile against the analytic cost model", None),
            ("3. NCCL jobs against the single-process reference (float64)",
             lambda: nccl_checks(args, tmp)),
            ("4. Predicted against measured step time and peak memory", None),
        ):  # fmt: skip
            say(f"== {title}")
            lines += [f"## {title}", ""]
            try:
                if title.startswith("2."):
                    rows, prof_path = profile_section(args, tmp)
                elif title.startswith("4."):
                    if prof_path is None:
                        raise RuntimeError("no measured profile (section 2 failed)")
                    rows = prediction(args, tmp, prof_path)
                else:
                    assert fn is not None
                    rows = fn()
            except Exception:  # report and go on: one call of the device should say everything
                failed += 1
                rows = ["```", traceback.format_exc()[-3000:], "```"]
            say("\n".join(rows))
            lines += [*rows, ""]
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("\n".join(lines))
    say(f"{failed} section(s) failed" + (f"; wrote {args.out}" if args.out else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
