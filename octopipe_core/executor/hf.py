"""HuggingFace-style decoder layers as pipeline layers, and two ready model hooks.

A ``transformers`` decoder layer takes more than the hidden states (position embeddings,
position ids, an attention mask) and may return a tuple. The pipeline passes one tensor per
stage boundary, so ``HFDecoderLayer`` rebuilds the rest on each stage from the hidden states'
shape: positions ``0..seq-1``, the rotary ``(cos, sin)`` from the model's own rotary module
(cached per sequence length, device and dtype), and the causal mask (an additive 4-D mask for
``eager`` attention; for ``sdpa`` / flash attention none, so the kernel applies causality). It
passes the first output on. The model's ends are layers too: ``HFEmbedding`` (token ids ->
hidden) first, ``HFHead`` (final norm + LM head -> logits) last. Packed causal sequences only:
no padding mask crosses the pipeline, and input and output embeddings are not tied.

Ready hooks (per-stage form, see ``hooks.py``), built from configs, no weights downloaded:

* ``llama_tiny``: ``LlamaConfig`` decoder layers (rotary, grouped-query attention, SwiGLU);
* ``hybrid_tiny``: ``BambaConfig`` layers: a profile layer of family ``mamba`` is a Mamba-2
  mixer + MLP, any other middle layer an attention + MLP layer. Its CPU path is pure torch.

Both need the optional extra ``pip install "octopipe[hf]"`` (``transformers``); e.g.
``octopipe export plan.json --model octopipe_core.executor.hf:llama_tiny --hidden 64``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from octopipe_core.errors import OctoPipeError
from octopipe_core.executor.hooks import seed_layer

ENDS = ("embedding", "lm_head")


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as e:
        raise OctoPipeError(
            "model: the HuggingFace adapter needs transformers; fix: pip install 'octopipe[hf]'"
        ) from e
    logging.getLogger("transformers").setLevel(logging.ERROR)  # kernel fallback notices
    return transformers


def causal_mask(seq: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive causal mask ``(1, 1, seq, seq)``: 0 on and below the diagonal, dtype min above.

    >>> causal_mask(3, torch.float32, torch.device("cpu"))[0, 0, 0].tolist()[1] < -1e38
    True
    """
    m = torch.full((seq, seq), torch.finfo(dtype).min, dtype=dtype, device=device).triu(1)
    return m[None, None]


class HFEmbedding(nn.Module):
    """First layer: token ids ``(batch, seq)`` -> hidden states."""

    def __init__(self, embed_tokens: nn.Embedding) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids)  # type: ignore[no-any-return]


class HFHead(nn.Module):
    """Last layer: final norm + LM head -> logits."""

    def __init__(self, norm: nn.Module, lm_head: nn.Linear) -> None:
        super().__init__()
        self.norm = norm
        self.lm_head = lm_head

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h))  # type: ignore[no-any-return]


class HFDecoderLayer(nn.Module):
    """One HuggingFace decoder layer as a hidden -> hidden pipeline layer (see the module doc).

    ``rotary`` is the model's rotary-embedding module (None: the layer needs no positions);
    ``causal`` whether the layer attends (then a mask is rebuilt for eager attention).
    """

    def __init__(
        self, layer: nn.Module, rotary: nn.Module | None, causal: bool, attn_implementation: str
    ) -> None:
        super().__init__()
        self.layer = layer
        self.rotary = rotary
        self.causal = causal
        self.eager_mask = attn_implementation == "eager"
        self._cache: dict[tuple[int, torch.dtype, torch.device], Any] = {}

    def _extras(self, h: torch.Tensor) -> tuple[torch.Tensor, Any, torch.Tensor | None]:
        seq = h.shape[1]
        key = (seq, h.dtype, h.device)
        if key not in self._cache:
            pos = torch.arange(seq, device=h.device)[None]
            with torch.no_grad():
                pe = self.rotary(h, pos) if self.rotary is not None else None
            mask = causal_mask(seq, h.dtype, h.device) if self.causal and self.eager_mask else None
            self._cache = {key: (pos, pe, mask)}
        return self._cache[key]  # type: ignore[no-any-return]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        pos, pe, mask = self._extras(h)
        out = self.layer(
            h, attention_mask=mask, position_ids=pos, position_embeddings=pe, use_cache=False
        )
        return out[0] if isinstance(out, tuple) else out  # type: ignore[no-any-return]


@dataclass
class HFParts:
    """How to build one HuggingFace model's pieces (what ``build_hf_layers`` needs)."""

    config: Any
    decoder: Callable[[Any, int], nn.Module]  # (config, decoder layer index) -> layer
    rotary: Callable[[Any], nn.Module] | None  # config -> rotary module
    norm: Callable[[Any], nn.Module]  # config -> final norm
    attends: Callable[[int], bool]  # decoder layer index -> whether it attends


def _init_weights(module: nn.Module, std: float) -> None:
    """HuggingFace's default initialisation of linear and embedding weights."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=std)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)


def decoder_index(model_families: list[str]) -> list[int]:
    """Each profile layer's decoder-layer index (-1 for the embedding and head ends).

    >>> decoder_index(["embedding", "attention", "mamba", "lm_head"])
    [-1, 0, 1, -1]
    """
    out, k = [], 0
    for f in model_families:
        out.append(-1 if f in ENDS else k)
        k += f not in ENDS
    return out


def build_hf_layers(
    parts: HFParts, layers: list[int], model_families: list[str], seed: int
) -> list[nn.Module]:
    """The pipeline layers ``layers`` of a HuggingFace model; each seeded by its index."""
    cfg = parts.config
    dec = decoder_index(model_families)
    impl = str(getattr(cfg, "_attn_implementation", None) or "sdpa")
    out: list[nn.Module] = []
    for i in layers:
        fam = model_families[i]
        seed_layer(seed, i)
        m: nn.Module
        if fam == "embedding":
            m = HFEmbedding(nn.Embedding(cfg.vocab_size, cfg.hidden_size))
        elif fam == "lm_head":
            m = HFHead(parts.norm(cfg), nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False))
        else:
            attends = parts.attends(dec[i])
            rotary = parts.rotary(cfg) if attends and parts.rotary is not None else None
            m = HFDecoderLayer(parts.decoder(cfg, dec[i]), rotary, attends, impl)
        _init_weights(m, float(getattr(cfg, "initializer_range", 0.02)))
        out.append(m)
    return out


def _check_sizes(hidden: int, heads: int, kv_heads: int, what: str) -> None:
    if hidden % heads or (hidden // heads) % 2 or heads % kv_heads:
        raise OctoPipeError(
            f"model {what}: hidden {hidden} with {heads} heads ({kv_heads} kv): need hidden "
            "divisible by heads, an even head size and heads divisible by kv heads; fix: e.g. "
            "--hidden 64"
        )


def llama_tiny_config(
    hidden: int,
    vocab: int,
    seq: int,
    decoder_layers: int,
    heads: int = 4,
    kv_heads: int = 2,
    attn_implementation: str = "sdpa",
) -> Any:
    """A small ``LlamaConfig`` (SwiGLU width ~8/3 hidden, untied embeddings, no padding id)."""
    _check_sizes(hidden, heads, kv_heads, "llama_tiny")
    cfg = _transformers().LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=max(8, (8 * hidden // 3 + 7) // 8 * 8),
        num_hidden_layers=max(1, decoder_layers),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max(seq, 128),
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    cfg._attn_implementation = attn_implementation
    return cfg


def llama_parts(cfg: Any) -> HFParts:
    from transformers.models.llama import modeling_llama as ml

    return HFParts(
        cfg,
        lambda c, i: ml.LlamaDecoderLayer(c, i),
        ml.LlamaRotaryEmbedding,
        lambda c: ml.LlamaRMSNorm(c.hidden_size, eps=c.rms_norm_eps),
        lambda i: True,
    )


def llama_tiny(
    layers: list[int],
    model_families: list[str],
    hidden: int,
    vocab: int,
    seq: int,
    seed: int,
    heads: int = 4,
    kv_heads: int = 2,
    attn_implementation: str = "sdpa",
) -> list[nn.Module]:
    """Model hook: a tiny Llama (every layer between the ends is a Llama decoder layer).

    E.g. ``llama_tiny([0, 1], ["embedding", "attention", "lm_head"], 16, 32, 8, 0)`` builds the
    embedding and the first decoder layer only.
    """
    n_dec = sum(f not in ENDS for f in model_families)
    cfg = llama_tiny_config(hidden, vocab, seq, n_dec, heads, kv_heads, attn_implementation)
    return build_hf_layers(llama_parts(cfg), layers, model_families, seed)


def hybrid_tiny_config(
    hidden: int,
    vocab: int,
    seq: int,
    decoder_families: list[str],
    mamba_state: int = 8,
    heads: int = 4,
    kv_heads: int = 2,
    mamba_head_dim: int = 8,
    attn_implementation: str = "sdpa",
) -> Any:
    """A small ``BambaConfig``: decoder layer ``k`` is Mamba-2 where ``decoder_families[k]`` is
    ``mamba``, attention otherwise."""
    _check_sizes(hidden, heads, kv_heads, "hybrid_tiny")
    inner = 2 * hidden
    if inner % mamba_head_dim:
        raise OctoPipeError(
            f"model hybrid_tiny: 2 x hidden {hidden} is not a multiple of the Mamba head size "
            f"{mamba_head_dim}; fix: use a hidden size divisible by {mamba_head_dim // 2}"
        )
    cfg = _transformers().BambaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=max(1, len(decoder_families)),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max(seq, 128),
        attn_layer_indices=[k for k, f in enumerate(decoder_families) if f != "mamba"],
        mamba_n_heads=inner // mamba_head_dim,
        mamba_d_head=mamba_head_dim,
        mamba_d_state=mamba_state,
        mamba_n_groups=1,
        mamba_chunk_size=max(1, min(64, seq)),
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    cfg._attn_implementation = attn_implementation
    return cfg


def bamba_parts(cfg: Any) -> HFParts:
    from transformers.models.bamba import modeling_bamba as mb

    types = cfg.layers_block_type
    return HFParts(
        cfg,
        lambda c, i: mb.BambaDecoderLayer(c, layer_idx=i, layer_type=types[i]),
        mb.BambaRotaryEmbedding,
        lambda c: mb.BambaRMSNorm(c.hidden_size, eps=c.rms_norm_eps),
        lambda i: types[i] == "full_attention",
    )


def hybrid_tiny(
    layers: list[int],
    model_families: list[str],
    hidden: int,
    vocab: int,
    seq: int,
    seed: int,
    mamba_state: int = 8,
    heads: int = 4,
    kv_heads: int = 2,
    attn_implementation: str = "sdpa",
) -> list[nn.Module]:
    """Model hook: a tiny Bamba hybrid (Mamba-2 where the profile says ``mamba``)."""
    dec = [f for f in model_families if f not in ENDS]
    cfg = hybrid_tiny_config(
        hidden, vocab, seq, dec, mamba_state, heads, kv_heads, 8, attn_implementation
    )
    return build_hf_layers(bamba_parts(cfg), layers, model_families, seed)
