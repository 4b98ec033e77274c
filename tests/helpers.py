"""Small profile builders shared by the core tests."""

from __future__ import annotations

from typing import Any

from octopipe_core.profile import FORMAT, Profile


def uniform_profile(
    n_layers: int,
    f: float = 1.0,
    b: float = 1.0,
    w: float = 1.0,
    act: float = 10.0,
    stash: float | None = None,
    weight: float = 0.0,
    out_mib: float = 0.0,
    gbps: float = 50.0,
    lat_us: float = 0.0,
) -> Profile:
    lt: dict[str, Any] = {
        "family": "mlp",
        "forward_ms": f,
        "backward_input_ms": b,
        "backward_weight_ms": w,
        "activation_mib": act,
        "weight_mib": weight,
        "output_mib": out_mib,
    }
    if stash is not None:
        lt["w_stash_mib"] = stash
    return Profile.from_dict(
        {
            "format": FORMAT,
            "name": "uniform",
            "tokens_per_microbatch": 1000,
            "device": {"memory_gib": 80, "p2p_gbps": gbps, "p2p_latency_us": lat_us},
            "layer_types": {"x": lt},
            "layers": ["x"] * n_layers,
        }
    )


def hetero_profile(times: list[tuple[float, float, float]], out_mib: float = 0.0) -> Profile:
    """One layer type per layer, with the given (F, B, W) times."""
    types = {
        f"l{i}": {
            "family": "mlp",
            "forward_ms": f,
            "backward_input_ms": b,
            "backward_weight_ms": w,
            "activation_mib": 10,
            "weight_mib": 100,
            "output_mib": out_mib,
        }
        for i, (f, b, w) in enumerate(times)
    }
    return Profile.from_dict(
        {
            "format": FORMAT,
            "name": "hetero",
            "tokens_per_microbatch": 1000,
            "device": {"memory_gib": 80, "p2p_gbps": 50, "p2p_latency_us": 0},
            "layer_types": types,
            "layers": list(types),
        }
    )
