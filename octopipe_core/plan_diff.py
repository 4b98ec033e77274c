"""Diff two plans by layers, not by stage index: which layer ranges moved to which device, and
how each device's load and peak memory changed. Plans with different stage counts, chunk
counts or device counts diff meaningfully because both are mapped to layers first.

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> from octopipe_core.schedules import build_plan
>>> prof = Profile.from_dict(example_profile_dict())
>>> a = build_plan(prof, "1f1b", 2, 4)
>>> b = build_plan(prof, "zbv", 2, 4)  # 4 stages in a V over the same 2 devices
>>> [m.label() for m in layer_moves(a, b)]
['layer 1: d0 -> d1', 'layer 3: d1 -> d0']
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from octopipe_core.plan import Plan
from octopipe_core.profile import Profile
from octopipe_core.simulator import SimResult


@dataclass(frozen=True)
class LayerMove:
    """Layers ``first_layer..last_layer`` (inclusive) ran on ``device_a`` and now on
    ``device_b`` (``None``: the plan has no such layer)."""

    first_layer: int
    last_layer: int
    device_a: int | None
    device_b: int | None

    def label(self) -> str:
        span = (
            f"layer {self.first_layer}"
            if self.first_layer == self.last_layer
            else f"layers {self.first_layer}-{self.last_layer}"
        )
        da = "-" if self.device_a is None else f"d{self.device_a}"
        db = "-" if self.device_b is None else f"d{self.device_b}"
        return f"{span}: {da} -> {db}"


def layer_devices(plan: Plan, num_layers: int) -> list[int | None]:
    """The device of every layer (``None`` for a layer no stage holds)."""
    out: list[int | None] = [None] * num_layers
    for (lo, hi), d in zip(plan.partition, plan.placement, strict=True):
        for layer in range(max(0, lo), min(hi, num_layers)):
            out[layer] = d
    return out


def layer_moves(a: Plan, b: Plan, num_layers: int | None = None) -> list[LayerMove]:
    """Maximal runs of consecutive layers whose device differs between ``a`` and ``b``."""
    n = num_layers if num_layers is not None else max(a.partition[-1][1], b.partition[-1][1])
    da, db = layer_devices(a, n), layer_devices(b, n)
    moves: list[LayerMove] = []
    for layer in range(n):
        if da[layer] == db[layer]:
            continue
        last = moves[-1] if moves else None
        if (
            last is not None
            and last.last_layer == layer - 1
            and (last.device_a, last.device_b) == (da[layer], db[layer])
        ):
            moves[-1] = LayerMove(last.first_layer, layer, da[layer], db[layer])
        else:
            moves.append(LayerMove(layer, layer, da[layer], db[layer]))
    return moves


def device_loads_ms(profile: Profile, plan: Plan) -> list[float]:
    """Per device, compute of one micro-batch through its layers (F + B + W, ms)."""
    loads = [0.0] * plan.num_devices
    for layer, d in enumerate(layer_devices(plan, profile.num_layers)):
        if d is not None:
            c = profile.layer(layer)
            loads[d] += c.forward_ms + c.backward_input_ms + c.backward_weight_ms
    return loads


def device_changes(profile: Profile, a: SimResult, b: SimResult) -> list[dict[str, Any]]:
    """Per device of either plan: layers held, load per micro-batch and peak memory, A and B."""
    la, lb = device_loads_ms(profile, a.plan), device_loads_ms(profile, b.plan)
    na = layer_devices(a.plan, profile.num_layers)
    nb = layer_devices(b.plan, profile.num_layers)
    rows = []
    for d in range(max(a.plan.num_devices, b.plan.num_devices)):
        pa = a.peak_memory_gib[d] if d < a.plan.num_devices else 0.0
        pb = b.peak_memory_gib[d] if d < b.plan.num_devices else 0.0
        load_a = la[d] if d < len(la) else 0.0
        load_b = lb[d] if d < len(lb) else 0.0
        rows.append(
            {
                "device": f"d{d}",
                "layers_a": na.count(d),
                "layers_b": nb.count(d),
                "load_a_ms": round(load_a, 3),
                "load_b_ms": round(load_b, 3),
                "load_delta_ms": round(load_b - load_a, 3),
                "peak_a_gib": round(pa, 3),
                "peak_b_gib": round(pb, 3),
                "peak_delta_gib": round(pb - pa, 3),
            }
        )
    return rows


def moves_table(moves: list[LayerMove]) -> list[dict[str, Any]]:
    """``layer_moves`` as table rows (for the CLI and the dashboard)."""
    return [{**asdict(m), "layers": m.last_layer - m.first_layer + 1} for m in moves]
