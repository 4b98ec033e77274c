"""Single-process reference: the same model on the same data, no pipeline."""

from __future__ import annotations

from typing import Any

import torch

from octopipe_core.executor.models import (
    ModelSettings,
    build_layers,
    loss_fn,
    make_batch,
    param_names,
)


def reference_run(
    families: list[str], settings: ModelSettings, num_microbatches: int
) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss (mean over micro-batches) and gradients keyed ``"{layer}.{param}"``."""
    st = settings.resolved(families)
    layers = build_layers(families, st)
    x, y = make_batch(st, num_microbatches)
    total = 0.0
    for m in range(num_microbatches):
        h: Any = x[m]
        for layer in layers:
            assert layer is not None
            h = layer(h)
        loss = loss_fn(h, y[m], st, num_microbatches)
        loss.backward()
        total += float(loss.detach())
    grads = {
        k: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
        for k, p in param_names(layers).items()
    }
    return total, grads


def compare_grads(
    got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]
) -> tuple[float, list[str]]:
    """Max absolute gradient difference and the names missing on either side."""
    missing = sorted(set(got) ^ set(ref))
    diff = 0.0
    for k in set(got) & set(ref):
        diff = max(diff, float((got[k].double() - ref[k].double()).abs().max()))
    return diff, missing
