"""Small profile builders shared by the core tests, and a job runner that cleans up after
itself."""

from __future__ import annotations

import random
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from typing import Any

from octopipe_core.bounds import LayerTimes
from octopipe_core.commands.run import end_process_group
from octopipe_core.fill_partition import FillModel, Partition, device_needs
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


def random_fill_model(n: int, seed: int, m: int = 8, first_ms: float | None = None) -> FillModel:
    """``n`` layers of 1, 1.5 or 3 ms forward at random (B the same, W half), ``m``
    micro-batches; with ``first_ms``, the first layer's forward takes that (an embedding)."""
    rng = random.Random(seed)
    f = [rng.choice([1.0, 1.5, 3.0]) for _ in range(n)]
    if first_ms is not None:
        f[0] = first_ms
    return FillModel.from_times(LayerTimes(f, f, [0.5 * x for x in f]), m)


def assert_spread_layout(
    model: FillModel, p: int, got: tuple[Partition, list[int], float] | None
) -> tuple[Partition, list[int], float]:
    """``got`` is a layout where device ``d`` starts with layer ``d``: contiguous stages
    covering every layer once, adjacent stages on different devices, and its need is the
    fill model's."""
    assert got is not None
    part, place, need = got
    assert part[0][0] == 0 and part[-1][1] == model.num_layers
    assert all(a[1] == b[0] for a, b in pairwise(part))
    assert all(x != y for x, y in pairwise(place))
    assert place[:p] == list(range(p))  # device d starts with layer d
    assert need == max(device_needs(model, part, place))
    return part, place, need


@contextmanager
def job_group(cmd: list[str], **popen: Any) -> Iterator[subprocess.Popen[str]]:
    """Start ``cmd`` (text mode) in a session of its own for a test that talks to it while it
    runs, and on the way out end whatever of the session is left (``end_process_group``): a
    job whose test failed or timed out must not keep its launcher and ranks busy beside the
    rest of the suite. A job that only has to finish: ``run_process_group``."""
    proc = subprocess.Popen(cmd, start_new_session=True, text=True, **popen)
    try:
        yield proc
    finally:
        end_process_group(proc)
