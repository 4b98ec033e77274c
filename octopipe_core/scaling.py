"""Strong and weak scaling studies on a cluster (the shape of the design's 64-8,192 GPU study).

For each GPU count ``G`` the cluster is resized to ``G / gpus_per_node`` nodes,
``cluster_plan.rank_layouts`` picks and tunes the best TP x PP x DP layout for the global batch,
and the point reports, at that layout, 1F1B/uniform, the best fitting peer and the tuned plan in
tokens/GPU/s, with how long one simulation of the tuned plan and the whole search took.

* strong scaling: the global batch is fixed (``global_batch``);
* weak scaling: it grows with the GPUs (``sequences_per_gpu x G``).

>>> from octopipe_core.cluster import Cluster, example_cluster_dict
>>> from octopipe_core.profile import Profile, example_profile_dict
>>> pts = scaling_study(Profile.from_dict(example_profile_dict()),
...     Cluster.from_dict(example_cluster_dict()), "strong", [2, 4], global_batch=16,
...     time_budget_s=1, tps=[1])
>>> [p.gpus for p in pts], all(p.tuned_tokens_per_gpu_per_s > 0 for p in pts)
([2, 4], True)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from octopipe_core.cluster import Cluster
from octopipe_core.cluster_plan import rank_layouts
from octopipe_core.errors import OctoPipeError
from octopipe_core.profile import Profile
from octopipe_core.simulator import simulate

DEFAULT_GPUS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)


@dataclass
class ScalingPoint:
    """One GPU count of a scaling study (tokens/GPU/s at the chosen layout)."""

    kind: str
    gpus: int
    global_batch: int
    layout: str
    microbatches: int
    schedule: str
    one_f_one_b_tokens_per_gpu_per_s: float | None
    best_peer: str
    best_peer_tokens_per_gpu_per_s: float | None
    tuned_tokens_per_gpu_per_s: float
    tuned_step_time_ms: float
    simulate_s: float
    search_s: float
    fits_memory: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def scaling_study(
    profile: Profile,
    cluster: Cluster,
    kind: str,
    gpus: list[int] | tuple[int, ...] = DEFAULT_GPUS,
    *,
    global_batch: int = 1024,
    sequences_per_gpu: float = 0.5,
    seq: int | None = None,
    time_budget_s: float = 20.0,
    max_tuned: int = 2,
    tps: list[int] | None = None,
    progress: Callable[[str, float], Any] | None = None,
) -> list[ScalingPoint]:
    """Run a ``"strong"`` or ``"weak"`` scaling study; see the module docstring."""
    if kind not in ("strong", "weak"):
        raise OctoPipeError(f"scaling kind {kind!r}: unknown; fix: use strong or weak")
    points: list[ScalingPoint] = []
    for i, g in enumerate(gpus):
        if g % cluster.gpus_per_node and g > cluster.gpus_per_node:
            raise OctoPipeError(
                f"gpus {g}: not a whole number of {cluster.gpus_per_node}-GPU nodes; "
                "fix: use multiples of the node size"
            )
        c = cluster.with_nodes(max(1, g // cluster.gpus_per_node))
        batch = global_batch if kind == "strong" else max(1, round(sequences_per_gpu * g))
        res = rank_layouts(profile, c, batch, seq=seq, gpus=g, time_budget_s=time_budget_s,
                           max_tuned=max_tuned, tps=tps)  # fmt: skip
        best = res.best
        if best is None or best.plan is None or best.profile is None:
            if progress:
                progress(f"{kind} {g} GPUs: no layout fits", (i + 1) / len(gpus))
            continue
        t = time.perf_counter()
        simulate(best.profile, best.plan)
        sim_s = time.perf_counter() - t

        def tok(ms: float | None, b: Any = best) -> float | None:
            if ms is None or ms <= 0:
                return None
            return (
                b.microbatches
                * profile.tokens_per_microbatch
                / (ms / 1e3)
                / (b.layout.tp * b.layout.pp)
            )

        points.append(
            ScalingPoint(
                kind, g, batch, f"{best.layout.label()} {best.layout.order}", best.microbatches,
                best.schedule, tok(best.peer_1f1b_ms), best.best_peer, tok(best.best_peer_ms),
                best.tokens_per_gpu_per_s, best.step_time_ms, sim_s, res.search_time_s,
                best.fits_memory,
            )
        )  # fmt: skip
        if progress:
            progress(f"{kind} {g} GPUs: {best.tokens_per_gpu_per_s:,.0f} tokens/GPU/s",
                     (i + 1) / len(gpus))  # fmt: skip
    return points
