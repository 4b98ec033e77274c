"""DAG-driven pipeline runtime: each rank walks its lowered op list with torch.distributed P2P.

* ``RECV_*``: ``irecv`` posted where the list says (on gloo, by default, all of a step's
  receives are posted at its start in list order: posting never blocks there and a receive
  posted after its send costs a wake-up of the sender's I/O thread); waited right before the
  consuming compute.
* ``SEND_*``: ``isend`` right after the producer; waited lazily (polled, all at step end).
  On NCCL each run of consecutive comm ops is posted as one ``batch_isend_irecv``.
* ``F``: runs the stage's layers on a detached input (so each stage has its own graph).
* ``B``: backward with weight gradients deferred (``models.defer_weight_grads``): the input
  gradient goes to the previous stage; ``W`` later computes the queued weight gradients.
  ``BW``: a plain full backward.

Gloo on CPU and NCCL on GPU (device from the backend). Every wait has a timeout, so a dead or
stuck peer ends the job with an error instead of a hang. Every op's start/end is recorded.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from octopipe_core.dp_sync import last_weight_actions
from octopipe_core.errors import OctoPipeError
from octopipe_core.executor.checker import check_lowered
from octopipe_core.executor.lowering import LoweredPlan, Op, lowered_from_strings
from octopipe_core.executor.models import (
    ModelSettings,
    apply_weight_grads,
    build_layers,
    defer_weight_grads,
    loss_fn,
    make_batch,
    param_names,
)
from octopipe_core.plan import Plan, plan_from_dict
from octopipe_core.profile import Profile

_DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.int64]


class PeerError(RuntimeError):
    """A peer died, timed out, or sent something unexpected."""


@dataclass
class OpRecord:
    """One executed op: times are ``time.perf_counter()`` seconds (one clock per host)."""

    step: int
    op: str
    start: float
    end: float
    wait: float = 0.0  # seconds spent waiting for inputs before ``start``


@dataclass
class StepResult:
    loss: float | None
    start: float
    end: float
    records: list[OpRecord] = field(default_factory=list)


def config_parts(cfg: dict[str, Any]) -> tuple[Plan, Profile, LoweredPlan, ModelSettings]:
    """Plan, profile, lowered lists and model settings of an executor config."""
    plan = plan_from_dict(cfg["plan"], "executor config")
    prof = Profile.from_dict(cfg["plan"]["profile"], "executor config#profile")
    lp = lowered_from_strings(plan, cfg["lowered"])
    check_lowered(lp)  # a hand-edited comm order that would mismatch or deadlock never runs
    return plan, prof, lp, ModelSettings.from_dict(cfg.get("model", {}))


class PipelineExecutor:
    """Runs one rank's share of a lowered plan."""

    def __init__(
        self,
        lowered: LoweredPlan,
        families: list[str],
        settings: ModelSettings,
        rank: int,
        device: torch.device,
        timeout_s: float = 45.0,
        peers: list[int] | None = None,
        names: list[str] | None = None,
    ) -> None:
        self.lp, self.plan = lowered, lowered.plan
        self.rank, self.device, self.timeout = rank, device, timedelta(seconds=timeout_s)
        # global rank of each pipeline device of this replica (identity with one replica)
        self.peers = list(peers) if peers is not None else list(range(self.plan.num_devices))
        self.st = settings.resolved(families)
        self.S, self.M = self.plan.num_stages, self.plan.num_microbatches
        self.ops = lowered.ranks[rank]
        self.my_stages = self.plan.stages_on(rank)
        keep = {i for s in self.my_stages for i in range(*self.plan.partition[s])}
        self.layers = build_layers(families, self.st, keep, names=names)
        for m in self.layers:
            if m is not None:
                m.to(device)
        self.params = param_names(self.layers)
        x, y = make_batch(self.st, self.M)
        self.x, self.y = x.to(device), y.to(device)
        self.shapes: dict[int, tuple[tuple[int, ...], torch.dtype]] = {}
        self.fault = _fault_point(self.peers[rank])
        # the plan's last W/BW of each local stage: its gradients are final after that op
        self.grads_done = {
            self.plan.schedule[d][i]: s
            for s, (d, i) in last_weight_actions(self.plan).items()
            if d == rank
        }

        self.sync = device.type == "cuda"
        # NCCL runs a pair's sends and receives in order on one stream: post each run of
        # consecutive comm ops as one batch so facing sends cannot block each other.
        self.batch = dist.is_initialized() and dist.get_backend() == "nccl"
        self.batch = self.batch or os.environ.get("OCTOPIPE_BATCH_P2P") == "1"
        # Gloo: post every receive of a step at its start (list order, so each pair's FIFO
        # order is kept). Posting never blocks there, and a receive posted after its send
        # needs the sender's I/O thread to wake up (ms on a loaded CPU); NCCL keeps the list.
        mode = os.environ.get("OCTOPIPE_PREPOST", "auto")
        self.prepost = not self.batch and (mode == "all" or (mode == "auto" and not self.sync))

    # ---- helpers --------------------------------------------------------------------------
    def _run_stage(self, s: int, h: Any) -> Any:
        lo, hi = self.plan.partition[s]
        for i in range(lo, hi):
            layer = self.layers[i]
            assert layer is not None
            h = layer(h)
        return h

    def _peer(self, op: Op) -> int:
        m = self.lp.messages[op.message_key()]
        return self.peers[m.dst if op.kind.is_send else m.src]

    def set_batch(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """This step's inputs and targets ``[microbatch][microbatch_size, seq, ...]``."""
        self.x, self.y = x.to(self.device), y.to(self.device)

    def stage_params(self, s: int) -> list[tuple[str, nn.Parameter]]:
        """``(name, parameter)`` of stage ``s``'s trainable parameters, in layer order."""
        lo, hi = self.plan.partition[s]
        return [
            (f"{i}.{n}", p)
            for i in range(lo, hi)
            if self.layers[i] is not None
            for n, p in self.layers[i].named_parameters()  # type: ignore[union-attr]
            if p.requires_grad
        ]

    def _wait(self, work: Any, what: str) -> None:
        try:
            ok = work.wait(self.timeout)
        except Exception as e:  # gloo raises on a closed connection or a timeout
            raise PeerError(f"rank {self.rank}: {what} failed: {e}") from e
        if ok is False:
            raise PeerError(f"rank {self.rank}: {what} timed out after {self.timeout}")

    def infer_shapes(self) -> None:
        """Exchange the boundary tensor shapes along the stage chain (one dummy forward)."""
        hdr = torch.zeros(10, dtype=torch.int64, device=self.device)
        for s in self.my_stages:
            if s == 0:
                inp: Any = self.x[0]
            else:
                prev = self.plan.placement[s - 1]
                if prev != self.rank:
                    prev = self.peers[prev]
                    work = dist.irecv(hdr, src=prev)
                    self._wait(work, f"shape exchange with rank {prev}")
                    dt = _DTYPES[int(hdr[0])]
                    self.shapes[s - 1] = (tuple(int(v) for v in hdr[2 : 2 + int(hdr[1])]), dt)
                shape, dt = self.shapes[s - 1]
                inp = torch.zeros(shape, dtype=dt, device=self.device)
            if s == self.S - 1:
                continue
            with torch.no_grad():
                out = self._run_stage(s, inp)
            self.shapes[s] = (tuple(out.shape), out.dtype)
            nxt = self.plan.placement[s + 1]
            if nxt != self.rank:
                nxt = self.peers[nxt]
                h = torch.zeros(10, dtype=torch.int64, device=self.device)
                h[0], h[1] = _DTYPES.index(out.dtype), out.dim()
                h[2 : 2 + out.dim()] = torch.tensor(out.shape)
                self._wait(dist.isend(h, dst=nxt), f"shape exchange with rank {nxt}")

    def zero_grad(self) -> None:
        for p in self.params.values():
            p.grad = None

    # ---- one step -------------------------------------------------------------------------
    def step(
        self, step_idx: int = 0, on_grads_done: Callable[[int], None] | None = None
    ) -> StepResult:
        """Run this rank's list once; returns the local loss share and op records.

        ``on_grads_done(stage)`` is called right after the plan's last W (or BW) of each local
        stage, when that stage's gradients are final (the data-parallel reduction starts
        there)."""
        self.zero_grad()
        acts: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        local: dict[tuple[str, int, int], torch.Tensor] = {}  # same-rank hand-offs
        recvs: dict[tuple[str, int, int], tuple[Any, torch.Tensor]] = {}
        sends: list[tuple[Any, torch.Tensor, str]] = []
        stores: dict[tuple[int, int], list[Any]] = {}
        records: list[OpRecord] = []
        pending: list[tuple[Op, Any, torch.Tensor]] = []
        loss_sum: float | None = None
        t_start = time.perf_counter()
        if self.prepost:
            for op in self.ops:
                if op.kind.is_recv:
                    recvs[op.message_key()] = self._post_recv(op)
        for idx, op in enumerate(self.ops):
            if self.fault and self.fault[:2] == (step_idx, idx):
                if self.fault[2] == "hang":
                    time.sleep(3600)
                os.kill(os.getpid(), signal.SIGKILL)
            t0 = time.perf_counter()
            wait = 0.0
            s, k, m = op
            if k.is_recv:
                if self.batch:
                    shape, dt = self.shapes[s - 1] if k == "RECV_F" else self.shapes[s]
                    buf = torch.empty(shape, dtype=dt, device=self.device)
                    pending.append((op, dist.P2POp(dist.irecv, buf, self._peer(op)), buf))
                elif not self.prepost:  # (pre-posted at the step start, in this same order)
                    recvs[op.message_key()] = self._post_recv(op)
            elif k.is_send:
                t = local.pop(op.message_key()).contiguous()
                if self.batch:
                    pending.append((op, dist.P2POp(dist.isend, t, self._peer(op)), t))
                else:
                    sends.append((dist.isend(t, dst=self._peer(op)), t, str(op)))
            elif pending:  # NCCL: post the run of comm ops before this compute as one batch
                self._flush(pending, recvs, sends)
            if k == "F":
                if s == 0:
                    h: Any = self.x[m]
                else:
                    h, wait = self._input(("F", s - 1, m), local, recvs)
                    t0 += wait
                x_in = h.detach()
                if x_in.is_floating_point():
                    x_in.requires_grad_(True)
                out = self._run_stage(s, x_in)
                if s == self.S - 1:
                    out = loss_fn(out, self.y[m], self.st, self.M)
                    loss_sum = (loss_sum or 0.0) + float(out.detach())
                else:
                    self._hand(("F", s, m), out.detach(), local)
                acts[(s, m)] = (x_in, out)
            elif k in ("B", "BW"):
                x_in, out = acts.pop((s, m))
                g = None
                if s < self.S - 1:
                    g, wait = self._input(("B", s + 1, m), local, recvs)
                    t0 += wait
                if k == "B":
                    store: list[Any] = []
                    with defer_weight_grads(store):
                        torch.autograd.backward(out, g)
                    stores[(s, m)] = store
                else:
                    torch.autograd.backward(out, g)
                if s > 0:
                    gin = x_in.grad if x_in.grad is not None else torch.zeros_like(x_in)
                    self._hand(("B", s, m), gin, local)
                del x_in, out, g
            elif k == "W":
                apply_weight_grads(stores.pop((s, m)))
            if self.sync and not op.is_comm:
                torch.cuda.synchronize(self.device)
            records.append(OpRecord(step_idx, str(op), t0, time.perf_counter(), wait))
            if on_grads_done is not None and k in ("W", "BW"):
                done = self.grads_done.get(op.action)
                if done is not None:
                    on_grads_done(done)
            if len(sends) > 8:
                sends = [x for x in sends if not x[0].is_completed()]
        if pending:
            self._flush(pending, recvs, sends)
        for work, _, name in sends:
            self._wait(work, f"send {name}")
        if recvs:
            raise PeerError(f"rank {self.rank}: receives never consumed: {sorted(recvs)}")
        return StepResult(loss_sum, t_start, time.perf_counter(), records)

    def _post_recv(self, op: Op) -> tuple[Any, torch.Tensor]:
        s = op.stage
        shape, dt = self.shapes[s - 1] if op.kind == "RECV_F" else self.shapes[s]
        buf = torch.empty(shape, dtype=dt, device=self.device)
        return dist.irecv(buf, src=self._peer(op)), buf

    def _flush(
        self,
        pending: list[tuple[Op, Any, torch.Tensor]],
        recvs: dict[tuple[str, int, int], tuple[Any, torch.Tensor]],
        sends: list[tuple[Any, torch.Tensor, str]],
    ) -> None:
        works = dist.batch_isend_irecv([p for _, p, _ in pending])
        if len(works) != len(pending):  # coalesced into one work
            works = [works[-1]] * len(pending)
        for (op, _, t), w in zip(pending, works, strict=True):
            if op.kind.is_recv:
                recvs[op.message_key()] = (w, t)
            else:
                sends.append((w, t, str(op)))
        pending.clear()

    def _hand(
        self, key: tuple[str, int, int], t: torch.Tensor, local: dict[tuple[str, int, int], Any]
    ) -> None:
        local[key] = t

    def _input(
        self,
        key: tuple[str, int, int],
        local: dict[tuple[str, int, int], torch.Tensor],
        recvs: dict[tuple[str, int, int], tuple[Any, torch.Tensor]],
    ) -> tuple[torch.Tensor, float]:
        if key in recvs:
            work, buf = recvs.pop(key)
            t = time.perf_counter()
            self._wait(work, f"receive of {key[0]}-message of stage {key[1]} mb {key[2]}")
            return buf, time.perf_counter() - t
        if key in local:
            return local.pop(key), 0.0
        raise PeerError(f"rank {self.rank}: input {key} neither received nor local")


def _fault_point(rank: int) -> tuple[int, int, str] | None:
    """``OCTOPIPE_FAULT=rank:step:op[:hang]`` kills (SIGKILL) or hangs that rank at that op
    (fault injection for tests)."""
    spec = os.environ.get("OCTOPIPE_FAULT", "")
    if not spec:
        return None
    parts = spec.split(":")
    r, st, op = (int(v) for v in parts[:3])
    return (st, op, parts[3] if len(parts) > 3 else "kill") if r == rank else None


# --------------------------------------------------------------------------------------------
def pick_backend(backend: str, local_ranks: int | None = None) -> str:
    """The process-group backend for ``backend`` ("auto", "gloo" or "nccl") with
    ``local_ranks`` ranks on this node (default: torchrun's ``LOCAL_WORLD_SIZE``). NCCL needs a
    GPU of its own for every local rank (it refuses two ranks on one device): "auto" picks it
    only then, and an explicit "nccl" without enough GPUs is a one-line error.

    >>> pick_backend("gloo", 4)
    'gloo'
    """
    if local_ranks is None:
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "auto":
        return "nccl" if 0 < local_ranks <= gpus else "gloo"
    if backend == "nccl" and gpus < local_ranks:
        raise OctoPipeError(
            f"backend nccl: {local_ranks} rank(s) on this node but {gpus} GPU(s); NCCL needs "
            "one GPU per rank; fix: use --backend gloo, or spread the ranks over more nodes"
        )
    return backend


def init_distributed(backend: str, timeout_s: float) -> tuple[int, int, torch.device]:
    """``init_process_group`` from torchrun's environment; returns rank, world, device."""
    be = pick_backend(backend)
    if be == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(be, timeout=timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size(), device


def execute(*args: Any, **kwargs: Any) -> dict[str, Any] | None:
    """Moved to ``executor.train.execute`` (the training loop); kept for callers of this name."""
    from octopipe_core.executor.train import execute as train_execute

    return train_execute(*args, **kwargs)
