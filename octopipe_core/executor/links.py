"""Measure point-to-point links between ranks and write them as an ``octopipe.cluster/v1`` file.

Ranks are grouped into nodes by ``OCTOPIPE_NODE_NAME``, else the host name plus torchrun's node
rank (``GROUP_RANK``). One pair of ranks on the same node measures the intra-node link, one pair
on different nodes (the same local rank on each, as one NIC per GPU serves it) the inter-node
link; the pairs run one after the other while the other ranks wait. Each pair ping-pongs
messages of several sizes (``dist.send`` / ``dist.recv``; CUDA tensors on NCCL, timed between
synchronizations): the one-way time is half the round trip; the latency is that of the smallest
message, the bandwidth (GB/s = 1e9 B/s, one direction) the least-squares slope over the
messages of at least 1 MiB. A link class with no pair (one node, or one rank per node) is
copied from the other and marked as not measured in ``source``.

Run it under torchrun on the real machines (``torchrun --nnodes 2 --nproc-per-node 8 -m
octopipe_core profile --links --out cluster.json``) or spawn local gloo processes
(``octopipe profile --links --nproc 2``).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from octopipe_core.cluster import CLUSTER_FORMAT, Cluster
from octopipe_core.errors import OctoPipeError

MIB = 2**20
DEFAULT_SIZES_MIB = (4 / MIB, 1 / 16, 1.0, 4.0, 16.0)


@dataclass(frozen=True)
class LinkFit:
    """One measured link class: pair of ranks, samples (bytes, one-way seconds), the fit."""

    pair: tuple[int, int]
    samples: tuple[tuple[int, float], ...]
    bandwidth_gbytes_per_s: float
    latency_us: float


def node_name() -> str:
    """This process's node: ``OCTOPIPE_NODE_NAME``, else host name / torchrun node rank."""
    forced = os.environ.get("OCTOPIPE_NODE_NAME")
    if forced:
        return forced
    group = os.environ.get("GROUP_RANK")
    return socket.gethostname() + (f"/{group}" if group is not None else "")


def fit_link(samples: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """(bandwidth GB/s, latency us) from (bytes, one-way seconds) samples.

    >>> fit_link([(4, 10e-6), (2**20, 10e-6 + 2**20 / 5e9), (2**22, 10e-6 + 2**22 / 5e9)])
    (5.0, 10.0)
    """
    small = min(samples)
    latency_us = small[1] * 1e6
    big = [(b, t) for b, t in samples if b >= MIB] or [max(samples)]
    if len(big) >= 2:
        mb = statistics.fmean(b for b, _ in big)
        mt = statistics.fmean(t for _, t in big)
        var = sum((b - mb) ** 2 for b, _ in big)
        slope = sum((b - mb) * (t - mt) for b, t in big) / var  # seconds per byte
        if slope <= 0:  # noise: fall back to the largest message
            slope = max(big)[1] / max(big)[0]
    else:
        slope = big[0][1] / big[0][0]
    return round(1.0 / slope / 1e9, 4), round(latency_us, 3)


def _pingpong(
    peer: int, first: bool, sizes: Sequence[int], iters: int, device: torch.device
) -> list[tuple[int, float]]:
    out: list[tuple[int, float]] = []
    for nbytes in sizes:
        buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device)
        times = []
        for i in range(iters + 2):  # two warm-up round trips
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t = time.perf_counter()
            if first:
                dist.send(buf, dst=peer)
                dist.recv(buf, src=peer)
            else:
                dist.recv(buf, src=peer)
                dist.send(buf, dst=peer)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i >= 2:
                times.append(time.perf_counter() - t)
        out.append((buf.numel() * 4, statistics.median(times) / 2))
    return out


def copy_bandwidth_gbytes_per_s(device: torch.device, size_mib: float = 64.0) -> float:
    """Device-memory copy bandwidth (read + write bytes / s, GB/s), median of 5 copies."""
    n = int(size_mib * MIB // 4)
    a = torch.ones(n, device=device)
    b = torch.empty_like(a)
    times = []
    for _ in range(6):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        b.copy_(a)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t)
    return round(2 * n * 4 / statistics.median(times[1:]) / 1e9, 2)


def pick_pairs(nodes: list[str]) -> dict[str, tuple[int, int] | None]:
    """The rank pair measured for each link class (None: no such pair in this job).

    >>> pick_pairs(["a", "a", "b", "b"])
    {'intra_node': (0, 1), 'inter_node': (0, 2)}
    >>> pick_pairs(["a", "b"])
    {'intra_node': None, 'inter_node': (0, 1)}
    """
    intra = next(((0, r) for r in range(1, len(nodes)) if nodes[r] == nodes[0]), None)
    if intra is None:
        seen: dict[str, int] = {}
        for r, n in enumerate(nodes):
            if n in seen:
                intra = (seen[n], r)
                break
            seen[n] = r
    others = [r for r in range(len(nodes)) if nodes[r] != nodes[0]]
    inter = None
    if others:
        local = [r for r in range(len(nodes)) if nodes[r] == nodes[0]].index(0)
        other = nodes[others[0]]
        on_other = [r for r in range(len(nodes)) if nodes[r] == other]
        inter = (0, on_other[min(local, len(on_other) - 1)])
    return {"intra_node": intra, "inter_node": inter}


def measure_links(
    sizes_mib: Sequence[float] = DEFAULT_SIZES_MIB, iters: int = 10
) -> dict[str, Any] | None:
    """Run on every rank of an initialised process group; rank 0 gets the measurements:
    ``{"nodes": [node of each rank], "links": {class: LinkFit | None}, "device": ...}``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        raise OctoPipeError("profile --links: needs at least 2 ranks; fix: --nproc 2 or torchrun")
    device = _device()
    names: list[Any] = [None] * world
    dist.all_gather_object(names, node_name())
    pairs = pick_pairs([str(n) for n in names])
    sizes = [max(4, int(s * MIB)) for s in sizes_mib]
    fits: dict[str, LinkFit | None] = {}
    for cls, pair in pairs.items():
        dist.barrier()
        samples: list[tuple[int, float]] = []
        if pair is not None and rank in pair:
            peer = pair[1] if rank == pair[0] else pair[0]
            samples = _pingpong(peer, rank == pair[0], sizes, iters, device)
        got: list[Any] = [None] * world
        dist.all_gather_object(got, samples)
        if pair is not None:
            s = tuple(got[pair[0]])
            bw, lat = fit_link(s)
            fits[cls] = LinkFit(pair, s, bw, lat)
        else:
            fits[cls] = None
    hbm = copy_bandwidth_gbytes_per_s(device)
    dist.barrier()
    if rank != 0:
        return None
    return {"nodes": [str(n) for n in names], "links": fits, "device": device, "hbm": hbm}


def _device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def cluster_from_links(
    res: dict[str, Any], name: str = "measured", base: Cluster | None = None
) -> dict[str, Any]:
    """The ``octopipe.cluster/v1`` dict of a ``measure_links`` result; with ``base``, that
    cluster with its link figures replaced by the measured ones."""
    from octopipe_core.executor.profiler import device_info

    nodes = res["nodes"]
    per_node: dict[str, int] = {}
    for n in nodes:
        per_node[n] = per_node.get(n, 0) + 1
    fits: dict[str, LinkFit | None] = res["links"]
    measured = {k: v for k, v in fits.items() if v is not None}
    if not measured:
        raise OctoPipeError("profile --links: no rank pair measured; fix: run 2+ ranks")
    backend = dist.get_backend() if dist.is_initialized() else "gloo"
    links: dict[str, dict[str, Any]] = {}
    notes = []
    for cls in ("intra_node", "inter_node"):
        fit = fits.get(cls) or next(iter(measured.values()))
        label = "intra-node" if cls == "intra_node" else "inter-node"
        links[cls] = {
            "name": f"measured {label} ({backend})" if fits.get(cls) else f"{label} (not measured)",
            "bandwidth_gbytes_per_s": max(fit.bandwidth_gbytes_per_s, 1e-3),
            "latency_us": fit.latency_us,
        }
        if fits.get(cls):
            notes.append(
                f"{label}: ranks {fit.pair[0]}<->{fit.pair[1]}, "
                f"{fit.bandwidth_gbytes_per_s:g} GB/s, {fit.latency_us:g} us"
            )
        else:
            notes.append(f"{label}: no rank pair, copied from the measured link")
    dname, mem = device_info(res["device"])
    source = (
        f"measured by octopipe profile --links (torch {torch.__version__}, {backend}, "
        f"{len(nodes)} ranks on {len(per_node)} node(s)): " + "; ".join(notes)
    )
    if base is not None:
        d = base.to_dict()
        for cls in measured:
            d[cls] = links[cls]
        d["source"] = source + f"; the rest from cluster {base.name!r}"
    else:
        d = {
            "format": CLUSTER_FORMAT,
            "name": name,
            "nodes": len(per_node),
            "gpus_per_node": max(per_node.values()),
            "gpu": {"name": dname, "memory_gib": mem, "hbm_gbytes_per_s": res["hbm"]},
            "intra_node": links["intra_node"],
            "inter_node": links["inter_node"],
            "collectives": {"algorithm": "ring"},
            "source": source,
        }
    Cluster.from_dict(d, "measured cluster")  # validate
    return d


@dataclass(frozen=True)
class LinksJob:
    """What ``run_links`` measures and where it writes."""

    out: str
    sizes_mib: tuple[float, ...] = DEFAULT_SIZES_MIB
    iters: int = 10
    name: str = "measured"
    base: Cluster | None = None
    simulate_nodes: int = 1  # spawned ranks split into this many pretend nodes (tests)


def _write(job: LinksJob, res: dict[str, Any] | None) -> dict[str, Any] | None:
    if res is None:
        return None
    d = cluster_from_links(res, job.name, job.base)
    Path(job.out).write_text(json.dumps(d, indent=1) + "\n")
    return d


def run_links_torchrun(job: LinksJob, backend: str = "auto") -> dict[str, Any] | None:
    """Under torchrun: init from the environment, measure, rank 0 writes ``job.out``."""
    from octopipe_core.executor.runtime import pick_backend

    backend = pick_backend(backend)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=timedelta(seconds=120))
    try:
        return _write(job, measure_links(job.sizes_mib, job.iters))
    finally:
        dist.destroy_process_group()


def _spawned(rank: int, world: int, port: int, job: LinksJob) -> None:
    torch.set_num_threads(1)
    if job.simulate_nodes > 1:
        os.environ["OCTOPIPE_NODE_NAME"] = f"sim-node{rank * job.simulate_nodes // world}"
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=timedelta(seconds=120),
    )  # fmt: skip
    _write(job, measure_links(job.sizes_mib, job.iters))
    from octopipe_core.executor.harness import leave_process_group

    leave_process_group()


def run_links_local(job: LinksJob, nproc: int) -> None:
    """Spawn ``nproc`` local gloo processes (127.0.0.1) and measure between them."""
    import torch.multiprocessing as mp

    from octopipe_core.executor.harness import free_port, start_local

    if nproc < 2:
        raise OctoPipeError("profile --links: --nproc must be >= 2; fix: e.g. --nproc 2")
    if not 1 <= job.simulate_nodes <= nproc or nproc % job.simulate_nodes:
        raise OctoPipeError(
            f"profile --links: --simulate-nodes {job.simulate_nodes} does not split {nproc} "
            "ranks evenly; fix: a divisor of --nproc"
        )
    try:
        start_local(_spawned, (nproc, free_port(), job), nproc)
    except mp.ProcessRaisedException as e:
        lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
        raise OctoPipeError(f"profile --links: a rank failed: {lines[-1].strip()}") from None
