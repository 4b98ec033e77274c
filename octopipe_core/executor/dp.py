"""Data parallelism and the optimizer step of one rank: flat buffers per stage.

Each local stage owns one flat buffer of its parameters' gradients (in the master dtype:
float32 for bf16/fp16 models, else the model's), padded to a multiple of the DP degree. It
lives for the whole job and the gradients accumulate into it as the backward produces them
(each parameter's ``main_grad`` is a view of it, as in Megatron-LM): a deferred weight gradient
is added there directly, and one autograd accumulates on ``.grad`` moves there at once (a
post-accumulate hook). So a bf16 model holds 2 + 4 + 4 + 8 = 18 bytes a parameter throughout
(weights, float32 gradients, master weights, AdamW moments), never a second full copy of
its gradients.

* ``launch(stage)`` (called by the runtime right after the plan's last W of that stage)
  starts the reduction of the stage's flat buffer over its DP group asynchronously:
  an all-reduce, or under ZeRO-1 a reduce-scatter that leaves each replica its shard;
* ``wait()`` (before the optimizer) waits for every reduction and divides by DP (gradients are
  averaged: the losses are means over each replica's micro-batches);
* ``step(lr, clip_coef)``: the optimizer updates the flat master copy (the whole buffer, or
  under ZeRO-1 this replica's shard with its shard of the optimizer state), then writes the
  parameters back (ZeRO-1: after an all-gather of the updated shards) and zeroes the flat
  gradient buffer for the next step.

The optimizer works on the flat buffers directly: AdamW is torch's fused kernel (the one
``torch.optim.AdamW(fused=True)`` runs: one pass over the state, no temporaries of its size),
SGD the two in-place adds of ``torch.optim.SGD``. ``torch.optim`` itself is not used: its
constructor and step import ``torch._dynamo``, about 2 s of CPU in every fresh rank, as long
again as ``import torch``.

The gradient norm for clipping: every rank's sum of squares, summed over the job (one small
all-reduce with the loss) and divided by the replicas that hold each element (DP without
ZeRO-1; ZeRO-1 shards are disjoint).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from octopipe_core.errors import OctoPipeError
from octopipe_core.executor.settings import OptimSettings

_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


# elements per chunk of the float64 gradient norm: 1/64 of the buffer, kept between 64 Ki
# (few kernel launches on small buffers) and 4 Mi (a 32 MiB float64 temporary)
_CHUNK_MIN, _CHUNK_MAX = 1 << 16, 1 << 22


def square_sum(t: torch.Tensor) -> float:
    """Sum of squares of ``t`` accumulated in float64, a chunk at a time: a float64 copy of a
    whole gradient buffer would take 16 bytes a parameter (29 GiB for 1.9 billion parameters),
    the chunks take at most 1/64 of that or 64 MiB.

    >>> square_sum(torch.tensor([3.0, 4.0]))
    25.0
    """
    acc = torch.zeros((), dtype=torch.float64, device=t.device)
    chunk = min(_CHUNK_MAX, max(_CHUNK_MIN, t.numel() // 64))
    for c in t.reshape(-1).split(chunk):
        acc += c.double().square().sum()
    return float(acc)


def _to_main_grad(p: torch.Tensor) -> None:
    """Move ``p.grad`` into ``p.main_grad`` (the flat buffer) and free it."""
    if p.grad is not None:
        p.main_grad.add_(p.grad)  # type: ignore[attr-defined]
        p.grad = None


@dataclass
class StageBuffer:
    """Flat buffers of one local stage."""

    stage: int
    names: list[str]
    params: list[torch.nn.Parameter]
    numel: int
    shard: int  # elements per replica (padded numel / dp)
    master: torch.Tensor  # full flat copy, or this replica's shard under ZeRO-1
    flat: torch.Tensor  # the gradients, accumulated (the params' main_grad views)
    # AdamW: "step" (float32, on the master's device, as the fused kernel wants it),
    # "exp_avg", "exp_avg_sq", each the master's shape; SGD keeps none
    state: dict[str, torch.Tensor]
    grad: torch.Tensor | None = None  # reduced (full, or shard), set by launch/wait
    work: Any = None
    launched_at: float = 0.0


class DataParallel:
    """Gradient reduction and optimizer of one rank's stages (see the module docstring)."""

    def __init__(
        self,
        stage_params: dict[int, list[tuple[str, torch.nn.Parameter]]],
        dp: int,
        dp_rank: int,
        dp_group: Any,
        zero1: bool,
        settings: OptimSettings,
        timeout_s: float = 45.0,
    ) -> None:
        self.dp, self.dp_rank, self.group = dp, dp_rank, dp_group
        self.zero1 = zero1 and dp > 1
        self.o = settings
        self.timeout = timedelta(seconds=timeout_s)
        self.buffers: dict[int, StageBuffer] = {}
        self.tail: list[tuple[str, float, float]] = []  # (name, start_s, end_s) of this step
        self._hooks: list[Any] = []
        for s, named in sorted(stage_params.items()):
            if not named:
                continue
            params = [p for _, p in named]
            mdt = torch.float32 if params[0].dtype in (torch.bfloat16, torch.float16) else None
            mdt = mdt or params[0].dtype
            numel = sum(p.numel() for p in params)
            shard = -(-numel // dp)
            full = torch.zeros(shard * dp, dtype=mdt, device=params[0].device)
            flat = torch.zeros(shard * dp, dtype=mdt, device=params[0].device)
            off = 0
            for p in params:  # one parameter at a time: no float32 copy of them all
                full[off : off + p.numel()].copy_(p.detach().reshape(-1))
                p.main_grad = flat[off : off + p.numel()].view_as(p)  # type: ignore[attr-defined]
                self._hooks.append(p.register_post_accumulate_grad_hook(_to_main_grad))
                off += p.numel()
            master = full[dp_rank * shard : (dp_rank + 1) * shard].clone() if self.zero1 else full
            names = [n for n, _ in named]
            state = {}  # exists from the start, so a checkpoint can load into it
            if settings.optimizer == "adamw":
                state = {
                    "step": torch.zeros((), dtype=torch.float32, device=master.device),
                    "exp_avg": torch.zeros_like(master),
                    "exp_avg_sq": torch.zeros_like(master),
                }
            self.buffers[s] = StageBuffer(s, names, params, numel, shard, master, flat, state)

    # ---- reduction ------------------------------------------------------------------------
    def launch(self, stage: int) -> None:
        """Flatten ``stage``'s gradients and start their reduction over DP (asynchronous)."""
        b = self.buffers.get(stage)
        if b is None or b.work is not None or b.grad is not None:
            return
        b.launched_at = time.perf_counter()
        flat = b.flat
        for p in b.params:  # gradients set on .grad outside autograd's accumulation, if any
            if p.grad is not None:
                _to_main_grad(p)
        if self.dp == 1:
            b.grad = flat
        elif self.zero1:
            b.grad = torch.empty(b.shard, dtype=flat.dtype, device=flat.device)
            b.work = _REDUCE_SCATTER(b.grad, flat, group=self.group, async_op=True)
        else:
            b.grad = flat
            b.work = dist.all_reduce(flat, group=self.group, async_op=True)

    def wait(self) -> None:
        """Wait for every reduction (launching any not yet started) and average over DP."""
        for s, b in self.buffers.items():
            self.launch(s)
            if b.work is not None:
                try:
                    ok = b.work.wait(self.timeout)
                except Exception as e:
                    raise OctoPipeError(f"gradient reduction of stage {s} failed: {e}") from e
                if ok is False:
                    raise OctoPipeError(f"gradient reduction of stage {s} timed out")
                b.work = None
            if self.dp > 1:
                assert b.grad is not None
                b.grad.div_(self.dp)
            self.tail.append((f"{s}DP", b.launched_at, time.perf_counter()))

    def reduced_grads(self) -> dict[str, torch.Tensor]:
        """The averaged gradients by parameter name (ZeRO-1: gathered from the shards)."""
        out: dict[str, torch.Tensor] = {}
        for b in self.buffers.values():
            assert b.grad is not None, "call wait() first"
            full = self._gather(b, b.grad) if self.zero1 else b.grad
            off = 0
            for n, p in zip(b.names, b.params, strict=True):
                out[n] = full[off : off + p.numel()].view_as(p).to(p.dtype).detach().cpu().clone()
                off += p.numel()
        return out

    def grad_sq_sum(self) -> float:
        """Sum of squares of this rank's averaged gradients (its shards under ZeRO-1). Summed
        over the job, divided by ``norm_divisor``, it is the squared global gradient norm."""
        sq = 0.0
        for b in self.buffers.values():
            assert b.grad is not None
            sq += square_sum(b.grad)
        return sq

    @property
    def norm_divisor(self) -> int:
        """Replicas that hold each gradient element (DP without ZeRO-1, else 1)."""
        return 1 if self.zero1 else self.dp

    # ---- optimizer ------------------------------------------------------------------------
    def step(self, lr: float, clip_coef: float = 1.0) -> None:
        """One optimizer step at ``lr`` on the (clipped) averaged gradients; clears them."""
        t0 = time.perf_counter()
        for b in self.buffers.values():
            assert b.grad is not None
            if clip_coef != 1.0:
                b.grad.mul_(clip_coef)  # in place: no second copy of the gradients
        if self.o.optimizer == "sgd":
            self._sgd(lr)
        else:
            self._adamw(lr)
        for b in self.buffers.values():
            full = self._gather(b, b.master) if self.zero1 else b.master
            with torch.no_grad():
                off = 0
                for p in b.params:
                    p.copy_(full[off : off + p.numel()].view_as(p))
                    off += p.numel()
            b.grad = None
            b.flat.zero_()  # the next step accumulates from zero
        self.tail.append(("OPT", t0, time.perf_counter()))

    def _adamw(self, lr: float) -> None:
        """torch.optim.AdamW's fused step (decoupled weight decay), per device and dtype."""
        o = self.o
        groups: dict[tuple[torch.device, torch.dtype], list[StageBuffer]] = {}
        for b in self.buffers.values():
            groups.setdefault((b.master.device, b.master.dtype), []).append(b)
        for bufs in groups.values():
            steps = [b.state["step"] for b in bufs]
            grads = [b.grad for b in bufs if b.grad is not None]
            assert len(grads) == len(bufs), "call wait() first"
            torch._foreach_add_(steps, 1)
            torch._fused_adamw_(
                [b.master for b in bufs],
                grads,
                [b.state["exp_avg"] for b in bufs],
                [b.state["exp_avg_sq"] for b in bufs],
                [],  # no AMSGrad
                steps,
                lr=lr,
                beta1=o.beta1,
                beta2=o.beta2,
                weight_decay=o.weight_decay,
                eps=o.eps,
                amsgrad=False,
                maximize=False,
            )

    def _sgd(self, lr: float) -> None:
        """torch.optim.SGD without momentum: ``p -= lr (g + weight_decay p)``."""
        wd = self.o.weight_decay
        with torch.no_grad():
            for b in self.buffers.values():
                assert b.grad is not None
                g = b.grad.add(b.master, alpha=wd) if wd != 0 else b.grad
                b.master.add_(g, alpha=-lr)

    def release(self) -> None:
        """Detach the parameters from the flat buffers (hooks and ``main_grad`` views)."""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        for b in self.buffers.values():
            for p in b.params:
                if hasattr(p, "main_grad"):
                    del p.main_grad

    def _gather(self, b: StageBuffer, shard: torch.Tensor) -> torch.Tensor:
        full = torch.empty(b.shard * self.dp, dtype=shard.dtype, device=shard.device)
        work = _ALL_GATHER(full, shard.contiguous(), group=self.group, async_op=True)
        if work.wait(self.timeout) is False:
            raise OctoPipeError(f"parameter all-gather of stage {b.stage} timed out")
        return full

    # ---- checkpoint state -----------------------------------------------------------------
    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Master copies and optimizer state, keyed so that replicated tensors share a key
        (saved once) and ZeRO-1 shards do not."""
        out: dict[str, torch.Tensor] = {}
        for s, b in self.buffers.items():
            tag = f"s{s}.dp{self.dp_rank}" if self.zero1 else f"s{s}"
            out[f"master.{tag}"] = b.master
            for k, v in b.state.items():
                out[f"optim.{tag}.{k}"] = v
        return out
