"""Cluster descriptions (`octopipe.cluster/v1`) and the cost model of their collectives.

A cluster is ``nodes`` x ``gpus_per_node`` identical GPUs. GPUs of one node talk over the
intra-node link (NVLink); GPUs of different nodes over the inter-node link, one NIC per GPU
(InfiniBand or RoCE). Bandwidths are per GPU and per direction, in GB/s (1e9 bytes/s; a
400 Gb/s NIC is 50 GB/s); latencies in microseconds.

Collectives over a group of ``n`` GPUs moving ``S`` bytes per GPU, with link bandwidth ``B``
and latency ``a`` (the ``alpha-beta`` model, as NCCL's own tuning model and the Megatron and
ZeRO papers use):

* ring all-reduce: ``2 (n-1)/n * S/B + 2 (n-1) * a``;
* ring reduce-scatter and all-gather: ``(n-1)/n * S/B + (n-1) * a`` each (an all-reduce is one
  of each, so ZeRO-1's reduce-scatter + all-gather moves what one all-reduce moves);
* a ring that spans nodes runs at the inter-node bandwidth and latency (its slowest hop);
* ``hierarchical``: reduce-scatter inside each node (``k`` group members per node, NVLink),
  all-reduce of the ``1/k`` shard across the ``N`` nodes, all-gather inside the node:
  ``2 (k-1)/k * S/B_intra + 2 (N-1)/N * S/(k B_inter)`` plus latencies. It beats the flat ring
  when several members of the group share a node (``k > 1``);
* ``tree`` (NCCL's double binary tree across nodes): the same ``2 S/B`` bandwidth term, but a
  latency term of ``2 log2(n) * a`` instead of ``2 (n-1) * a``: it matters for small messages on
  hundreds of nodes, where the ring's latency term dominates.

>>> c = Cluster.from_dict(example_cluster_dict())
>>> c.total_gpus, c.node_of(9)
(16, 1)
>>> round(allreduce_ms(c, 1024.0, [0, 1, 2, 3]), 3)  # 1 GiB over 4 GPUs of one node
8.071
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from octopipe_core.errors import OctoPipeError, input_error
from octopipe_core.jsonio import loads_checked

CLUSTER_FORMAT = "octopipe.cluster/v1"
ALGORITHMS = ("ring", "hierarchical", "tree")
MIB = 2**20


@dataclass(frozen=True)
class Link:
    """One link class: per-GPU bandwidth (GB/s, one direction) and latency (us)."""

    name: str
    bandwidth_gbytes_per_s: float
    latency_us: float

    def wire_ms(self, size_mib: float) -> float:
        """Time the sender's link is busy with ``size_mib``: size / bandwidth, in ms."""
        return size_mib * MIB / (self.bandwidth_gbytes_per_s * 1e9) * 1e3

    def transfer_ms(self, size_mib: float) -> float:
        """Point-to-point time: latency + size / bandwidth (0 for an empty message).

        >>> Link("ib", 50.0, 10.0).transfer_ms(0.0)
        0.0
        """
        return 0.0 if size_mib <= 0 else self.latency_us / 1e3 + self.wire_ms(size_mib)


@dataclass(frozen=True)
class Cluster:
    """A homogeneous GPU cluster; see the module docstring for the units and the model."""

    name: str
    nodes: int
    gpus_per_node: int
    gpu_name: str
    gpu_memory_gib: float
    hbm_gbytes_per_s: float
    intra_node: Link
    inter_node: Link
    collective_algorithm: str = "ring"
    source: str = ""

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_of(self, gpu: int) -> int:
        return gpu // self.gpus_per_node

    def link(self, gpu_a: int, gpu_b: int) -> Link:
        """The link class joining two GPUs."""
        return self.intra_node if self.node_of(gpu_a) == self.node_of(gpu_b) else self.inter_node

    def with_nodes(self, nodes: int) -> Cluster:
        return replace(self, nodes=nodes)

    def to_dict(self) -> dict[str, Any]:
        def link(x: Link) -> dict[str, Any]:
            return {
                "name": x.name,
                "bandwidth_gbytes_per_s": x.bandwidth_gbytes_per_s,
                "latency_us": x.latency_us,
            }

        return {
            "format": CLUSTER_FORMAT,
            "name": self.name,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "gpu": {
                "name": self.gpu_name,
                "memory_gib": self.gpu_memory_gib,
                "hbm_gbytes_per_s": self.hbm_gbytes_per_s,
            },
            "intra_node": link(self.intra_node),
            "inter_node": link(self.inter_node),
            "collectives": {"algorithm": self.collective_algorithm},
            **({"source": self.source} if self.source else {}),
        }

    @staticmethod
    def from_dict(data: Any, source: str = "<cluster>") -> Cluster:
        return _parse_cluster(data, source)


def example_cluster_dict() -> dict[str, Any]:
    """Two nodes of 8 GPUs: 200 GB/s NVLink, 50 GB/s (400 Gb/s) NIC per GPU."""
    return {
        "format": CLUSTER_FORMAT,
        "name": "example-2x8",
        "nodes": 2,
        "gpus_per_node": 8,
        "gpu": {"name": "H800", "memory_gib": 80, "hbm_gbytes_per_s": 3350},
        "intra_node": {"name": "NVLink", "bandwidth_gbytes_per_s": 200, "latency_us": 3},
        "inter_node": {"name": "IB 400G", "bandwidth_gbytes_per_s": 50, "latency_us": 10},
        "collectives": {"algorithm": "ring"},
    }


# ---- collectives ---------------------------------------------------------------------------
def _group_shape(cluster: Cluster, gpus: list[int]) -> tuple[int, int, int]:
    """(members n, nodes spanned N, most members on one node k)."""
    per_node: dict[int, int] = {}
    for g in gpus:
        per_node[cluster.node_of(g)] = per_node.get(cluster.node_of(g), 0) + 1
    return len(gpus), len(per_node), max(per_node.values(), default=0)


def _ring_ms(n: int, size_mib: float, link: Link, passes: int) -> float:
    if n <= 1 or size_mib <= 0:
        return 0.0
    return passes * ((n - 1) / n * link.wire_ms(size_mib) + (n - 1) * link.latency_us / 1e3)


def collective_ms(cluster: Cluster, kind: str, size_mib: float, gpus: list[int]) -> float:
    """Time of one collective (``allreduce``, ``reduce_scatter`` or ``all_gather``) of
    ``size_mib`` per GPU over the group ``gpus`` (global GPU indices), by the cluster's algorithm.

    >>> c = Cluster.from_dict(example_cluster_dict())
    >>> round(collective_ms(c, "reduce_scatter", 1024.0, [0, 8]), 3)  # across the two nodes
    10.747
    """
    passes = {"allreduce": 2, "reduce_scatter": 1, "all_gather": 1}.get(kind)
    if passes is None:
        raise OctoPipeError(f"collective {kind!r}: unknown; fix: use allreduce/reduce_scatter/...")
    n, nodes, k = _group_shape(cluster, gpus)
    if n <= 1 or size_mib <= 0:
        return 0.0
    if nodes == 1:
        return _ring_ms(n, size_mib, cluster.intra_node, passes)
    algo = cluster.collective_algorithm
    inter = cluster.inter_node
    if algo == "hierarchical" and k > 1:
        inside = _ring_ms(k, size_mib, cluster.intra_node, passes)
        return inside + _ring_ms(nodes, size_mib / k, inter, passes)
    if algo == "tree" and kind == "allreduce":
        return 2 * inter.wire_ms(size_mib) + 2 * math.log2(n) * inter.latency_us / 1e3
    return _ring_ms(n, size_mib, inter, passes)


def allreduce_ms(cluster: Cluster, size_mib: float, gpus: list[int]) -> float:
    """All-reduce time over ``gpus``; see ``collective_ms``."""
    return collective_ms(cluster, "allreduce", size_mib, gpus)


# ---- files ---------------------------------------------------------------------------------
def _num(v: Any, src: str, field: str, *, lo: float, hi: float, integer: bool = False) -> Any:
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok or not math.isfinite(v) or not lo <= v <= hi:
        kind = "an integer" if integer else "a number"
        raise input_error(src, field, f"got {v!r}", f"use {kind} in [{lo:g}, {hi:g}]")
    return v if integer else float(v)


def _parse_link(raw: Any, src: str, field: str) -> Link:
    if not isinstance(raw, dict):
        raise input_error(
            src, field, "expected an object",
            'write {"bandwidth_gbytes_per_s": 50, "latency_us": 10}',
        )  # fmt: skip
    for key in raw:
        if key not in ("name", "bandwidth_gbytes_per_s", "latency_us"):
            raise input_error(
                src, f"{field}.{key}", "unknown key", "use name, bandwidth_gbytes_per_s, latency_us"
            )
    for key in ("bandwidth_gbytes_per_s", "latency_us"):
        if key not in raw:
            raise input_error(src, f"{field}.{key}", "missing", f'add "{key}": <number>')
    bw_field = f"{field}.bandwidth_gbytes_per_s"
    bw = _num(raw["bandwidth_gbytes_per_s"], src, bw_field, lo=1e-3, hi=1e5)
    lat = _num(raw["latency_us"], src, f"{field}.latency_us", lo=0, hi=1e6)
    return Link(str(raw.get("name", field)), bw, lat)


def _parse_cluster(data: Any, src: str) -> Cluster:
    if not isinstance(data, dict):
        raise input_error(src, "<root>", "expected a JSON object", "see sample_profiles/clusters/")
    allowed = (
        "format", "name", "nodes", "gpus_per_node", "gpu", "intra_node", "inter_node",
        "collectives", "source",
    )  # fmt: skip
    for key in data:
        if key not in allowed:
            raise input_error(src, str(key), "unknown key", f"use only {', '.join(allowed)}")
    if data.get("format") != CLUSTER_FORMAT:
        raise input_error(
            src, "format", f"got {data.get('format')!r}", f'set "format": "{CLUSTER_FORMAT}"'
        )
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise input_error(src, "name", f"got {name!r}", "give the cluster a non-empty name")
    nodes = _num(data.get("nodes"), src, "nodes", lo=1, hi=1_000_000, integer=True)
    gpn = _num(data.get("gpus_per_node"), src, "gpus_per_node", lo=1, hi=1024, integer=True)
    gpu = data.get("gpu", {})
    if not isinstance(gpu, dict):
        raise input_error(src, "gpu", "expected an object", 'write {"memory_gib": 80, ...}')
    for key in gpu:
        if key not in ("name", "memory_gib", "hbm_gbytes_per_s"):
            raise input_error(
                src, f"gpu.{key}", "unknown key", "use name, memory_gib, hbm_gbytes_per_s"
            )
    mem = _num(gpu.get("memory_gib", 80), src, "gpu.memory_gib", lo=1e-3, hi=1e6)
    hbm = _num(gpu.get("hbm_gbytes_per_s", 3350), src, "gpu.hbm_gbytes_per_s", lo=1e-3, hi=1e6)
    intra = _parse_link(data.get("intra_node"), src, "intra_node")
    inter = _parse_link(data.get("inter_node"), src, "inter_node")
    coll = data.get("collectives", {})
    if not isinstance(coll, dict) or any(k != "algorithm" for k in coll):
        raise input_error(src, "collectives", f"got {coll!r}", 'write {"algorithm": "ring"}')
    algo = coll.get("algorithm", "ring")
    if algo not in ALGORITHMS:
        raise input_error(
            src, "collectives.algorithm", f"got {algo!r}", f"use one of {', '.join(ALGORITHMS)}"
        )
    return Cluster(
        name.strip(), nodes, gpn, str(gpu.get("name", "GPU")), mem, hbm, intra, inter, algo,
        str(data.get("source", "")),
    )  # fmt: skip


def parse_cluster_bytes(raw: bytes, filename: str) -> Cluster:
    """Parse an uploaded or read cluster file (JSON)."""
    data = loads_checked(raw, filename)
    return _parse_cluster(data, filename)


def load_cluster(path: str | Path) -> Cluster:
    """Load and validate a cluster file; one-line ``OctoPipeError`` on any problem."""
    p = Path(path)
    if not p.is_file():
        raise OctoPipeError(f"{p}: file not found; fix: pass a cluster .json or a sample name")
    return parse_cluster_bytes(p.read_bytes(), str(p))


def _samples_dir() -> Any:
    """``sample_profiles/clusters`` (package data in a wheel, the checkout's folder otherwise)."""
    from octopipe_core.profile import sample_profiles_dir

    return sample_profiles_dir() / "clusters"


def list_cluster_samples() -> list[str]:
    """Names of the bundled cluster samples."""
    d = _samples_dir()
    return sorted(p.name[:-5] for p in d.iterdir() if p.name.endswith(".json"))


def load_cluster_sample(name: str) -> Cluster:
    """A bundled cluster by name (e.g. ``"16x8-h800-ib400"``)."""
    f = _samples_dir().joinpath(f"{name}.json")
    if not f.is_file():
        raise OctoPipeError(
            f"cluster '{name}': not found; fix: use a .json path or one of "
            f"{', '.join(list_cluster_samples())}"
        )
    return parse_cluster_bytes(f.read_bytes(), f"{name}.json")


def resolve_cluster(arg: str) -> Cluster:
    """A path to a cluster file, or a bundled sample's name."""
    if Path(arg).is_file() or arg.endswith(".json") or "/" in arg:
        return load_cluster(arg)
    return load_cluster_sample(arg)
