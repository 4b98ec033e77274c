"""The model hook: ``--model module:function`` builds the user's own layers.

**Per-stage form (the main one).** A function with a ``layers`` parameter builds only the
layers it is asked for::

    def build(layers: list[int], families: list[str], hidden: int, vocab: int,
              seed: int) -> list[nn.Module]:
        out = []
        for i, fam in zip(layers, families):
            seed_layer(seed, i)          # layer i's weights depend on i only
            out.append(make_my_layer(fam, hidden, vocab))
        return out

Each rank calls it once per contiguous run of its own layers (a stage, or adjacent stages on
the same rank) and never builds the others; the single-process reference calls it once with
every layer. It gets, by name, whichever of these its signature lists (``**kwargs`` gets all):

* ``layers``: global indices of the layers to build, ascending;
* ``families`` / ``names``: profile family / layer type name of each of those layers;
* ``num_layers``, ``model_families``, ``model_names``: the whole model's;
* the model settings: ``hidden``, ``seq``, ``vocab``, ``microbatch_size``, ``dtype`` (a name:
  ``"float32"``...), ``seed``, ``mamba_state``, ``moe_experts``, ``moe_topk``.

It returns one ``nn.Module`` per requested layer, in order. Seed each layer from its index
(``seed_layer``) so that any split of the model builds the same weights as the whole.

**Whole-model form (backwards compatible).** A function without a ``layers`` parameter returns
every layer of the model (``families`` is then the whole model's); it is called once, seeded
with ``seed``, and the layers outside this rank are dropped.

Every layer maps one tensor to one tensor: the first takes token ids (an ``embedding`` first
layer) or hidden states, the last returns logits (an ``lm_head`` last layer: cross-entropy loss)
or hidden states (mean-square loss). A layer that returns a tuple (as HuggingFace decoder
layers do) passes its first element on. ``nn.Linear`` / ``nn.Embedding`` weights get the split
input/weight backward (``models.make_deferrable``). For HuggingFace decoder layers (rotary
position embeddings, causal masks, embedding and head ends) see ``executor/hf.py``.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from octopipe_core.errors import OctoPipeError

if TYPE_CHECKING:
    from octopipe_core.executor.models import ModelSettings

PER_STAGE_ARGS = ("layers", "families", "names", "num_layers", "model_families", "model_names")


def layer_seed(seed: int, index: int) -> int:
    """The seed of layer ``index`` (the stand-in layers use the same one).

    >>> layer_seed(0, 3), layer_seed(1, 0)
    (3, 100003)
    """
    return seed * 100003 + index


def seed_layer(seed: int, index: int) -> None:
    """Seed torch's generator for building layer ``index`` (call it before each layer)."""
    torch.manual_seed(layer_seed(seed, index))


def resolve_hook(spec: str, option: str = "--model") -> Callable[..., Any]:
    """Import ``module:function``; a one-line ``OctoPipeError`` when it cannot be."""
    mod_name, _, fn_name = spec.partition(":")
    if not mod_name or not fn_name:
        raise OctoPipeError(f"{option} {spec!r}: expected module:function; fix: e.g. mypkg.m:build")
    try:
        fn = getattr(importlib.import_module(mod_name), fn_name)
    except (ImportError, AttributeError) as e:
        raise OctoPipeError(f"{option} {spec!r}: cannot import ({e}); fix: check PYTHONPATH") from e
    if not callable(fn):
        raise OctoPipeError(f"{option} {spec!r}: not a function; fix: name a function")
    return fn  # type: ignore[no-any-return]


def is_per_stage(fn: Callable[..., Any]) -> bool:
    """True for the per-stage form (a ``layers`` parameter), False for the whole-model form."""
    return "layers" in inspect.signature(fn).parameters


def _call(spec: str, fn: Callable[..., Any], avail: dict[str, Any]) -> Any:
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kwargs = dict(avail)
    else:
        kwargs = {k: v for k, v in avail.items() if k in params}
    for name, p in params.items():
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        if p.default is inspect.Parameter.empty and name not in kwargs:
            raise OctoPipeError(
                f"--model {spec!r}: parameter {name!r} has no default and OctoPipe does not "
                f"provide it; fix: give it a default or use {', '.join(sorted(avail))}"
            )
    return fn(**kwargs)


def _check_modules(spec: str, got: Any, want: int, what: str) -> list[nn.Module]:
    if isinstance(got, nn.Module) and not isinstance(got, (nn.ModuleList, nn.Sequential)):
        got = [got]
    if not isinstance(got, (Sequence, nn.ModuleList, nn.Sequential)) or isinstance(got, str):
        raise OctoPipeError(
            f"--model {spec!r}: returned a {type(got).__name__} for {what}; fix: return a list "
            "with one nn.Module per layer"
        )
    mods = list(got)
    if len(mods) != want:
        raise OctoPipeError(
            f"--model {spec!r}: returned {len(mods)} modules for {what} ({want} asked); fix: "
            "return one nn.Module per requested layer, in order"
        )
    for j, m in enumerate(mods):
        if not isinstance(m, nn.Module):
            raise OctoPipeError(
                f"--model {spec!r}: item {j} for {what} is a {type(m).__name__}, not an "
                "nn.Module; fix: return torch.nn modules"
            )
    return mods


def _first_output(module: nn.Module, args: Any, out: Any) -> Any:
    """Forward hook: a tuple (or ModelOutput) output passes its first element on."""
    if isinstance(out, (tuple, list)):
        return out[0]
    if hasattr(out, "to_tuple"):
        return out.to_tuple()[0]
    return out


def prepare_layer(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A user layer as the executor runs it: cast, split backward, first output passed on."""
    from octopipe_core.executor.models import make_deferrable

    module = make_deferrable(module.to(dtype))
    if not getattr(module, "_octopipe_first_output", False):
        module.register_forward_hook(_first_output)
        module._octopipe_first_output = True  # type: ignore[assignment]
    return module


def contiguous_runs(indices: Sequence[int]) -> list[list[int]]:
    """Sorted indices split into runs of consecutive values.

    >>> contiguous_runs([5, 0, 1, 2, 6])
    [[0, 1, 2], [5, 6]]
    """
    runs: list[list[int]] = []
    for i in sorted(set(indices)):
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def build_hook_layers(
    spec: str,
    st: ModelSettings,
    families: list[str],
    keep: set[int] | None = None,
    names: list[str] | None = None,
) -> list[nn.Module | None]:
    """The layers of ``spec`` in profile order, None outside ``keep`` (see the module doc)."""
    n = len(families)
    names = list(names) if names is not None else list(families)
    if len(names) != n:
        raise OctoPipeError(f"model: {len(names)} layer names for {n} layers; fix: one per layer")
    fn = resolve_hook(spec)
    settings = st.to_dict()
    out: list[nn.Module | None] = [None] * n
    dtype = st.torch_dtype()
    if not is_per_stage(fn):
        torch.manual_seed(st.seed)
        got = _call(spec, fn, {**settings, "families": list(families)})
        mods = _check_modules(spec, got, n, "the whole model (the profile's layers)")
        for i, m in enumerate(mods):
            if keep is None or i in keep:
                out[i] = prepare_layer(m, dtype)
        return out
    wanted = range(n) if keep is None else sorted(keep)
    bad = [i for i in wanted if not 0 <= i < n]
    if bad:
        raise OctoPipeError(f"model: layer {bad[0]} out of range 0..{n - 1}; fix: check the plan")
    for run in contiguous_runs(list(wanted)):
        avail = {
            **settings,
            "layers": list(run),
            "families": [families[i] for i in run],
            "names": [names[i] for i in run],
            "num_layers": n,
            "model_families": list(families),
            "model_names": list(names),
        }
        torch.manual_seed(layer_seed(st.seed, run[0]))
        what = f"layers {run[0]}..{run[-1]}" if len(run) > 1 else f"layer {run[0]}"
        mods = _check_modules(spec, _call(spec, fn, avail), len(run), what)
        for i, m in zip(run, mods, strict=True):
            out[i] = prepare_layer(m, dtype)
    return out
