"""Measure per-layer costs of the stand-in layers with torch and write an ``octopipe.profile/v1``.

Per layer type: F (forward), B (input-gradient backward, weight gradients deferred) and W (the
deferred weight gradients) as medians over ``repeats`` after ``warmup`` runs; memory from what
autograd saves (``saved_tensors_hooks``, parameters excluded): ``activation_mib`` = saved by F,
``w_stash_mib`` = kept by B for W, ``output_mib`` = the layer's output, ``weight_mib`` =
parameters x 4 (weights, gradients and two optimizer moments, same dtype). The LM head's
F includes the cross-entropy loss and its output is not sent (``output_mib`` 0).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from octopipe_core.errors import OctoPipeError
from octopipe_core.executor.models import (
    ModelSettings,
    apply_weight_grads,
    defer_weight_grads,
    standin_layer,
)
from octopipe_core.profile import FAMILIES, FORMAT, Profile

MIB = 2.0**20


def parse_layers(spec: str) -> list[tuple[str, str]]:
    """``"embedding,mamba2=mamba*3,lm_head"`` -> [(type name, family), ...] per layer.

    >>> parse_layers("embedding,m=mamba*2,lm_head")
    [('embedding', 'embedding'), ('m', 'mamba'), ('m', 'mamba'), ('lm_head', 'lm_head')]
    """
    out: list[tuple[str, str]] = []
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            continue
        count = 1
        if "*" in item:
            item, _, n = item.partition("*")
            if not n.isdigit() or int(n) < 1:
                raise OctoPipeError(f"--layers: bad repeat in {raw!r}; fix: write type*N, N >= 1")
            count = int(n)
        name, _, fam = item.partition("=")
        fam = fam or name
        if fam not in FAMILIES:
            raise OctoPipeError(
                f"--layers: {raw!r}: unknown family {fam!r}; fix: use name=family with family "
                f"in {', '.join(FAMILIES)}"
            )
        out += [(name, fam)] * count
    if not out:
        raise OctoPipeError("--layers: empty; fix: e.g. --layers embedding,mamba*2,lm_head")
    return out


def _timed(fn: Callable[[], Any], sync: Callable[[], None]) -> tuple[float, Any]:
    sync()
    t = time.perf_counter()
    r = fn()
    sync()
    return (time.perf_counter() - t) * 1e3, r


def _nbytes(ts: list[torch.Tensor]) -> float:
    seen: dict[int, int] = {}
    for t in ts:
        if t.device.type != "meta":
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values()) / MIB


def measure_layer(
    family: str, st: ModelSettings, device: torch.device, repeats: int = 10, warmup: int = 2
) -> dict[str, float]:
    """Costs of one stand-in layer of ``family`` at ``st``'s sizes on ``device``."""
    torch.manual_seed(st.seed)
    layer = standin_layer(family, st).to(device=device, dtype=st.torch_dtype())
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    shape = (st.microbatch_size, st.seq)
    tgt = torch.randint(0, st.vocab, shape, device=device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def make_input() -> torch.Tensor:
        if family == "embedding":
            return torch.randint(0, st.vocab, shape, device=device)
        x = torch.randn(*shape, st.hidden, device=device, dtype=st.torch_dtype())
        return x.requires_grad_(True)

    def fwd(x: torch.Tensor) -> torch.Tensor:
        out = layer(x)
        if family == "lm_head":
            return F.cross_entropy(out.reshape(-1, out.shape[-1]), tgt.reshape(-1))
        return out

    fs, bs, ws, acts, stashes = [], [], [], [], []
    out_mib = 0.0
    for i in range(warmup + repeats):
        x = make_input()
        saved: list[torch.Tensor] = []

        def pack(
            t: torch.Tensor, saved: list[torch.Tensor] = saved, xp: int = x.data_ptr()
        ) -> torch.Tensor:
            if t.untyped_storage().data_ptr() not in params and t.data_ptr() != xp:
                saved.append(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            tf, out = _timed(lambda x=x: fwd(x), sync)
        g = None if out.dim() == 0 else torch.randn_like(out)
        store: list[Any] = []

        def bwd(out: torch.Tensor = out, g: Any = g, store: list[Any] = store) -> None:
            with defer_weight_grads(store):
                torch.autograd.backward(out, g)

        tb, _ = _timed(bwd, sync)
        stash = [t for item in store for t in item[1:3] if isinstance(t, torch.Tensor)]
        stash_mib = _nbytes([t for t in stash if t.untyped_storage().data_ptr() not in params])
        tw, _ = _timed(lambda store=store: apply_weight_grads(store), sync)
        layer.zero_grad(set_to_none=True)
        if i >= warmup:
            fs.append(tf)
            bs.append(tb)
            ws.append(tw)
            acts.append(_nbytes(saved))
            stashes.append(stash_mib)
            out_mib = 0.0 if family == "lm_head" else out.numel() * out.element_size() / MIB
    wbytes = sum(p.numel() * p.element_size() for p in layer.parameters()) / MIB
    med = statistics.median
    act = med(acts)
    return {
        "family": family,  # type: ignore[dict-item]
        "forward_ms": round(med(fs), 6),
        "backward_input_ms": round(med(bs), 6),
        "backward_weight_ms": round(med(ws), 6),
        "activation_mib": round(act, 6),
        "weight_mib": round(4 * wbytes, 6),
        "output_mib": round(out_mib, 6),
        "w_stash_mib": round(min(med(stashes), act), 6),
    }


def device_info(device: torch.device) -> tuple[str, float]:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return props.name, round(props.total_memory / 2**30, 2)
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem = 16.0
    return f"cpu ({platform.processor() or platform.machine()})", round(mem, 2)


def profile_layers(
    layers: list[tuple[str, str]],
    st: ModelSettings,
    device: str = "cpu",
    repeats: int = 10,
    warmup: int = 2,
    name: str = "measured",
    p2p_gbps: float = 50.0,
    p2p_latency_us: float = 10.0,
) -> dict[str, Any]:
    """Measure each distinct layer type once; returns the profile as a dict (validated)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise OctoPipeError("profile: --device cuda but no CUDA device; fix: use --device cpu")
    dev = (
        torch.device("cuda", torch.cuda.current_device())
        if device == "cuda"
        else torch.device("cpu")
    )
    types: dict[str, dict[str, Any]] = {}
    for tname, fam in layers:
        if tname not in types:
            types[tname] = measure_layer(fam, st, dev, repeats, warmup)
    dname, mem = device_info(dev)
    data = {
        "format": FORMAT,
        "name": name,
        "tokens_per_microbatch": st.seq * st.microbatch_size,
        "device": {
            "name": dname,
            "memory_gib": mem,
            "p2p_gbps": p2p_gbps,
            "p2p_latency_us": p2p_latency_us,
        },
        "layer_types": types,
        "layers": [t for t, _ in layers],
        "source": (
            f"measured by octopipe profile (torch {torch.__version__}, {dname}, "
            f"{torch.get_num_threads()} threads): hidden {st.hidden}, seq {st.seq}, "
            f"micro-batch {st.microbatch_size}, {st.dtype}, median of {repeats}"
        ),
    }
    Profile.from_dict(data, "measured profile")  # validate
    return data
