"""Small pure-torch stand-in layers per profile family, and the split input/weight backward.

Every matmul weight goes through ``deferred_linear`` (embeddings through ``deferred_embedding``):
inside ``defer_weight_grads(store)`` their backward computes only the input gradient and
appends what the weight gradient needs (input, output grad) to ``store``; ``apply_weight_grads``
later computes and accumulates the weight gradients. That is the zero-bubble B/W split without
recomputation. Outside the context they behave like ``F.linear`` / ``F.embedding``. Other
parameters (norm scales, the SSM's A/D/conv) get their gradients during B.

A user model (the ``module:function`` model hook of ``executor/hooks.py``) gets the same split:
``make_deferrable`` routes its ``nn.Linear`` and ``nn.Embedding`` modules through these
functions.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from octopipe_core.errors import OctoPipeError

_STORE: list[tuple[Any, ...]] | None = None


@contextmanager
def defer_weight_grads(store: list[tuple[Any, ...]]) -> Iterator[None]:
    """Within the block, linear/embedding weight gradients are queued on ``store``."""
    global _STORE
    prev, _STORE = _STORE, store
    try:
        yield
    finally:
        _STORE = prev


def _acc(p: torch.Tensor, g: torch.Tensor) -> None:
    """Accumulate the weight gradient ``g`` of ``p``: into its flat-buffer view ``main_grad``
    when the training job gave it one (``executor/dp.py``), else on ``p.grad``."""
    main = getattr(p, "main_grad", None)
    if main is not None:
        main.add_(g)
        return
    if p.grad is None:
        p.grad = g.detach().clone()
    else:
        p.grad.add_(g)


def apply_weight_grads(store: list[tuple[Any, ...]]) -> None:
    """Compute and accumulate the weight gradients queued by a split backward (the W pass)."""
    for item in store:
        if item[0] == "linear":
            _, x, g, w, b = item
            g2 = g.reshape(-1, g.shape[-1])
            _acc(w, g2.t() @ x.reshape(-1, x.shape[-1]))
            if b is not None:
                _acc(b, g2.sum(0))
        else:
            _, ids, g, w = item
            gw = torch.zeros_like(w)
            gw.index_add_(0, ids.reshape(-1), g.reshape(-1, g.shape[-1]))
            _acc(w, gw)
    store.clear()


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> Any:
        ctx.save_for_backward(x)
        # The parameters themselves, not saved tensors: under saved-tensor hooks (the
        # profiler's) an unpacked weight is an alias whose .grad would be lost.
        ctx.weight, ctx.bias = w, b
        out = x @ w.t()
        return out + b if b is not None else out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        (x,) = ctx.saved_tensors
        w, b = ctx.weight, ctx.bias
        gx = g @ w if ctx.needs_input_grad[0] else None
        if not (w.requires_grad or (b is not None and b.requires_grad)):
            return gx, None, None
        if _STORE is not None:
            _STORE.append(("linear", x.detach(), g.detach(), w, b))
            return gx, None, None
        g2 = g.reshape(-1, g.shape[-1])
        gw = g2.t() @ x.reshape(-1, x.shape[-1])
        return gx, gw, (g2.sum(0) if b is not None else None)


class _EmbeddingFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, ids: torch.Tensor, w: torch.Tensor) -> Any:
        ctx.save_for_backward(ids)
        ctx.weight = w
        return w[ids]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        (ids,) = ctx.saved_tensors
        w = ctx.weight
        if _STORE is not None:
            _STORE.append(("embedding", ids, g.detach(), w))
            return None, None
        gw = torch.zeros_like(w)
        gw.index_add_(0, ids.reshape(-1), g.reshape(-1, g.shape[-1]))
        return None, gw


def deferred_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> Any:
    """``F.linear`` whose weight gradient can be deferred (see the module docstring)."""
    return _LinearFn.apply(x, w, b)


def deferred_embedding(ids: torch.Tensor, w: torch.Tensor) -> Any:
    """``F.embedding`` whose weight gradient can be deferred."""
    return _EmbeddingFn.apply(ids, w)


class DLinear(nn.Linear):
    """``nn.Linear`` with a deferrable weight gradient."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return deferred_linear(x, self.weight, self.bias)


def make_deferrable(module: nn.Module) -> nn.Module:
    """Route every ``nn.Linear`` / ``nn.Embedding`` of ``module`` through the deferred ops."""
    for m in module.modules():
        if isinstance(m, DLinear):
            continue
        if isinstance(m, nn.Linear):
            m.forward = (lambda mm: lambda x: deferred_linear(x, mm.weight, mm.bias))(m)  # type: ignore[method-assign]
        elif isinstance(m, nn.Embedding) and m.padding_idx is None and m.max_norm is None:
            m.forward = (lambda mm: lambda ids: deferred_embedding(ids, mm.weight))(m)  # type: ignore[method-assign]
    return module


# --------------------------------------------------------------------------------------------
# Stand-in layers; all map (batch, seq, hidden) -> (batch, seq, hidden) except the ends.
class RMSNorm(nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Embedding(nn.Module):
    def __init__(self, vocab: int, h: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab, h) * 0.5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return deferred_embedding(ids, self.weight)


class Attention(nn.Module):
    """Pre-norm causal multi-head self-attention with a residual."""

    def __init__(self, h: int, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads if h % heads == 0 else 1
        self.norm = RMSNorm(h)
        self.qkv = DLinear(h, 3 * h)
        self.out = DLinear(h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        nh, hd = self.heads, h // self.heads
        q, k, v = self.qkv(self.norm(x)).split(h, dim=-1)
        q, k, v = (t.reshape(b, s, nh, hd).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, s, h)
        return x + self.out(y)


class MLP(nn.Module):
    def __init__(self, h: int, mult: int = 4) -> None:
        super().__init__()
        self.norm = RMSNorm(h)
        self.up = DLinear(h, mult * h)
        self.down = DLinear(mult * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x)), approximate="tanh"))


class TransformerBlock(nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.attn = Attention(h)
        self.mlp = MLP(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.attn(x))


class Mamba(nn.Module):
    """A Mamba-style selective state-space block (input-dependent dt, B, C; sequential scan)."""

    def __init__(self, h: int, state: int = 8, expand: int = 2, conv: int = 4) -> None:
        super().__init__()
        e = expand * h
        self.e, self.n, self.r, self.k = e, state, max(1, h // 16), conv
        self.norm = RMSNorm(h)
        self.in_proj = DLinear(h, 2 * e)
        self.conv_w = nn.Parameter(torch.randn(e, conv) * 0.3)
        self.x_proj = DLinear(e, self.r + 2 * state, bias=False)
        self.dt_proj = DLinear(self.r, e)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, state + 1).float()).repeat(e, 1))
        self.D = nn.Parameter(torch.ones(e))
        self.out_proj = DLinear(e, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        xs, z = self.in_proj(self.norm(x)).split(self.e, dim=-1)
        pad = F.pad(xs.transpose(1, 2), (self.k - 1, 0))  # causal depthwise conv
        xs = F.silu(F.conv1d(pad, self.conv_w.unsqueeze(1), groups=self.e).transpose(1, 2))
        dt_raw, bm, cm = self.x_proj(xs).split([self.r, self.n, self.n], dim=-1)
        dt = F.softplus(self.dt_proj(dt_raw))
        a = -torch.exp(self.A_log.to(x.dtype))
        hstate = x.new_zeros(b, self.e, self.n)
        ys = []
        for t in range(s):
            da = torch.exp(dt[:, t, :, None] * a)
            hstate = da * hstate + (dt[:, t] * xs[:, t])[..., None] * bm[:, t, None, :]
            ys.append((hstate * cm[:, t, None, :]).sum(-1) + self.D * xs[:, t])
        y = torch.stack(ys, dim=1) * F.silu(z)
        return x + self.out_proj(y)


class MoE(nn.Module):
    """Top-k routed mixture of small MLP experts with a residual."""

    def __init__(self, h: int, experts: int = 4, topk: int = 2) -> None:
        super().__init__()
        self.topk = min(topk, experts)
        self.norm = RMSNorm(h)
        self.router = DLinear(h, experts, bias=False)
        self.up = nn.ModuleList(DLinear(h, 2 * h) for _ in range(experts))
        self.down = nn.ModuleList(DLinear(2 * h, h) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        t = self.norm(x).reshape(-1, h)
        gates, idx = self.router(t).softmax(-1).topk(self.topk, dim=-1)
        gates = gates / gates.sum(-1, keepdim=True)
        out = torch.zeros_like(t)
        for e in range(len(self.up)):
            tok, slot = (idx == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            y = self.down[e](F.gelu(self.up[e](t[tok]), approximate="tanh"))
            out = out.index_add(0, tok, y * gates[tok, slot, None])
        return x + out.reshape(b, s, h)


class LMHead(nn.Module):
    def __init__(self, h: int, vocab: int) -> None:
        super().__init__()
        self.norm = RMSNorm(h)
        self.proj = DLinear(h, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


# --------------------------------------------------------------------------------------------
_DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2}


def layer_params(family: str, hidden: int, vocab: int, experts: int = 4) -> int:
    """About how many parameters a stand-in layer of ``family`` has (its largest matrices).

    >>> layer_params("embedding", 16, 64), layer_params("mlp", 16, 64)
    (1024, 2048)
    """
    h = hidden
    per = {
        "embedding": vocab * h,
        "lm_head": vocab * h,
        "moe": experts * 4 * h * h,
        "mlp": 8 * h * h,
        "attention": 4 * h * h,
        "transformer_block": 12 * h * h,
        "mamba": 8 * h * h,
    }
    return per.get(family, 12 * h * h)


def check_memory(
    families: list[str],
    hidden: int,
    seq: int,
    vocab: int,
    microbatch_size: int,
    dtype: str,
    replicas: int = 1,
    what: str = "profile",
) -> None:
    """Refuse, before allocating anything, stand-in layers whose weights, gradients, optimizer
    state and one micro-batch's activations would not fit this machine's memory.

    >>> check_memory(["embedding", "mlp"], 16, 8, 64, 2, "float32")
    """
    import os

    nbytes = _DTYPE_BYTES.get(dtype, 8)
    params = sum(layer_params(f, hidden, vocab) for f in families)
    state = params * nbytes * 4 * replicas  # weights, gradients, two Adam moments
    act = microbatch_size * seq * (16 * hidden + seq) * nbytes * len(families) * replicas
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, AttributeError):
        return
    if state + act > 0.8 * ram:
        raise OctoPipeError(
            f"{what}: the model would need about {(state + act) / 2**30:,.1f} GiB (weights, "
            f"gradients, optimizer state and activations at hidden {hidden:,}, vocab {vocab:,}, "
            f"seq {seq:,}), over 80 % of this machine's {ram / 2**30:,.1f} GiB; fix: a smaller "
            "--hidden, --vocab, --seq or --microbatch-size"
        )


@dataclass
class ModelSettings:
    """Sizes and data of the executed model (CPU-small by default)."""

    hidden: int = 16
    seq: int = 8
    vocab: int = 64
    microbatch_size: int = 2
    dtype: str = "float64"
    seed: int = 0
    factory: str = ""  # "module:function" returning the layers in profile order
    input: str = "auto"  # "tokens" | "hidden"
    loss: str = "auto"  # "cross_entropy" | "mse"
    mamba_state: int = 8
    moe_experts: int = 4
    moe_topk: int = 2

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ModelSettings:
        known = set(ModelSettings.__dataclass_fields__)
        return ModelSettings(**{k: v for k, v in d.items() if k in known})

    def torch_dtype(self) -> torch.dtype:
        return {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}[
            self.dtype
        ]

    def resolved(self, families: list[str]) -> ModelSettings:
        """A copy with ``input``/``loss`` decided from the first/last layer family."""
        s = ModelSettings(**asdict(self))
        if s.input == "auto":
            s.input = "tokens" if families[0] == "embedding" else "hidden"
        if s.loss == "auto":
            s.loss = "cross_entropy" if families[-1] == "lm_head" else "mse"
        return s


def standin_layer(family: str, st: ModelSettings) -> nn.Module:
    """A stand-in layer of ``family`` at the sizes of ``st``."""
    h = st.hidden
    if family == "embedding":
        return Embedding(st.vocab, h)
    if family == "attention":
        return Attention(h)
    if family == "mamba":
        return Mamba(h, st.mamba_state)
    if family == "moe":
        return MoE(h, st.moe_experts, st.moe_topk)
    if family == "mlp":
        return MLP(h)
    if family == "transformer_block":
        return TransformerBlock(h)
    if family == "lm_head":
        return LMHead(h, st.vocab)
    raise OctoPipeError(f"model: unknown layer family {family!r}; fix: use a profile family")


def build_layers(
    families: list[str],
    st: ModelSettings,
    keep: set[int] | None = None,
    *,
    names: list[str] | None = None,
) -> list[nn.Module | None]:
    """The model's layers in profile order; layers outside ``keep`` are None (not built).

    Each stand-in layer is seeded by its index, so any subset matches the full model. A user
    model hook (``st.factory``, see ``executor/hooks.py``) in the per-stage form builds only the
    layers of ``keep``; a whole-model factory is called once (seeded) and the rest dropped.
    ``names`` (the profile's layer type names) are passed to the hook; default: the families.
    """
    if st.factory:
        from octopipe_core.executor.hooks import build_hook_layers

        return build_hook_layers(st.factory, st, families, keep, names)
    dtype = st.torch_dtype()
    out: list[nn.Module | None] = []
    for i, fam in enumerate(families):
        if keep is not None and i not in keep:
            out.append(None)
            continue
        torch.manual_seed(st.seed * 100003 + i)
        out.append(standin_layer(fam, st).to(dtype))
    return out


def load_factory(spec: str, st: ModelSettings, families: list[str]) -> list[nn.Module]:
    """Every layer of a user model hook ``module:function`` (either form; see ``hooks.py``)."""
    layers = build_layers(families, replace(st, factory=spec))
    return [m for m in layers if m is not None]


class _Residual(nn.Module):
    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


def _example_layer(fam: str, hidden: int, vocab: int) -> nn.Module:
    if fam == "embedding":
        return nn.Embedding(vocab, hidden)
    if fam == "lm_head":
        return nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, vocab))
    body = nn.Sequential(
        nn.LayerNorm(hidden),
        nn.Linear(hidden, 2 * hidden),
        nn.GELU(),
        nn.Linear(2 * hidden, hidden),
    )
    return _Residual(body)


def example_layers(
    layers: list[int], families: list[str], hidden: int, vocab: int, seed: int
) -> list[nn.Module]:
    """An example model hook in the per-stage form: builds only ``layers`` (plain torch.nn).

    >>> [type(m).__name__ for m in example_layers([0, 5], ["embedding", "lm_head"], 8, 16, 0)]
    ['Embedding', 'Sequential']
    """
    out: list[nn.Module] = []
    for i, fam in zip(layers, families, strict=True):
        torch.manual_seed(seed * 100003 + i)  # layer i's weights depend on i only
        out.append(_example_layer(fam, hidden, vocab))
    return out


def example_factory(families: list[str], hidden: int, vocab: int) -> list[nn.Module]:
    """An example whole-model factory (the older form): every layer, one per family."""
    return [_example_layer(fam, hidden, vocab) for fam in families]


def make_batch(st: ModelSettings, num_microbatches: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic inputs and targets ``[mb][microbatch_size, seq, ...]``, same on all ranks."""
    g = torch.Generator().manual_seed(st.seed + 12345)
    shape = (num_microbatches, st.microbatch_size, st.seq)
    if st.input == "tokens":
        x = torch.randint(0, st.vocab, shape, generator=g)
    else:
        x = torch.randn(*shape, st.hidden, generator=g).to(st.torch_dtype())
    y = torch.randint(0, st.vocab, shape, generator=g)
    return x, y


def loss_fn(out: torch.Tensor, target: torch.Tensor, st: ModelSettings, m: int) -> torch.Tensor:
    """Loss of one micro-batch, scaled by ``1/m`` so the step's loss is the mean."""
    if st.loss == "cross_entropy":
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1)) / m
    return out.pow(2).mean() / m


def param_names(layers: list[nn.Module | None]) -> dict[str, nn.Parameter]:
    """Parameters keyed ``"{layer index}.{name}"`` (global layer index)."""
    return {
        f"{i}.{n}": p
        for i, layer in enumerate(layers)
        if layer is not None
        for n, p in layer.named_parameters()
    }
