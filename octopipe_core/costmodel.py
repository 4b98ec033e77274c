"""Analytic cost model: ``octopipe.profile/v1`` layer profiles from public architecture numbers.

Nothing here is measured. Every layer type is a sum of parts, and each part has:

* ``linear`` FLOPs: GEMMs against weights (Megatron-LM's formulas). F runs them once, B once
  more (the input-gradient GEMMs have the same FLOPs) and W once more (weight-gradient GEMMs).
* ``core`` FLOPs: weightless work such as causal flash attention or the Mamba scan. F runs it
  once; B does ``core_bwd`` times as much (2x, or 2.5x for flash attention, which recomputes
  ``QK^T``); W does none of it. The small conv/``A``/``D`` weights of a Mamba mixer get their
  gradients from the scan backward kernel itself, so they count in B.
* memory-bound bytes per F/B/W pass: the embedding gathers rows in F, has no B (token ids need
  no gradient) and scatter-adds in W; the LM head's fp32 softmax/loss runs in F and in B.

Time = linear / (peak x efficiency) + core / (peak x core efficiency) + bytes / (HBM x eff).
Static memory is ``params x bytes_per_param_static``; activations are bf16 tensors that F keeps
for B, generalised from Korthikanti et al. (Megatron) so that a GPT layer with ``ffn = 4h``
gives the familiar ``34·s·b·h`` bytes (plus ``5·a·s²·b`` without flash attention).
``w_stash`` is what W still needs after B: each weight GEMM's input and output gradient, which
gives the zero-bubble paper's ``32·s·b·h`` for that layer, capped at the activation.

>>> p = derive_profile(PRESETS["nemotron-h-8b"])
>>> len(p["layers"]), p["layer_types"]["mamba2"]["output_mib"]
(54, 64.0)
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from octopipe_core.errors import OctoPipeError
from octopipe_core.jsonio import loads_checked
from octopipe_core.profile import FORMAT, Profile, profile_to_csv

MIB = 2**20
# Layer type name -> profile family. Composite (Jamba) types hold a mixer plus an FFN.
LAYER_FAMILIES: dict[str, str] = {
    "embedding": "embedding", "attention": "attention", "mlp": "mlp", "moe": "moe",
    "mamba1": "mamba", "mamba2": "mamba", "transformer_block": "transformer_block",
    "attn_mlp": "transformer_block", "mamba_mlp": "mamba", "mamba_moe": "moe", "lm_head": "lm_head",
}  # fmt: skip
DEFAULT_EFFICIENCY: dict[str, float] = {
    "mlp": 0.55,  # dense bf16 GEMMs of MLPs (typical well-tuned Megatron MFU on Hopper)
    "attention": 0.55,  # QKV and output projections: the same dense GEMMs
    "attention_core": 0.40,  # causal flash attention (FA-2/3 reach ~40-60% of peak)
    "mamba": 0.35,  # whole Mamba mixer: scan, conv, gating kernels drag the GEMMs down
    "moe": 0.45,  # grouped expert GEMMs with routing overhead and load imbalance
    "lm_head": 0.55,  # one large vocab GEMM
    "memory_bound": 0.60,  # fraction of HBM bandwidth for gathers, scatters and softmax
}


@dataclass(frozen=True)
class GPUSpec:
    """An H800-class GPU.

    * ``peak_tflops`` 989: dense BF16 tensor-core peak of the H800/H100 SXM (no sparsity).
    * ``hbm_gbps`` 3350: HBM3 bandwidth in GB/s, used for memory-bound work only.
    * ``memory_gib`` 80: nominal device memory; leave headroom for the allocator and NCCL.
    * ``p2p_gbps`` 50: stage-to-stage bandwidth in GB/s, one 400 Gb/s NIC per GPU (inter-node).
    * ``p2p_latency_us`` 10: per-message latency of that send/recv.
    * ``efficiency``: achieved fraction of peak per kernel class, see ``DEFAULT_EFFICIENCY``.

    >>> round(GPUSpec().flop_ms(989e12 * 0.55, "mlp"), 3)
    1000.0
    """

    name: str = "H800"
    peak_tflops: float = 989.0
    hbm_gbps: float = 3350.0
    memory_gib: float = 80
    p2p_gbps: float = 50
    p2p_latency_us: float = 10
    efficiency: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_EFFICIENCY))

    def flop_ms(self, flops: float, kind: str) -> float:
        """Milliseconds for ``flops`` at the efficiency of kernel class ``kind``."""
        return flops / (self.peak_tflops * 1e12 * self.efficiency[kind]) * 1e3

    def mem_ms(self, nbytes: float) -> float:
        """Milliseconds to move ``nbytes`` through HBM at the memory-bound efficiency."""
        return nbytes / (self.hbm_gbps * 1e9 * self.efficiency["memory_bound"]) * 1e3


@dataclass(frozen=True)
class ModelConfig:
    """Architecture and training-shape numbers; ``layers`` lists one type name per layer.

    ``head_dim`` 0 means ``hidden // num_heads``; ``mamba_heads`` 0 means
    ``mamba_expand * hidden // mamba_head_dim`` (Mamba-2); ``mamba_dt_rank`` 0 means
    ``ceil(hidden / 16)`` (Mamba-1). ``mamba_version`` picks the mixer of the composite types
    ``mamba_mlp``/``mamba_moe``. ``bytes_per_param_static`` 16 = bf16 weights (2) + bf16 grads
    (2) + fp32 master weights (4) + fp32 Adam moments (8); fp32 grads make it 18 (the usual
    16-18 B/param convention; no distributed-optimizer sharding). ``tensor_parallel`` divides
    params, FLOPs, activations and the stage-to-stage output (sequence parallel); its
    communication is ignored.
    ``expert_parallel`` further divides the expert weights of MoE layers (all-to-all ignored).
    ``activation_formula`` is ``"flash"`` (no ``s²`` term) or ``"full"`` (stored softmax).

    >>> ModelConfig("x", ["mlp"], 64, 256, 4, 4, 100, 16).tokens_per_microbatch
    16
    """

    name: str
    layers: tuple[str, ...]
    hidden: int
    ffn_hidden: int
    num_heads: int
    num_kv_heads: int
    vocab: int
    seq_len: int
    micro_batch_size: int = 1
    head_dim: int = 0
    swiglu: bool = False
    mamba_version: int = 2
    mamba_state: int = 128
    mamba_heads: int = 0
    mamba_head_dim: int = 64
    mamba_groups: int = 8
    mamba_expand: int = 2
    mamba_d_conv: int = 4
    mamba_dt_rank: int = 0
    num_experts: int = 0
    moe_top_k: int = 0
    expert_parallel: int = 1
    tensor_parallel: int = 1
    bytes_per_param_static: float = 16.0
    activation_formula: str = "flash"

    def __post_init__(self) -> None:
        if isinstance(self.layers, list):
            object.__setattr__(self, "layers", tuple(self.layers))
        kinds: dict[str, type | tuple[type, ...]] = {
            "str": str, "int": int, "bool": bool, "float": (int, float),
        }  # fmt: skip
        for f in fields(self):
            v: Any = getattr(self, f.name)
            typ = "list" if f.name == "layers" else str(f.type)
            if not isinstance(v, kinds.get(typ, tuple)) or (isinstance(v, bool) and typ != "bool"):
                raise ValueError(f"field '{f.name}': got {v!r}; fix: write a {typ} value")
            num: Any = v  # checked to be a number of the field's type above
            if f.type in ("int", "float") and not (num > 0 or (num == 0 and f.default == 0)):
                need = "0 (auto) or a positive number" if f.default == 0 else "a positive number"
                raise ValueError(f"field '{f.name}': got {v}; fix: use {need}")
        bad = [t for t in self.layers if not isinstance(t, str) or t not in LAYER_FAMILIES]
        if not self.layers or bad:
            raise ValueError(f"field 'layers': unknown or no layer types {bad}; fix: use "
                             f"{', '.join(LAYER_FAMILIES)}")  # fmt: skip
        if self.activation_formula not in ("flash", "full"):
            raise ValueError('field \'activation_formula\': fix: use "flash" or "full"')
        if self.mamba_version not in (1, 2):
            raise ValueError("field 'mamba_version': fix: use 1 or 2")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("field 'num_kv_heads': fix: use a divisor of num_heads")
        if any("moe" in t for t in self.layers) and not 1 <= self.moe_top_k <= self.num_experts:
            raise ValueError("field 'moe_top_k': fix: MoE layers need 1 <= moe_top_k <= "
                             "num_experts")  # fmt: skip

    @property
    def tokens_per_microbatch(self) -> int:
        return self.seq_len * self.micro_batch_size


@dataclass(frozen=True)
class _Part:
    """Unsharded costs of one sublayer for one micro-batch (FLOPs, bytes, parameters)."""

    kind: str
    linear: float = 0.0
    core: float = 0.0
    core_kind: str = ""
    core_bwd: float = 2.0
    mem: tuple[float, float, float] = (0.0, 0.0, 0.0)
    params: float = 0.0
    expert_params: float = 0.0
    act: float = 0.0
    stash: float = 0.0


def _attention(c: ModelConfig) -> _Part:
    h, s, t = c.hidden, c.seq_len, c.tokens_per_microbatch
    hd = c.head_dim or h // c.num_heads
    q, kv = c.num_heads * hd, c.num_kv_heads * hd
    full = c.activation_formula == "full"
    # per token: norm in, QKV in, Q, K, V, core out (bf16) + dropout mask (1 B/elem)
    act = 2 * h + 2 * h + 2 * q + 4 * kv + 2 * q + h + (5 * c.num_heads * s if full else 0)
    return _Part(
        "attention", linear=4 * t * h * (q + kv), core=2 * c.micro_batch_size * s * s * q,
        core_kind="attention_core", core_bwd=2.0 if full else 2.5, params=h + 2 * h * (q + kv),
        act=t * act, stash=t * (4 * h + 4 * q + 4 * kv),
    )  # fmt: skip


def _mlp(c: ModelConfig, norm: bool = True) -> _Part:
    h, f, t = c.hidden, c.ffn_hidden, c.tokens_per_microbatch
    up = 2 * f if c.swiglu else f
    params = h * up + f * h
    # per token: fc1 in, activation in, activation out, dropout mask (+ norm in)
    act = 2 * h + 2 * up + 2 * f + h + (2 * h if norm else 0)
    return _Part(
        "mlp", linear=2 * t * params, params=params + (h if norm else 0), act=t * act,
        stash=t * (4 * h + 2 * up + 2 * f),
    )  # fmt: skip


def _moe(c: ModelConfig) -> _Part:
    h, t, e, k = c.hidden, c.tokens_per_microbatch, c.num_experts, c.moe_top_k
    x = _mlp(c, norm=False)
    return _Part(
        "moe", linear=k * x.linear + 2 * t * h * e, params=h + h * e,
        expert_params=e * x.params, act=t * (4 * h + 4 * e) + k * x.act,
        stash=t * (2 * h + 4 * e) + k * x.stash,
    )  # fmt: skip


def _mamba2(c: ModelConfig) -> _Part:
    h, t, n = c.hidden, c.tokens_per_microbatch, c.mamba_state
    nh = c.mamba_heads or c.mamba_expand * h // c.mamba_head_dim
    d_in, gn = nh * c.mamba_head_dim, c.mamba_groups * c.mamba_state
    in_dim, conv = 2 * d_in + 2 * gn + nh, d_in + 2 * gn
    params = h + h * in_dim + conv * (c.mamba_d_conv + 1) + 3 * nh + d_in + d_in * h
    # per token: norm in, in_proj in, z|xBC|dt, conv out, scan out y, gated-norm out, fp32 dt
    act = 4 * h + 2 * in_dim + 2 * conv + 4 * d_in + 8 * nh
    return _Part(
        "mamba", linear=2 * t * h * (in_dim + d_in), core=7 * t * d_in * n, params=params,
        act=t * act, stash=t * (4 * h + 2 * in_dim + 2 * d_in),
    )  # fmt: skip


def _mamba1(c: ModelConfig) -> _Part:
    h, t, n, k = c.hidden, c.tokens_per_microbatch, c.mamba_state, c.mamba_d_conv
    d_in, r = c.mamba_expand * h, c.mamba_dt_rank or math.ceil(h / 16)
    # in_proj, conv(+bias), x_proj, dt_proj(+bias), A_log, D, out_proj, dt/B/C norms, pre-norm
    gemm = h * 2 * d_in + d_in * (r + 2 * n) + r * d_in + d_in * h
    params = gemm + d_in * (k + 1) + d_in + d_in * n + d_in + (r + 2 * n) + h
    # per token: norm in, in_proj in, x|z, conv out, dt|B|C, delta, gated scan out (out_proj in)
    act = 4 * h + 4 * d_in + 2 * d_in + 2 * (r + 2 * n) + 2 * d_in + 2 * d_in
    stash = 4 * h + 10 * d_in + 4 * r + 4 * n
    # core: depthwise conv + ~9 FLOPs per (channel, state) per token for the selective scan
    return _Part(
        "mamba", linear=2 * t * gemm, core=t * d_in * (2 * k + 9 * n), params=params,
        act=t * act, stash=t * stash,
    )  # fmt: skip


def _embedding(c: ModelConfig) -> _Part:
    h, t = c.hidden, c.tokens_per_microbatch
    # F gathers rows (read + write bf16); no input gradient; W scatter-adds into fp32 grads
    return _Part(
        "memory_bound", mem=(4 * t * h, 0.0, 10 * t * h), params=c.vocab * h, act=8 * t,
        stash=8 * t,
    )  # fmt: skip


def _lm_head(c: ModelConfig) -> _Part:
    h, t, v = c.hidden, c.tokens_per_microbatch, c.vocab
    # fp32 logits kept for the loss; softmax/cross-entropy read+write them in F and in B
    return _Part(
        "lm_head", linear=2 * t * h * v, mem=(8 * t * v, 8 * t * v, 0.0), params=h + v * h,
        act=t * (4 * h + 4 * v), stash=t * (2 * h + 2 * v),
    )  # fmt: skip


def _parts(c: ModelConfig, layer_type: str) -> list[_Part]:
    mixer = _mamba1(c) if c.mamba_version == 1 else _mamba2(c)
    table = {
        "embedding": lambda: [_embedding(c)], "attention": lambda: [_attention(c)],
        "mlp": lambda: [_mlp(c)], "moe": lambda: [_moe(c)], "mamba1": lambda: [_mamba1(c)],
        "mamba2": lambda: [_mamba2(c)], "transformer_block": lambda: [_attention(c), _mlp(c)],
        "attn_mlp": lambda: [_attention(c), _mlp(c)], "mamba_mlp": lambda: [mixer, _mlp(c)],
        "mamba_moe": lambda: [mixer, _moe(c)], "lm_head": lambda: [_lm_head(c)],
    }  # fmt: skip
    return table[layer_type]()


def layer_params(cfg: ModelConfig, layer_type: str) -> float:
    """Parameters of one layer of ``layer_type``, unsharded (all experts, no TP).

    >>> round(layer_params(PRESETS["nemotron-h-8b"], "attention") / 1e6, 1)
    41.9
    """
    return sum(p.params + p.expert_params for p in _parts(cfg, layer_type))


def model_params(cfg: ModelConfig) -> float:
    """Total parameters of the model, unsharded.

    >>> round(model_params(PRESETS["nemotron-h-8b"]) / 1e9, 2)
    8.1
    """
    return sum(layer_params(cfg, t) for t in cfg.layers)


def forward_flops(cfg: ModelConfig, layer_type: str) -> float:
    """Forward FLOPs of one layer for one micro-batch, unsharded.

    >>> round(forward_flops(PRESETS["nemotron-h-8b"], "mlp") / 1e12, 2)
    2.89
    """
    return sum(p.linear + p.core for p in _parts(cfg, layer_type))


def _layer_costs(c: ModelConfig, layer_type: str, gpu: GPUSpec) -> dict[str, Any]:
    tp, f, b, w, act, stash, weights = c.tensor_parallel, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    for p in _parts(c, layer_type):
        lin = gpu.flop_ms(p.linear, p.kind) if p.linear else 0.0
        core = gpu.flop_ms(p.core, p.core_kind or p.kind) if p.core else 0.0
        f += lin + core + gpu.mem_ms(p.mem[0])
        b += lin + p.core_bwd * core + gpu.mem_ms(p.mem[1])
        w += lin + gpu.mem_ms(p.mem[2])
        act, stash = act + p.act, stash + min(p.stash, p.act)
        weights += p.params + p.expert_params / c.expert_parallel
    out = 0.0 if layer_type == "lm_head" else c.tokens_per_microbatch * c.hidden * 2 / tp
    vals = {
        "forward_ms": f / tp, "backward_input_ms": b / tp, "backward_weight_ms": w / tp,
        "activation_mib": act / tp / MIB,
        "weight_mib": weights / tp * c.bytes_per_param_static / MIB,
        "output_mib": out / MIB, "w_stash_mib": stash / tp / MIB,
    }  # fmt: skip
    return {"family": LAYER_FAMILIES[layer_type], **{k: round(v, 4) for k, v in vals.items()}}


def _summary(c: ModelConfig, gpu: GPUSpec) -> str:
    parts = [f"h={c.hidden}, ffn={c.ffn_hidden} ({'SwiGLU' if c.swiglu else 'non-gated'}), "
             f"{c.num_heads} heads/{c.num_kv_heads} kv"]  # fmt: skip
    nh = c.mamba_heads or c.mamba_expand * c.hidden // c.mamba_head_dim
    versions = {int(t[-1]) if t[-1] in "12" else c.mamba_version for t in c.layers if "mamba" in t}
    if 2 in versions:
        parts.append(
            f"Mamba-2 {nh}x{c.mamba_head_dim} state {c.mamba_state} groups {c.mamba_groups}"
        )
    if 1 in versions:
        parts.append(f"Mamba-1 expand {c.mamba_expand} state {c.mamba_state}")
    if c.num_experts:
        parts.append(f"MoE {c.num_experts} experts top-{c.moe_top_k}, EP={c.expert_parallel} "
                     "divides expert weights (all-to-all ignored)")  # fmt: skip
    parts.append(f"vocab {c.vocab}, seq {c.seq_len}, mbs {c.micro_batch_size}, "
                 f"TP={c.tensor_parallel} divides params/FLOPs/activations (TP comm ignored), "
                 f"{c.bytes_per_param_static:g} B/param static, {c.activation_formula} "
                 f"activations; times = FLOPs / ({gpu.peak_tflops:g} TFLOPS x efficiency), "
                 "not measured")  # fmt: skip
    return "derived by octopipe_core.costmodel from " + "; ".join(parts)


def derive_profile(cfg: ModelConfig, gpu: GPUSpec | None = None) -> dict[str, Any]:
    """Build an ``octopipe.profile/v1`` dict (JSON-serialisable) for ``cfg`` on ``gpu``.

    >>> p = derive_profile(PRESETS["llama-3-8b"])
    >>> p["format"], p["tokens_per_microbatch"], p["layer_types"]["lm_head"]["output_mib"]
    ('octopipe.profile/v1', 8192, 0.0)
    """
    gpu = gpu or GPUSpec()
    return {
        "format": FORMAT,
        "name": cfg.name,
        "tokens_per_microbatch": cfg.tokens_per_microbatch,
        "device": {
            **{k: getattr(gpu, k) for k in ("name", "memory_gib", "p2p_gbps", "p2p_latency_us")},
            **({"gpus": cfg.tensor_parallel} if cfg.tensor_parallel > 1 else {}),
        },
        "layer_types": {t: _layer_costs(cfg, t, gpu) for t in dict.fromkeys(cfg.layers)},
        "layers": list(cfg.layers),
        "source": _summary(cfg, gpu),
    }


def _nemotron(name: str, repeats: int, **kw: Any) -> ModelConfig:
    pattern = "M-M-M-M" + "*-M-M-M-M-M" * repeats + "-"
    sym = {"M": "mamba2", "*": "attention", "-": "mlp"}
    layers = ("embedding", *(sym[ch] for ch in pattern), "lm_head")
    return ModelConfig(name, layers, num_kv_heads=8, vocab=131072, seq_len=8192, **kw)


# Jamba runs at seq 4096: at 8192 one micro-batch keeps ~64 GiB of activations on top of ~180
# GiB of EP=8-sharded weights, so no 1F1B split over 80 GiB devices would fit without recompute.
_JAMBA_BLOCK = ("mamba_mlp", "mamba_moe", "mamba_mlp", "mamba_moe",
                "attn_mlp", "mamba_moe", "mamba_mlp", "mamba_moe")  # fmt: skip
PRESETS: dict[str, ModelConfig] = {
    "llama-3-8b": ModelConfig(
        "llama-3-8b", ("embedding", *["transformer_block"] * 32, "lm_head"), hidden=4096,
        ffn_hidden=14336, num_heads=32, num_kv_heads=8, vocab=128256, seq_len=8192, swiglu=True,
    ),
    "nemotron-h-8b": _nemotron(
        "nemotron-h-8b", 4, hidden=4096, ffn_hidden=21504, num_heads=32, mamba_heads=128,
    ),
    "nemotron-h-56b": _nemotron(
        "nemotron-h-56b", 10, hidden=8192, ffn_hidden=32768, num_heads=64, mamba_heads=256,
        mamba_state=256, tensor_parallel=8,
    ),
    "jamba-v0.1": ModelConfig(
        "jamba-v0.1", ("embedding", *_JAMBA_BLOCK * 4, "lm_head"), hidden=4096, ffn_hidden=14336,
        num_heads=32, num_kv_heads=8, vocab=65536, seq_len=4096, swiglu=True, mamba_version=1,
        mamba_state=16, mamba_dt_rank=256, num_experts=16, moe_top_k=2, expert_parallel=8,
    ),
    "tiny-hybrid": ModelConfig(
        "tiny-hybrid", ("embedding", "mamba2", "mlp", "attention", "mlp", "mamba2", "moe",
                        "mamba2", "mlp", "lm_head"), hidden=2048, ffn_hidden=8192, num_heads=16,
        num_kv_heads=4, vocab=32768, seq_len=4096, mamba_heads=64, num_experts=8, moe_top_k=2,
    ),
}  # fmt: skip
CSV_SAMPLES = ("tiny-hybrid",)  # presets bundled in CSV form rather than JSON


def load_config(path: str | Path) -> ModelConfig:
    """Read a ModelConfig from a JSON file; raise SystemExit with a one-line message if bad."""
    src = str(path)
    try:
        data = loads_checked(Path(path).read_bytes(), src)
    except OSError as e:
        raise SystemExit(f"{src}: cannot read ({e}); fix: pass a JSON object file") from None
    except OctoPipeError as e:
        raise SystemExit(str(e)) from None
    if not isinstance(data, dict):
        raise SystemExit(f'{src}: expected a JSON object; fix: write {{"name": ..., ...}}')
    known = [f.name for f in fields(ModelConfig)]
    unknown = [k for k in data if k not in known]
    if unknown:
        raise SystemExit(f"{src}: field '{unknown[0]}': unknown; fix: remove it or use one of "
                         f"{', '.join(known)}")  # fmt: skip
    missing = [f for f in fields(ModelConfig) if f.name not in data and f.default is MISSING]
    if missing:
        f = missing[0]
        raise SystemExit(f"{src}: field '{f.name}': missing; fix: add \"{f.name}\": <{f.type}>")
    try:
        return ModelConfig(**data)
    except ValueError as e:
        raise SystemExit(f"{src}: {e}") from None


def _dump(profile: dict[str, Any], out: str | None) -> None:
    if out and out.endswith(".csv"):  # the profile module's writer: every device field kept
        text = profile_to_csv(Profile.from_dict(profile, out))
    else:
        text = json.dumps(profile, indent=2) + "\n"
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text, encoding="utf-8")
    else:
        print(text, end="")


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m octopipe_core.costmodel --preset NAME | --all | --config FILE``.

    ``--out FILE`` writes one profile (CSV if it ends in ``.csv``, else JSON; default stdout);
    ``--all --out-dir DIR`` writes every preset (``tiny-hybrid`` as CSV).
    """
    ap = argparse.ArgumentParser(
        "python -m octopipe_core.costmodel", description=__doc__.split("\n")[0]
    )
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--preset", choices=sorted(PRESETS))
    g.add_argument("--config", help="JSON file of ModelConfig fields")
    g.add_argument("--all", action="store_true", help="write every preset into --out-dir")
    ap.add_argument("--out", help="output file (default: stdout)")
    ap.add_argument("--out-dir", default="sample_profiles")
    args = ap.parse_args(argv)
    if args.all:
        for name, cfg in PRESETS.items():
            ext = ".csv" if name in CSV_SAMPLES else ".json"
            _dump(derive_profile(cfg), str(Path(args.out_dir) / f"{name}{ext}"))
        return 0
    cfg = PRESETS[args.preset] if args.preset else load_config(args.config)
    _dump(derive_profile(cfg), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
