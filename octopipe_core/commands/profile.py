"""``octopipe profile``: measure per-layer costs with torch and write a profile file (the
user's own layers with ``--model``, else the stand-ins); with ``--links``, measure the
point-to-point links between ranks and write a cluster file."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from octopipe_core.commands.argtypes import int_in
from octopipe_core.commands.common import check_writable
from octopipe_core.errors import OctoPipeError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile",
        help="measure F/B/W time and memory of your layers (or the stand-ins) with torch",
        description="Measure each layer type of your model (--model module:function) or of the "
        "stand-in layers: forward, input-grad backward, weight-grad backward, activation, "
        "parameter, gradient and optimizer memory; write octopipe.profile/v1. With --links: "
        "measure point-to-point bandwidth and latency between ranks (under torchrun, or "
        "--nproc local gloo processes) and write octopipe.cluster/v1.",
    )
    p.add_argument(
        "--layers",
        metavar="TYPES",
        help="comma-separated layers in model order: family, name=family, with *N repeats, "
        "e.g. embedding,mamba2=mamba*4,attention,mlp,lm_head",
    )
    p.add_argument(
        "--model",
        default="",
        metavar="MODULE:FUNCTION",
        help="your model hook (builds the layers asked for; see the README), e.g. "
        "octopipe_core.executor.hf:llama_tiny; default: the stand-in layers",
    )
    p.add_argument("--hidden", type=int_in(1, 65_536), metavar="H")
    p.add_argument("--seq", type=int_in(1, 1_048_576), metavar="S")
    p.add_argument("--microbatch-size", type=int_in(1, 65_536), default=1, metavar="B")
    p.add_argument("--vocab", type=int_in(1, 10_000_000), default=256)
    p.add_argument("--dtype", choices=("float32", "float64", "bfloat16"), default="float32")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--repeats", type=int_in(1, 10_000), default=10)
    p.add_argument("--warmup", type=int_in(0, 1_000), default=2)
    p.add_argument("--threads", type=int_in(1, 1_024), default=1, help="torch CPU threads")
    p.add_argument("--name", default="measured")
    p.add_argument("--p2p-gbps", type=float, default=50.0)
    p.add_argument("--p2p-latency-us", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, metavar="FILE")
    p.add_argument("--force", action="store_true", help="overwrite an existing --out")
    g = p.add_argument_group("links (--links)")
    g.add_argument("--links", action="store_true", help="measure the links, write a cluster file")
    g.add_argument(
        "--nproc", type=int_in(2, MAX_LINK_PROCS), default=2,
        help="local gloo processes (not torchrun)",
    )  # fmt: skip
    g.add_argument(
        "--sizes-mib",
        default="",
        metavar="LIST",
        help="message sizes, comma-separated (default 4 bytes, 0.0625, 1, 4, 16)",
    )
    g.add_argument(
        "--iters", type=int_in(1, 10_000), default=10, help="round trips per message size"
    )
    g.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    g.add_argument(
        "--cluster",
        metavar="FILE|SAMPLE",
        help="write this cluster with its link figures replaced by the measured ones",
    )
    g.add_argument(
        "--simulate-nodes",
        type=int,
        default=1,
        metavar="N",
        help="split the local processes into N pretend nodes (to try the inter-node path)",
    )
    p.set_defaults(func=run)


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def run_links(args: argparse.Namespace) -> int:
    """``--links``: measure under torchrun, or spawn ``--nproc`` local gloo processes."""
    from octopipe_core.cluster import load_cluster, resolve_cluster
    from octopipe_core.executor.links import (
        DEFAULT_SIZES_MIB,
        LinksJob,
        run_links_local,
        run_links_torchrun,
    )

    try:
        sizes = tuple(float(v) for v in args.sizes_mib.split(",") if v.strip())
    except ValueError:
        raise OctoPipeError(
            f"profile --sizes-mib {args.sizes_mib!r}: not numbers; fix: e.g. 0.001,1,16"
        ) from None
    if any(v <= 0 for v in sizes) or args.iters < 1:
        raise OctoPipeError("profile --links: sizes and --iters must be > 0; fix: e.g. 1,16")
    base = resolve_cluster(args.cluster) if args.cluster else None
    job = LinksJob(
        out=args.out,
        sizes_mib=sizes or DEFAULT_SIZES_MIB,
        iters=args.iters,
        name=args.name,
        base=base,
        simulate_nodes=args.simulate_nodes,
    )
    if under_torchrun():
        if run_links_torchrun(job, args.backend) is None:
            return 0  # not rank 0
    else:
        if args.backend == "nccl":
            raise OctoPipeError("profile --links: nccl needs torchrun; fix: run under torchrun")
        run_links_local(job, args.nproc)
    c = load_cluster(args.out)
    print(f"wrote {args.out}: {c.nodes} node(s) x {c.gpus_per_node} rank(s)")
    for link in (c.intra_node, c.inter_node):
        print(
            f"  {link.name:<32} {link.bandwidth_gbytes_per_s:10.3f} GB/s  "
            f"{link.latency_us:10.2f} us"
        )
    return 0


MAX_LINK_PROCS = 64  # local gloo processes of --links


def run(args: argparse.Namespace) -> int:
    check_writable(args.out, args.force)  # before any measuring
    if args.links:
        return run_links(args)
    for k in ("layers", "hidden", "seq"):
        if getattr(args, k) is None:
            raise OctoPipeError(f"profile: --{k} is required; fix: e.g. --layers "
                                "embedding,mamba*2,lm_head --hidden 64 --seq 128")  # fmt: skip
    for k in ("hidden", "seq", "microbatch_size", "repeats", "vocab", "threads"):
        if getattr(args, k) < 1:
            raise OctoPipeError(f"profile: --{k.replace('_', '-')}: must be >= 1; fix: use 1+")
    import torch

    from octopipe_core.executor.models import ModelSettings
    from octopipe_core.executor.profiler import parse_layers, profile_layers
    from octopipe_core.profile import load_profile

    torch.set_num_threads(args.threads)
    layers = parse_layers(args.layers)
    if not args.model:  # the stand-in layers: what they would hold is known before building
        from octopipe_core.executor.models import check_memory

        check_memory(
            sorted({fam for _, fam in layers}), args.hidden, args.seq, args.vocab,
            args.microbatch_size, args.dtype,
        )  # fmt: skip
    st = ModelSettings(
        hidden=args.hidden,
        seq=args.seq,
        vocab=args.vocab,
        microbatch_size=args.microbatch_size,
        dtype=args.dtype,
        seed=args.seed,
    )
    if args.model:
        print(f"profiling {len(layers)} layers of {args.model} on {args.device}", flush=True)
    data = profile_layers(
        layers,
        st,
        args.device,
        args.repeats,
        args.warmup,
        args.name,
        args.p2p_gbps,
        args.p2p_latency_us,
        model=args.model,
        progress=lambda msg: print(f"  measuring {msg}", file=sys.stderr, flush=True),
    )
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    prof = load_profile(args.out)
    print(f"wrote {args.out}: {prof.num_layers} layers, {len(prof.layer_types)} types")
    for t in prof.layer_types:
        print(
            f"  {t.name:<18} F {t.forward_ms:8.3f} ms  B {t.backward_input_ms:8.3f} ms  "
            f"W {t.backward_weight_ms:8.3f} ms  act {t.activation_mib:8.3f} MiB  "
            f"B workspace {t.workspace_mib:8.3f} MiB  "
            f"weights+grads+optimizer {t.weight_mib:8.3f} MiB"
        )
    return 0
