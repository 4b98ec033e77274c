"""Parallel layouts: how one pipeline plan is laid out over a cluster (TP x PP x DP).

* ``tp``: GPUs behind one pipeline device, a tensor-parallel group inside one node. Its times
  are the profile's (a profile is measured at one TP degree, ``device.gpus``);
* ``pp``: pipeline devices (the plan's devices);
* ``dp``: identical pipeline replicas; after the backward each stage's gradients are reduced over
  the data-parallel group (the same stage in every replica);
* ``zero1``: the optimizer state is sharded over DP (ZeRO-1 / Megatron's distributed
  optimizer): gradients are reduce-scattered, each rank updates its shard, the new parameters
  are all-gathered; optimizer memory is divided by ``dp``;
* ``order``: how global GPU ranks are assigned. ``"tp-dp-pp"`` is Megatron's default (TP
  fastest, then DP, then PP); ``"tp-pp-dp"`` keeps each pipeline inside as few nodes as
  possible (its stage boundaries stay on NVLink, its DP groups cross nodes).

Static memory follows the profile's 16 B/param convention (bf16 weights and gradients, fp32
master weights and Adam moments): ``GRAD_FRACTION`` = 2/16 of ``weight_mib`` is the bf16
gradient that DP reduces, ``OPTIMIZER_FRACTION`` = 12/16 is what ZeRO-1 shards.

>>> lay = Layout(pp=4, dp=2, tp=2)
>>> lay.gpus, [lay.gpu(r, d) for r in range(2) for d in range(4)]
(16, [0, 4, 8, 12, 2, 6, 10, 14])
>>> Layout(pp=4, dp=2, tp=2, order="tp-pp-dp").gpu(1, 0)
8
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from octopipe_core.cluster import Cluster, Link, collective_ms
from octopipe_core.errors import OctoPipeError, input_error

ORDERS = ("tp-dp-pp", "tp-pp-dp")
GRAD_FRACTION = 2.0 / 16.0
OPTIMIZER_FRACTION = 12.0 / 16.0
# Adam reads gradient, master weight and both moments and writes all but the gradient, plus
# the bf16 weight: about 28 B/param, 1.75x the 16 B/param of static memory, at this share of HBM.
OPTIMIZER_TRAFFIC_PER_STATIC_BYTE = 1.75
HBM_EFFICIENCY = 0.6


@dataclass(frozen=True)
class Layout:
    """TP x PP x DP layout of one plan; see the module docstring."""

    pp: int
    dp: int = 1
    tp: int = 1
    zero1: bool = False
    order: str = "tp-dp-pp"
    overlap_grad_reduce: bool = True  # False: every reduction waits for the device's last op
    bucket_mib: float = 0.0  # gradient bucket size; 0: one bucket per stage
    mapping: tuple[tuple[int, ...], ...] | None = None  # [replica][device] -> first GPU of TP

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def gpu(self, replica: int, device: int) -> int:
        """Global index of the first GPU of pipeline ``device`` in ``replica``."""
        if self.mapping is not None:
            return self.mapping[replica][device]
        if self.order == "tp-dp-pp":
            return self.tp * (replica + self.dp * device)
        return self.tp * (device + self.pp * replica)

    def dp_group(self, device: int, tp_rank: int = 0) -> list[int]:
        """GPUs that reduce the gradients of ``device``'s stages with each other."""
        return [self.gpu(r, device) + tp_rank for r in range(self.dp)]

    def label(self) -> str:
        z = " zero1" if self.zero1 else ""
        return f"TP{self.tp} x PP{self.pp} x DP{self.dp}{z}"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "zero1": self.zero1,
            "order": self.order,
            "overlap_grad_reduce": self.overlap_grad_reduce,
            "bucket_mib": self.bucket_mib,
        }
        if self.mapping is not None:
            d["mapping"] = [list(r) for r in self.mapping]
        return d

    @staticmethod
    def from_dict(data: Any, src: str = "<layout>") -> Layout:
        return _parse_layout(data, src)


@dataclass(frozen=True)
class Deployment:
    """Where a pipeline runs: a cluster and a layout. Attached to a ``Profile`` (its
    ``deployment`` field), so that every simulation of that profile is cluster-aware."""

    cluster: Cluster
    layout: Layout
    _links: dict[tuple[int, int], Link] = field(default_factory=dict, compare=False, repr=False)

    def check(self, num_devices: int, tp: int, src: str = "layout") -> None:
        """Raise a one-line error if the layout does not fit the plan or the cluster."""
        lay, c = self.layout, self.cluster
        if lay.pp != num_devices:
            raise input_error(
                src, "pp", f"{lay.pp} but the plan has {num_devices} devices",
                f"set pp to {num_devices}",
            )  # fmt: skip
        if lay.tp != tp:
            raise input_error(
                src, "tp", f"{lay.tp} but the profile's device.gpus is {tp}",
                "profile the model at that TP degree (device.gpus) or set tp to match",
            )  # fmt: skip
        if lay.gpus > c.total_gpus:
            raise input_error(
                src, "dp", f"{lay.label()} needs {lay.gpus} GPUs, cluster '{c.name}' has "
                f"{c.total_gpus}", "lower dp/pp or use a larger cluster",
            )  # fmt: skip
        if c.gpus_per_node % lay.tp:
            raise input_error(
                src, "tp", f"{lay.tp} does not divide {c.gpus_per_node} GPUs per node",
                "a TP group must sit inside one node",
            )  # fmt: skip
        if lay.mapping is not None:
            flat = [g for row in lay.mapping for g in row]
            if len(lay.mapping) != lay.dp or any(len(r) != lay.pp for r in lay.mapping):
                raise input_error(src, "mapping", "wrong shape", "give dp rows of pp GPU indices")
            if len(set(flat)) != len(flat) or any(
                g < 0 or g % lay.tp or g + lay.tp > c.total_gpus for g in flat
            ):
                raise input_error(
                    src, "mapping", "GPUs repeat, fall outside the cluster or split a TP group",
                    f"use distinct multiples of tp={lay.tp} below {c.total_gpus}",
                )  # fmt: skip

    def p2p_link(self, dev_a: int, dev_b: int) -> Link:
        """The slowest link between pipeline devices ``dev_a`` and ``dev_b`` over all replicas
        (replicas synchronise at the gradient reduction, so the slowest one sets the step)."""
        key = (dev_a, dev_b)
        if key not in self._links:
            lay, c = self.layout, self.cluster
            cross = any(
                c.node_of(lay.gpu(r, dev_a)) != c.node_of(lay.gpu(r, dev_b)) for r in range(lay.dp)
            )
            self._links[key] = c.inter_node if cross else c.intra_node
        return self._links[key]

    def crosses_nodes(self, dev_a: int, dev_b: int) -> bool:
        return self.p2p_link(dev_a, dev_b) is self.cluster.inter_node

    def grad_sync_ms(self, device: int, grad_mib: float) -> float:
        """Reduction of ``grad_mib`` of one device's gradients over its DP group: an all-reduce,
        or under ZeRO-1 the reduce-scatter (the all-gather is ``param_gather_ms``)."""
        kind = "reduce_scatter" if self.layout.zero1 else "allreduce"
        return collective_ms(self.cluster, kind, grad_mib, self.layout.dp_group(device))

    def param_gather_ms(self, device: int, param_mib: float) -> float:
        """ZeRO-1's all-gather of the updated bf16 parameters (0 without ZeRO-1)."""
        if not self.layout.zero1:
            return 0.0
        return collective_ms(self.cluster, "all_gather", param_mib, self.layout.dp_group(device))

    def static_mib(self, weight_mib: float) -> float:
        """Static memory of ``weight_mib`` (profile figure) under this layout's sharding."""
        if not self.layout.zero1:
            return weight_mib
        return weight_mib * (1 - OPTIMIZER_FRACTION + OPTIMIZER_FRACTION / self.layout.dp)

    def optimizer_ms(self, weight_mib: float) -> float:
        """Optimizer step over a device's ``weight_mib`` of static memory (memory-bound)."""
        traffic = self.static_mib(weight_mib) * OPTIMIZER_TRAFFIC_PER_STATIC_BYTE * 2**20
        return traffic / (self.cluster.hbm_gbytes_per_s * 1e9 * HBM_EFFICIENCY) * 1e3

    def to_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster.to_dict(), "layout": self.layout.to_dict()}


def deploy(profile: Any, cluster: Cluster, pp: int, dp: int = 1, **layout: Any) -> Any:
    """``profile`` set to run as ``pp`` pipeline devices x ``dp`` replicas on ``cluster``
    (TP = the profile's ``device.gpus``; memory = the cluster's GPU memory).

    >>> from octopipe_core.cluster import Cluster, example_cluster_dict
    >>> from octopipe_core.profile import Profile, example_profile_dict
    >>> p = deploy(Profile.from_dict(example_profile_dict()), Cluster.from_dict(
    ...     example_cluster_dict()), pp=2, dp=8)
    >>> p.deployment.layout.label(), p.deployment.crosses_nodes(0, 1)
    ('TP1 x PP2 x DP8', True)
    """
    layout.setdefault("tp", profile.device.gpus)
    dep = Deployment(cluster, Layout(pp=pp, dp=dp, **layout))
    dep.check(pp, profile.device.gpus)
    return profile.with_device(memory_gib=cluster.gpu_memory_gib).with_deployment(dep)


def with_layout(deployment: Deployment, **changes: Any) -> Deployment:
    return Deployment(deployment.cluster, replace(deployment.layout, **changes))


def _parse_layout(data: Any, src: str) -> Layout:
    if not isinstance(data, dict):
        raise input_error(src, "layout", "expected an object", 'write {"pp": 4, "dp": 2}')
    known = {
        "tp", "pp", "dp", "zero1", "order", "overlap_grad_reduce", "bucket_mib", "mapping",
    }  # fmt: skip
    for key in data:
        if key not in known:
            raise input_error(
                src, f"layout.{key}", "unknown key", f"use {', '.join(sorted(known))}"
            )
    vals: dict[str, Any] = {}
    for key, default in (("tp", 1), ("pp", None), ("dp", 1)):
        v = data.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1_000_000:
            raise input_error(src, f"layout.{key}", f"got {v!r}", "use a positive integer")
        vals[key] = v
    for key in ("zero1", "overlap_grad_reduce"):
        v = data.get(key, key == "overlap_grad_reduce")
        if not isinstance(v, bool):
            raise input_error(src, f"layout.{key}", f"got {v!r}", "use true or false")
        vals[key] = v
    order = data.get("order", "tp-dp-pp")
    if order not in ORDERS:
        raise input_error(src, "layout.order", f"got {order!r}", f"use one of {', '.join(ORDERS)}")
    bucket = data.get("bucket_mib", 0.0)
    if isinstance(bucket, bool) or not isinstance(bucket, (int, float)) or not 0 <= bucket < 1e9:
        raise input_error(src, "layout.bucket_mib", f"got {bucket!r}", "use a number >= 0")
    mapping = data.get("mapping")
    if mapping is not None:
        if not isinstance(mapping, list) or not all(
            isinstance(r, list) and all(isinstance(g, int) and not isinstance(g, bool) for g in r)
            for r in mapping
        ):
            raise input_error(
                src, "layout.mapping", "expected [[gpu, ...], ...]", "give one row per replica"
            )
        mapping = tuple(tuple(r) for r in mapping)
    return Layout(order=order, bucket_mib=float(bucket), mapping=mapping, **vals)


def deployment_from_dict(data: Any, src: str = "<plan>") -> Deployment:
    """Read ``{"cluster": {...}, "layout": {...}}`` (as a plan file stores them)."""
    if not isinstance(data, dict) or "cluster" not in data or "layout" not in data:
        raise OctoPipeError(f"{src}: field 'cluster': missing; fix: save plans with octopipe")
    return Deployment(Cluster.from_dict(data["cluster"], f"{src}#cluster"),
                      Layout.from_dict(data["layout"], f"{src}#layout"))  # fmt: skip
