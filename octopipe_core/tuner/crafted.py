"""Small crafted profiles where the right tuning move is known (tests, benchmarks, docs).

* ``heavy_head``: seven light blocks and an LM head worth five of them; the partition phase
  must give the head a stage of its own;
* ``moe_memory``: two MoE layers whose weights fit only on devices that do not also hold the
  (large) embedding or LM head; no peer plan fits, the tuner must move them;
* ``w_heavy``: blocks whose weight-gradient pass W is long; only deferring W fills the bubbles;
* ``stash_heavy``: W keeps all of F's activations; a tight cap forces W to run early;
* ``hybrid(n)``: ``n`` layers of mixed attention / MLP / MoE cost, for exhaustive comparisons.

>>> heavy_head().layers[-1], moe_memory().num_layers
('lm_head', 8)
"""

from __future__ import annotations

from typing import Any

from octopipe_core.profile import FORMAT, Profile


def _lt(
    f: float,
    b: float,
    w: float,
    act: float = 100.0,
    weight: float = 500.0,
    out: float = 16.0,
    stash: float | None = None,
    family: str | None = None,
) -> dict[str, Any]:
    d: dict[str, Any] = {
        "forward_ms": f,
        "backward_input_ms": b,
        "backward_weight_ms": w,
        "activation_mib": act,
        "weight_mib": weight,
        "output_mib": out,
    }
    if stash is not None:
        d["w_stash_mib"] = stash
    if family is not None:
        d["family"] = family
    return d


def crafted_profile(
    name: str, layer_types: dict[str, dict[str, Any]], layers: list[str], memory_gib: float = 80
) -> Profile:
    """A profile from a type table and a layer list (device: 50 GB/s, 10 us links)."""
    return Profile.from_dict(
        {
            "format": FORMAT,
            "name": name,
            "tokens_per_microbatch": 1024,
            "device": {"name": "crafted", "memory_gib": memory_gib, "p2p_gbps": 50,
                       "p2p_latency_us": 10},
            "layer_types": layer_types,
            "layers": layers,
        }
    )  # fmt: skip


def heavy_head() -> Profile:
    """Embedding, 7 blocks of 3 ms (F+B+W), an LM head of 16 ms."""
    types = {
        "embedding": _lt(0.1, 0.0, 0.1),
        "block": _lt(1.0, 1.0, 1.0, family="transformer_block"),
        "lm_head": _lt(6.0, 6.0, 4.0, out=0.0),
    }
    return crafted_profile("heavy-head", types, ["embedding", *["block"] * 7, "lm_head"])


def moe_memory() -> Profile:
    """Embedding and LM head of 12 GiB, two MoE layers of 10 GiB, MLPs of 1 GiB; 16 GiB cap.

    Equal times everywhere, so uniform and balanced partitions agree and put an MoE layer
    next to the embedding or the head: no peer plan fits.
    """
    g = 1024.0
    types = {
        "embedding": _lt(1.0, 1.0, 1.0, weight=12 * g),
        "moe": _lt(1.0, 1.0, 1.0, weight=10 * g),
        "mlp": _lt(1.0, 1.0, 1.0, weight=1 * g),
        "lm_head": _lt(1.0, 1.0, 1.0, weight=12 * g, out=0.0),
    }
    layers = ["embedding", "moe", "mlp", "mlp", "moe", "mlp", "mlp", "lm_head"]
    return crafted_profile("moe-memory", types, layers, memory_gib=16)


def w_heavy() -> Profile:
    """Four blocks with F = B = 1 ms and W = 2 ms."""
    types = {"block": _lt(1.0, 1.0, 2.0, family="transformer_block")}
    return crafted_profile("w-heavy", types, ["block"] * 4)


def stash_heavy(memory_gib: float = 2.2) -> Profile:
    """Four blocks of 1 GiB weights whose W keeps all of F's 256 MiB of activations."""
    types = {
        "block": _lt(1.0, 1.0, 1.0, act=256.0, weight=1024.0, stash=256.0,
                     family="transformer_block"),
    }  # fmt: skip
    return crafted_profile("stash-heavy", types, ["block"] * 4, memory_gib=memory_gib)


def hybrid(n: int = 6) -> Profile:
    """``n`` layers: an embedding, then attention / MLP / MoE of different costs, an LM head."""
    types = {
        "embedding": _lt(0.5, 0.2, 0.5),
        "attention": _lt(1.0, 2.0, 0.6),
        "mlp": _lt(2.0, 2.0, 1.5),
        "moe": _lt(3.0, 3.5, 3.0),
        "lm_head": _lt(3.0, 3.0, 2.5, out=0.0),
    }
    mid = (["attention", "mlp", "moe"] * n)[: max(0, n - 2)]
    return crafted_profile(f"hybrid-{n}", types, ["embedding", *mid, "lm_head"])
