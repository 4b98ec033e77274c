"""Pure helpers behind the dashboard's cluster pages (no Streamlit here; tests call them).

The dashboard keeps a cluster as a ``Cluster`` (a bundled sample, an upload or a hand edit) and
a layout as plain numbers (DP, ZeRO-1, rank order); TP is the profile's ``device.gpus`` and PP
the plan's devices. ``deploy`` joins them into the profile every page simulates.

>>> from octopipe_core.cluster import load_cluster_sample
>>> c = edited_cluster(load_cluster_sample("1x8-h800"), {"nodes": 2, "inter_bw": 25.0})
>>> c.total_gpus, c.inter_node.bandwidth_gbytes_per_s, c.name
(16, 25.0, '1x8-h800-edited')
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pandas as pd

from octopipe_core.cluster import Cluster
from octopipe_core.layout import ORDERS, Deployment, deploy
from octopipe_core.profile import Profile

NONE = "none"  # no cluster: one pipeline on the profile's flat link, as before
CUSTOM = "custom"  # an uploaded or hand-edited cluster (not shareable by URL)
ORDER_LABELS = {
    "tp-dp-pp": "tp-dp-pp (Megatron's default)",
    "tp-pp-dp": "tp-pp-dp (each pipeline inside as few nodes as possible)",
}
assert set(ORDER_LABELS) == set(ORDERS)
MAX_DP = 65_536

# The editable fields of a cluster: key -> (label with unit, integer?)
FIELDS: dict[str, tuple[str, bool]] = {
    "nodes": ("nodes", True),
    "gpus_per_node": ("GPUs per node", True),
    "gpu_memory_gib": ("GPU memory (GiB)", False),
    "intra_bw": ("intra-node bandwidth (GB/s per GPU)", False),
    "intra_lat": ("intra-node latency (µs)", False),
    "inter_bw": ("inter-node bandwidth (GB/s per GPU)", False),
    "inter_lat": ("inter-node latency (µs)", False),
}


def cluster_fields(c: Cluster) -> dict[str, float | int]:
    """The editable numbers of ``c`` (see ``FIELDS``)."""
    return {
        "nodes": c.nodes,
        "gpus_per_node": c.gpus_per_node,
        "gpu_memory_gib": c.gpu_memory_gib,
        "intra_bw": c.intra_node.bandwidth_gbytes_per_s,
        "intra_lat": c.intra_node.latency_us,
        "inter_bw": c.inter_node.bandwidth_gbytes_per_s,
        "inter_lat": c.inter_node.latency_us,
    }


def edited_cluster(base: Cluster, changes: dict[str, Any], name: str | None = None) -> Cluster:
    """``base`` with some ``FIELDS`` changed, validated as a cluster file is (one-line
    ``OctoPipeError`` naming the field on a bad value)."""
    d = base.to_dict()
    v = {**cluster_fields(base), **changes}
    for key in ("nodes", "gpus_per_node"):
        if isinstance(v[key], float) and v[key].is_integer():
            v[key] = int(v[key])
    d["name"] = name or (base.name if base.name.endswith("-edited") else f"{base.name}-edited")
    d["nodes"], d["gpus_per_node"] = v["nodes"], v["gpus_per_node"]
    d["gpu"]["memory_gib"] = v["gpu_memory_gib"]
    d["intra_node"]["bandwidth_gbytes_per_s"] = v["intra_bw"]
    d["intra_node"]["latency_us"] = v["intra_lat"]
    d["inter_node"]["bandwidth_gbytes_per_s"] = v["inter_bw"]
    d["inter_node"]["latency_us"] = v["inter_lat"]
    d.pop("source", None)
    return Cluster.from_dict(d, source="cluster editor")


def cluster_key(c: Cluster | None) -> str:
    """A stable text key of a cluster (for caches and for telling clusters apart)."""
    return "" if c is None else json.dumps(c.to_dict(), sort_keys=True)


def describe(c: Cluster) -> str:
    """One line: size, GPU, links and the collective algorithm."""
    return (
        f"{c.nodes:,} node(s) × {c.gpus_per_node} {c.gpu_name} ({c.total_gpus:,} GPUs, "
        f"{c.gpu_memory_gib:g} GiB each); inside a node {c.intra_node.name} "
        f"{c.intra_node.bandwidth_gbytes_per_s:g} GB/s, {c.intra_node.latency_us:g} µs; across "
        f"nodes {c.inter_node.name} {c.inter_node.bandwidth_gbytes_per_s:g} GB/s per GPU, "
        f"{c.inter_node.latency_us:g} µs; {c.collective_algorithm} collectives"
    )


def deployed(
    profile: Profile, cluster: Cluster, devices: int, dp: int, zero1: bool, order: str
) -> Profile:
    """``profile`` on ``cluster`` as ``devices`` pipeline devices x ``dp`` replicas (TP = the
    profile's ``device.gpus``); raises a one-line ``OctoPipeError`` if it does not fit."""
    return deploy(profile, cluster, devices, dp, zero1=zero1, order=order)


def redeploy(profile: Profile, devices: int) -> Profile:
    """The same cluster and layout with another number of pipeline devices (for sweeps);
    ``profile`` unchanged when it has no deployment."""
    dep: Deployment | None = profile.deployment
    if dep is None:
        return profile
    lay = dep.layout
    if lay.pp == devices:
        return profile
    return deploy(profile.with_deployment(None), dep.cluster, devices, lay.dp, zero1=lay.zero1,
                  order=lay.order, tp=lay.tp)  # fmt: skip


def profile_cache_key(p: Profile) -> tuple[Any, str]:
    """What a cached computation on ``p`` depends on (``hash_funcs`` for Streamlit's caches:
    a deployment memoises its links as it is used, which must not change the key)."""
    dep = p.deployment
    plain = dataclasses.asdict(dataclasses.replace(p, deployment=None))
    return plain, "" if dep is None else json.dumps(dep.to_dict(), sort_keys=True)


def placement_frame(dep: Deployment, max_replicas: int = 4) -> pd.DataFrame:
    """Where each pipeline device runs: one row per device, ``node n · GPU g`` per replica
    (the first GPU of its TP group), for the first ``max_replicas`` replicas."""
    lay, c = dep.layout, dep.cluster
    rows = []
    for d in range(lay.pp):
        row: dict[str, Any] = {"device": f"d{d}"}
        for r in range(min(lay.dp, max_replicas)):
            g = lay.gpu(r, d)
            row[f"replica {r}"] = f"node {c.node_of(g)} · GPU {g % c.gpus_per_node}"
        if d + 1 < lay.pp:
            row["link to next device"] = dep.p2p_link(d, d + 1).name + (
                " (inter-node)" if dep.crosses_nodes(d, d + 1) else ""
            )
        else:
            row["link to next device"] = "-"
        rows.append(row)
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# Layout ranking and scaling tables
RANK_COLUMNS = {
    "layout": "layout",
    "order": "rank order",
    "microbatches": "micro-batches",
    "schedule": "schedule",
    "step_time_ms": "step time (ms)",
    "tokens_per_gpu_per_s": "tokens/GPU/s",
    "peak_memory_gib": "peak memory (GiB)",
    "fits_memory": "fits",
    "why": "why (if it does not fit)",
    "tuned": "tuned",
}


def rank_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """``LayoutRow.to_dict()`` rows as the table the page shows (rank order kept).

    >>> rank_frame([{"layout": "TP1 x PP2 x DP4", "order": "tp-dp-pp", "microbatches": 8,
    ...   "schedule": "1f1b/uniform", "step_time_ms": 10.0, "tokens_per_gpu_per_s": 5.0,
    ...   "peak_memory_gib": 1.0, "fits_memory": True, "tuned": False, "why": ""}]).shape
    (1, 11)
    """
    df = pd.DataFrame(rows, columns=list(RANK_COLUMNS))
    df.insert(0, "rank", range(1, len(df) + 1))
    return df.rename(columns=RANK_COLUMNS)


def bar_labels(rows: list[dict[str, Any]]) -> list[str]:
    """Distinct labels of ranked layouts for a chart axis: layout, rank order, micro-batches."""
    return [f"{r['layout']} · {r['order']} · m={r['microbatches']}" for r in rows]


SCALING_COLUMNS = {
    "gpus": "GPUs",
    "global_batch": "global batch",
    "layout": "layout",
    "microbatches": "micro-batches",
    "schedule": "tuned schedule",
    "one_f_one_b_tokens_per_gpu_per_s": "1F1B tokens/GPU/s",
    "best_peer": "best peer",
    "best_peer_tokens_per_gpu_per_s": "best peer tokens/GPU/s",
    "tuned_tokens_per_gpu_per_s": "tuned tokens/GPU/s",
    "tuned_step_time_ms": "tuned step time (ms)",
    "fits_memory": "fits",
    "search_s": "search (s)",
}


def scaling_frame(points: list[dict[str, Any]]) -> pd.DataFrame:
    """``ScalingPoint.to_dict()`` rows as the table the page shows."""
    return pd.DataFrame(points, columns=list(SCALING_COLUMNS)).rename(columns=SCALING_COLUMNS)


def gpu_choices(gpus_per_node: int, top: int = 1024) -> list[int]:
    """GPU counts a scaling study can use: one node, then doubling whole nodes up to ``top``.

    >>> gpu_choices(8, 64)
    [8, 16, 32, 64]
    """
    out, g = [], gpus_per_node
    while g <= top:
        out.append(g)
        g *= 2
    return out


def parse_bool(raw: str) -> bool:
    """``1/0/true/false/yes/no`` (URL parameters); ValueError otherwise."""
    v = raw.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError("use 1 or 0")
