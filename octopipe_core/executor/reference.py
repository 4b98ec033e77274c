"""Single-process reference: the same model on the same data, no pipeline, no replicas."""

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

Batch = tuple[torch.Tensor, torch.Tensor]


def _forward_backward(
    layers: list[Any], st: ModelSettings, batches: list[Batch], num_microbatches: int
) -> float:
    """Loss of the union of ``batches`` (mean over replicas of each replica's micro-batch
    mean), gradients accumulated on ``layers``."""
    total = 0.0
    scale = num_microbatches * len(batches)
    for x, y in batches:
        for m in range(num_microbatches):
            h: Any = x[m]
            for layer in layers:
                assert layer is not None
                h = layer(h)
            loss = loss_fn(h, y[m], st, scale)
            loss.backward()
            total += float(loss.detach())
    return total


def reference_run(
    families: list[str],
    settings: ModelSettings,
    num_microbatches: int,
    batches: list[Batch] | None = None,
    device: torch.device | None = None,
) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and gradients (on the CPU) keyed ``"{layer}.{param}"`` of one step on the union of
    ``batches`` (one per DP replica; default: the gradient check's ``make_batch``), computed on
    ``device`` (default: the CPU)."""
    st = settings.resolved(families)
    layers = build_layers(families, st)
    if batches is None:
        batches = [make_batch(st, num_microbatches)]
    if device is not None:
        for layer in layers:
            if layer is not None:
                layer.to(device)
        batches = [(x.to(device), y.to(device)) for x, y in batches]
    total = _forward_backward(layers, st, batches, num_microbatches)
    grads = {
        k: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().cpu().clone()
        for k, p in param_names(layers).items()
    }
    return total, grads


def reference_train(
    families: list[str],
    settings: ModelSettings,
    num_microbatches: int,
    step_batches: list[list[Batch]],
    optim: Any,
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses and final parameters of ``len(step_batches)`` training steps on one process
    with ``torch.optim.AdamW`` (or SGD), global-norm clipping and the LR schedule of
    ``optim`` (a ``dp.OptimSettings``): what the pipelined DP job must reproduce."""
    st = settings.resolved(families)
    layers = build_layers(families, st)
    params = param_names(layers)
    plist = list(params.values())
    if optim.optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(
            plist, lr=optim.lr, weight_decay=optim.weight_decay
        )
    else:
        opt = torch.optim.AdamW(
            plist, lr=optim.lr, betas=(optim.beta1, optim.beta2), eps=optim.eps,
            weight_decay=optim.weight_decay,
        )  # fmt: skip
    losses = []
    horizon = optim.decay_steps or len(step_batches)
    for i, batches in enumerate(step_batches):
        opt.zero_grad(set_to_none=True)
        losses.append(_forward_backward(layers, st, batches, num_microbatches))
        for p in plist:  # the executor's flat buffers give unused parameters zero gradients
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        norm = float(
            torch.stack([p.grad.double().pow(2).sum() for p in plist if p.grad is not None])
            .sum()
            .sqrt()
        )
        if optim.clip > 0:
            coef = min(1.0, optim.clip / (norm + 1e-6))
            for p in plist:
                if p.grad is not None and coef != 1.0:
                    p.grad.mul_(coef)
        for g in opt.param_groups:
            g["lr"] = optim.lr_at(i, horizon)
        opt.step()
    return losses, {k: p.detach().clone() for k, p in params.items()}


def compare_grads(
    got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]
) -> tuple[float, list[str]]:
    """Max absolute gradient difference and the names missing on either side."""
    missing = sorted(set(got) ^ set(ref))
    diff = 0.0
    for k in set(got) & set(ref):
        diff = max(diff, float((got[k].double() - ref[k].double()).abs().max()))
    return diff, missing


def check_against_reference(
    cfg: dict[str, Any],
    families: list[str],
    loss: float,
    grads: dict[str, torch.Tensor],
    job_dir: Any = None,
    device: torch.device | None = None,
) -> tuple[float, float, float, list[str]]:
    """The first step of a run of ``cfg`` against the single-process reference on the same
    batches, computed on ``device`` (the job's device type: a model's own float32 parts, such
    as rotary tables, differ between CPU and GPU kernels by more than the float64 tolerance):
    ``(reference loss, loss difference, max gradient difference, missing names)``."""
    from octopipe_core.executor.data import config_batches

    st = ModelSettings.from_dict(cfg["model"])
    m = int(cfg["plan"]["num_microbatches"])
    batches = config_batches(cfg, 0, job_dir)
    ref_loss, ref_grads = reference_run(families, st, m, batches, device)
    diff, missing = compare_grads(grads, ref_grads)
    return ref_loss, abs(loss - ref_loss), diff, missing
