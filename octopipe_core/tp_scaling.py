"""Derive a profile at another tensor-parallel degree, for layout search over TP x PP x DP.

A profile is measured (or modelled) at one TP degree ``t0 = device.gpus``. To rank layouts
with other TP degrees, ``scale_tp`` derives the profile at ``t``:

* F, B and W times scale by ``t0 / t`` (the layer's GEMMs are split ``t`` ways; the loss of
  GEMM efficiency at small shards is not modelled);
* activation, W-stash, weight and boundary-output memory scale by ``t0 / t`` (Megatron TP with
  sequence parallelism shards all of them);
* each tensor-parallel sublayer adds, in F and again in B, one all-gather and one
  reduce-scatter of the full activation over the TP group on the intra-node link (sequence
  parallelism); a ``transformer_block`` has two such sublayers (attention and MLP), other
  families one. Profile times are taken to be compute only (as the bundled samples are), so
  this communication is added for the target degree and none is removed for ``t0``.

A TP group stays inside one node, so ``t`` must divide the cluster's GPUs per node.

>>> from octopipe_core.cluster import Cluster, example_cluster_dict
>>> from octopipe_core.profile import Profile, example_profile_dict
>>> p = scale_tp(Profile.from_dict(example_profile_dict()), 2, Cluster.from_dict(
...     example_cluster_dict()))
>>> p.device.gpus, p.layer_costs()[1].weight_mib
(2, 250.0)
"""

from __future__ import annotations

from dataclasses import replace

from octopipe_core.cluster import Cluster, collective_ms
from octopipe_core.errors import OctoPipeError
from octopipe_core.profile import LayerType, Profile

SUBLAYERS = {"transformer_block": 2}


def tp_comm_ms(full_activation_mib: float, tp: int, cluster: Cluster, sublayers: int) -> float:
    """All-gather + reduce-scatter of the full activation per sublayer, in one pass (F or B).

    Sizes are the full (gathered) buffer, as ``collective_ms`` takes them."""
    if tp <= 1 or full_activation_mib <= 0:
        return 0.0
    gpus = list(range(tp))  # one TP group, inside one node
    ag = collective_ms(cluster, "all_gather", full_activation_mib, gpus)
    rs = collective_ms(cluster, "reduce_scatter", full_activation_mib, gpus)
    return sublayers * (ag + rs)


def scale_tp(profile: Profile, tp: int, cluster: Cluster) -> Profile:
    """``profile`` re-derived at tensor-parallel degree ``tp``; see the module docstring."""
    t0 = profile.device.gpus
    if tp < 1 or cluster.gpus_per_node % tp:
        ok = ", ".join(str(t) for t in tp_degrees(cluster))
        raise OctoPipeError(
            f"tp {tp}: must divide the {cluster.gpus_per_node} GPUs per node of "
            f"'{cluster.name}'; fix: use one of {ok}"
        )
    if tp == t0:
        return profile
    k = t0 / tp
    out_full = {t.name: t.output_mib * t0 for t in profile.layer_types}
    types = []
    for t in profile.layer_types:
        full = out_full[t.name] or max(out_full.values())  # the LM head's input is a hidden state
        comm = tp_comm_ms(full, tp, cluster, SUBLAYERS.get(t.family, 1))
        types.append(
            LayerType(
                name=t.name,
                family=t.family,
                forward_ms=t.forward_ms * k + comm,
                backward_input_ms=t.backward_input_ms * k + comm,
                backward_weight_ms=t.backward_weight_ms * k,
                activation_mib=t.activation_mib * k,
                weight_mib=t.weight_mib * k,
                output_mib=t.output_mib * k,
                w_stash_mib=t.w_stash_mib * k,
                workspace_mib=t.workspace_mib * k,
            )
        )
    return replace(
        profile,
        name=f"{profile.name}@tp{tp}",
        layer_types=tuple(types),
        device=replace(profile.device, gpus=tp),
        deployment=None,
    )


def tp_degrees(cluster: Cluster) -> list[int]:
    """TP degrees that fit a node: the divisors of its GPU count."""
    g = cluster.gpus_per_node
    return [t for t in range(1, g + 1) if g % t == 0]
