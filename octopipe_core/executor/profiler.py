"""Measure per-layer costs with torch and write an ``octopipe.profile/v1``: the user's own
layers (a model hook, ``executor/hooks.py``) or the stand-in layers.

Layers are built one at a time and each is fed the previous layer's real output. Per layer type
(measured on its first layer): F (forward), B (input-gradient backward, weight gradients
deferred) and W (the deferred weight gradients) as medians over ``repeats`` after ``warmup``
runs; memory from what autograd saves (``saved_tensors_hooks``; parameters, buffers and the
input excluded): ``activation_mib`` = held by F for backward, ``w_stash_mib`` = kept by B for
W, ``output_mib`` = the layer's output, ``workspace_mib`` = the peak above the start while B
runs (untimed pass; CUDA allocator, or glibc's bytes in use on the CPU); ``weight_mib`` =
parameters + gradients + the optimizer's master copy and AdamW state, measured on the
executor's own buffers. The last layer's F includes the loss (cross-entropy after an
``lm_head``, else mean square) and its output is not sent (``output_mib`` 0). CUDA times are
taken between ``torch.cuda.synchronize`` calls.
"""

from __future__ import annotations

import functools
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from octopipe_core.errors import OctoPipeError
from octopipe_core.executor.hooks import is_per_stage, resolve_hook
from octopipe_core.executor.models import (
    ModelSettings,
    apply_weight_grads,
    build_layers,
    defer_weight_grads,
    loss_fn,
    make_batch,
)
from octopipe_core.profile import FAMILIES, FORMAT, MAX_LAYERS, Profile

MIB = 2.0**20


def parse_layers(spec: str) -> list[tuple[str, str]]:
    """``"embedding,mamba2=mamba*3,lm_head"`` -> [(type name, family), ...] per layer.

    >>> parse_layers("embedding,m=mamba*2,attention,m,lm_head")  # doctest: +NORMALIZE_WHITESPACE
    [('embedding', 'embedding'), ('m', 'mamba'), ('m', 'mamba'), ('attention', 'attention'),
     ('m', 'mamba'), ('lm_head', 'lm_head')]
    """
    out: list[tuple[str, str]] = []
    known: dict[str, str] = {}
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
        fam = fam or known.get(name, name)  # a name defined earlier keeps its family
        known[name] = fam
        if fam not in FAMILIES:
            raise OctoPipeError(
                f"--layers: {raw!r}: unknown family {fam!r}; fix: use name=family with family "
                f"in {', '.join(FAMILIES)}"
            )
        if len(out) + count > MAX_LAYERS:
            raise OctoPipeError(
                f"--layers: {len(out) + count:,} layers or more, over the {MAX_LAYERS:,} a "
                "profile holds; fix: fewer repeats (a profile times each layer type once)"
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


def _nbytes(ts: Sequence[torch.Tensor]) -> float:
    seen: dict[int, int] = {}
    for t in ts:
        if t.device.type != "meta":
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values()) / MIB


def _storages(ts: Any) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in ts if t.device.type != "meta"}


def weight_memory_mib(layer: nn.Module) -> tuple[float, float, float]:
    """Parameter, gradient and optimizer memory of ``layer`` (MiB) as the training job holds
    them, measured on the executor's own buffers (``executor/dp.py``, AdamW): the parameters,
    the flat master-dtype gradient buffer they accumulate into, and the flat master copy with
    AdamW's two moments (float32 for bfloat16/float16 layers). A bfloat16 layer comes to
    2 + 4 + 12 = 18 bytes per parameter, a float32 one to 4 + 4 + 12 = 20."""
    from octopipe_core.executor.dp import DataParallel
    from octopipe_core.executor.settings import OptimSettings

    named = [(n, p) for n, p in layer.named_parameters() if p.requires_grad]
    p_mib = _nbytes([p for _, p in named])
    if not named:
        return p_mib, 0.0, 0.0
    dpar = DataParallel({0: named}, 1, 0, None, False, OptimSettings())
    try:
        dpar.launch(0)  # gradients left on the parameters move into the flat buffer
        buf = dpar.buffers[0]
        assert buf.grad is not None
        state = [t for t in buf.state.values() if t.dim() > 0]  # (the step counter aside)
        o_mib = _nbytes([buf.master, *state])
        return p_mib, _nbytes([buf.grad]), o_mib
    finally:
        dpar.release()


def _fresh_input(x_in: torch.Tensor) -> torch.Tensor:
    """A copy of a layer's input that a backward can take the gradient of (ids need none)."""
    x = x_in.detach().clone()
    if x.is_floating_point():
        x.requires_grad_(True)
    return x


def _deferred_backward(out: torch.Tensor, g: torch.Tensor | None, store: list[Any]) -> None:
    """B: the input-gradient backward from ``out``, weight gradients queued on ``store``."""
    with defer_weight_grads(store):
        torch.autograd.backward(out, g)


def backward_workspace_mib(
    fwd: Callable[[torch.Tensor], torch.Tensor], x_in: torch.Tensor, device: torch.device
) -> float:
    """Working memory of one B (input-gradient backward, weight gradients deferred) of
    ``fwd`` on ``x_in``: its peak above the memory in use when it starts (MiB), untimed. On a
    GPU the CUDA allocator's peak; on the CPU glibc's bytes in use read after every torch op
    (``mallinfo2``); 0 where neither can be read."""
    out = fwd(_fresh_input(x_in))
    g = None if out.dim() == 0 else torch.randn_like(out)
    run = functools.partial(_deferred_backward, out, g, [])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        run()
        torch.cuda.synchronize(device)
        return max(0, torch.cuda.max_memory_allocated(device) - before) / MIB
    reader = glibc_in_use()
    if reader is None:
        return 0.0
    from torch.utils._python_dispatch import TorchDispatchMode

    in_use: Callable[[], int] = reader
    start = in_use()
    peak = [start]

    class Sample(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kw: Any = None) -> Any:
            res = func(*args, **(kw or {}))
            peak[0] = max(peak[0], in_use())
            return res

    with Sample():
        run()
    return max(0, peak[0] - start) / MIB


def glibc_in_use() -> Callable[[], int] | None:
    """A reader of glibc's bytes in use (heap chunks plus mmapped blocks), or None."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [
            (n, ctypes.c_size_t)
            for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                      "uordblks", "fordblks", "keepcost")
        ]  # fmt: skip

    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):  # not glibc, or older than 2.33
        return None
    fn.restype = MallInfo2

    def read() -> int:
        m = fn()
        return int(m.uordblks + m.hblkhd)

    return read


def measure_module(
    layer: nn.Module,
    family: str,
    x_in: torch.Tensor,
    st: ModelSettings,
    device: torch.device,
    target: torch.Tensor | None = None,
    repeats: int = 10,
    warmup: int = 2,
) -> dict[str, Any]:
    """Costs of one layer on its real input ``x_in`` (see the module doc). ``target``: the
    layer is the last one and its F includes the loss against it."""
    if repeats < 1 or warmup < 0:
        raise OctoPipeError("profile: --repeats must be >= 1 and --warmup >= 0; fix: e.g. 10, 2")
    params = _storages([*layer.parameters(), *layer.buffers()])
    p_mib = g_mib = o_mib = 0.0

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def fwd(x: torch.Tensor) -> torch.Tensor:
        out = layer(x)
        return loss_fn(out, target, st, 1) if target is not None else out

    fs, bs, ws, acts, stashes = [], [], [], [], []
    out_mib = 0.0
    for i in range(warmup + repeats):
        x = _fresh_input(x_in)
        saved: list[torch.Tensor] = []

        def pack(
            t: torch.Tensor, saved: list[torch.Tensor] = saved, xp: int = x.data_ptr()
        ) -> torch.Tensor:
            if t.untyped_storage().data_ptr() not in params and t.data_ptr() != xp:
                saved.append(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            tf, out = _timed(functools.partial(fwd, x), sync)
        g = None if out.dim() == 0 else torch.randn_like(out)
        store: list[Any] = []
        tb, _ = _timed(functools.partial(_deferred_backward, out, g, store), sync)
        stash = [t for item in store for t in item[1:3] if isinstance(t, torch.Tensor)]
        stash_mib = _nbytes([t for t in stash if t.untyped_storage().data_ptr() not in params])
        tw, _ = _timed(functools.partial(apply_weight_grads, store), sync)
        if i == warmup + repeats - 1:
            p_mib, g_mib, o_mib = weight_memory_mib(layer)
        layer.zero_grad(set_to_none=True)
        if i >= warmup:
            fs.append(tf)
            bs.append(tb)
            ws.append(tw)
            acts.append(_nbytes(saved))
            stashes.append(stash_mib)
            out_mib = 0.0 if target is not None else out.numel() * out.element_size() / MIB
    work_mib = backward_workspace_mib(fwd, x_in, device)
    layer.zero_grad(set_to_none=True)
    med = statistics.median
    act = med(acts)
    return {
        "family": family,
        "forward_ms": round(med(fs), 6),
        "backward_input_ms": round(med(bs), 6),
        "backward_weight_ms": round(med(ws), 6),
        "activation_mib": round(act, 6),
        "weight_mib": round(p_mib + g_mib + o_mib, 6),
        "output_mib": round(out_mib, 6),
        "w_stash_mib": round(min(med(stashes), act), 6),
        "workspace_mib": round(work_mib, 6),
        "_memory_mib": (p_mib, g_mib, o_mib),
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
    model: str = "",
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure each distinct layer type once, on its first layer; returns the profile as a
    dict (validated). ``model``: a model hook ``module:function`` (``executor/hooks.py``), else
    the stand-in layers. Layers are built one at a time (a per-stage hook builds only that
    layer) and fed the previous layer's real output."""
    if device == "cuda" and not torch.cuda.is_available():
        raise OctoPipeError("profile: --device cuda but no CUDA device; fix: use --device cpu")
    dev = (
        torch.device("cuda", torch.cuda.current_device())
        if device == "cuda"
        else torch.device("cpu")
    )
    families = [f for _, f in layers]
    names = [t for t, _ in layers]
    st = replace(st, factory=model).resolved(families)
    whole: list[nn.Module | None] | None = None
    if model and not is_per_stage(resolve_hook(model)):
        whole = build_layers(families, st, names=names)  # whole-model form: built once
    x, y = make_batch(st, 1)
    h: torch.Tensor = x[0].to(dev)
    target = y[0].to(dev)
    types: dict[str, dict[str, Any]] = {}
    memory: dict[str, tuple[float, float, float]] = {}
    for i, (tname, fam) in enumerate(layers):
        layer = whole[i] if whole is not None else build_layers(families, st, {i}, names=names)[i]
        assert layer is not None
        layer.to(dev)
        last = i == len(layers) - 1
        if tname not in types:
            if progress is not None:
                progress(f"layer {i} ({tname}, {fam})")
            row = measure_module(layer, fam, h, st, dev, target if last else None, repeats, warmup)
            memory[tname] = row.pop("_memory_mib")
            types[tname] = row
        if not last:
            with torch.no_grad():
                h = layer(h)
        if whole is not None:
            whole[i] = None
        del layer
    dname, mem = device_info(dev)
    what = f"model {model}" if model else "stand-in layers"
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
        "layers": names,
        "source": (
            f"measured by octopipe profile ({what}; torch {torch.__version__}, {dname}, "
            f"{torch.get_num_threads()} threads): hidden {st.hidden}, seq {st.seq}, "
            f"micro-batch {st.microbatch_size}, {st.dtype}, median of {repeats}; weight_mib = "
            "parameters + gradients + master copy and AdamW state as the executor keeps them, "
            "measured ("
            + "; ".join(f"{t} {p:.3g}+{g:.3g}+{o:.3g} MiB" for t, (p, g, o) in memory.items())
            + "); workspace_mib = peak above the start while B runs ("
            + ("CUDA allocator" if dev.type == "cuda" else "glibc bytes in use")
            + ")"
        ),
    }
    Profile.from_dict(data, "measured profile")  # validate
    return data
