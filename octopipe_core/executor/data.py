"""Training data of an exported job: one batch per (step, data-parallel replica).

A batch is ``(x, y)`` with ``x`` of shape ``[microbatches, microbatch_size, seq]`` (token ids,
or ``[..., hidden]`` floats for a model without an embedding) and ``y`` the targets, shape
``[microbatches, microbatch_size, seq]``. Sources (``DataSettings.kind``):

* ``"synthetic"``: a learnable next-token task made on the fly (each sequence follows
  ``t -> (7 t + 3) mod vocab`` from a random start), different for every step and replica;
* ``"fixed"``: the gradient check's batch (``models.make_batch``) at every step; replica ``r``
  uses seed ``seed + r``;
* ``"tokens"``: a flat binary file of token ids (``uint16`` as nanoGPT's ``train.bin``, or
  ``uint32``), split into one contiguous shard per replica; each sample is ``seq + 1``
  consecutive tokens at a random offset of the replica's shard (seeded by step and replica);
* ``"hook"``: a user function ``module:function`` called with any of ``step``, ``replica``,
  ``replicas``, ``microbatches``, ``microbatch_size``, ``seq``, ``vocab``, ``seed`` that its
  signature names, returning ``(x, y)`` in the shapes above (or ``[microbatches *
  microbatch_size, seq]``).

Nothing is unpickled or evaluated: a token file is read with ``numpy.memmap``.

>>> from octopipe_core.executor.models import ModelSettings
>>> src = DataSource(DataSettings(), ModelSettings(vocab=16, seq=4).resolved(["embedding"]), 2)
>>> x, y = src.batch(step=0, replica=0, replicas=1)
>>> tuple(x.shape), bool(((7 * x + 3) % 16 == y).all())
((2, 2, 4), True)
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any

import numpy as np
import torch

from octopipe_core.errors import OctoPipeError, input_error
from octopipe_core.executor.models import ModelSettings, make_batch
from octopipe_core.executor.settings import DataSettings

TOKEN_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


def _gen(seed: int, step: int, replica: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + step) * 4099 + replica + 7)


def synthetic_batch(
    st: ModelSettings, microbatches: int, step: int, replica: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The synthetic learnable batch of ``(step, replica)``."""
    g = _gen(st.seed, step, replica)
    shape = (microbatches, st.microbatch_size, st.seq)
    if st.input != "tokens":  # no embedding: hidden-state inputs, the loss drives outputs to 0
        x = torch.randn(*shape, st.hidden, generator=g).to(st.torch_dtype())
        return x, torch.zeros(shape, dtype=torch.int64)
    seqs = torch.empty((*shape[:2], st.seq + 1), dtype=torch.int64)
    seqs[..., 0] = torch.randint(0, st.vocab, shape[:2], generator=g)
    for t in range(st.seq):
        seqs[..., t + 1] = (7 * seqs[..., t] + 3) % st.vocab
    return seqs[..., :-1].contiguous(), seqs[..., 1:].contiguous()


class TokenFile:
    """A validated flat binary token file (``numpy.memmap``, nothing loaded up front)."""

    CHECK_TOKENS = 1 << 20  # tokens whose ids are checked against the vocabulary at open

    def __init__(self, path: Path, token_dtype: str, vocab: int, seq: int, replicas: int) -> None:
        src = f"token file {path}"
        if not path.is_file():
            raise OctoPipeError(
                f"{src}: not found; fix: pass an existing file (--data FILE; a relative path is "
                "read from the job folder)"
            )
        dt = np.dtype(TOKEN_DTYPES[token_dtype])
        size = path.stat().st_size
        if size == 0 or size % dt.itemsize:
            raise OctoPipeError(
                f"{src}: {size} bytes is not a whole number of {token_dtype} token ids; fix: "
                f"write a flat array of {token_dtype} (np.array(ids, np.{token_dtype}).tofile) "
                "or set --token-dtype"
            )
        self.n = size // dt.itemsize
        self.shard = self.n // replicas
        if self.shard < seq + 1:
            raise OctoPipeError(
                f"{src}: {self.n} tokens give each of {replicas} replica(s) {self.shard}, fewer "
                f"than one sample (seq + 1 = {seq + 1}); fix: use a larger file or a shorter --seq"
            )
        self.path, self.vocab, self.seq = path, vocab, seq
        self.data = np.memmap(path, dtype=dt, mode="r")
        head = self.data[: min(self.n, self.CHECK_TOKENS)]
        self._check_ids(int(head.max()))

    def _check_ids(self, top: int) -> None:
        if top >= self.vocab:
            raise OctoPipeError(
                f"token file {self.path}: token id {top} >= vocab {self.vocab}; fix: export with "
                f"--vocab {top + 1} or more, or check --token-dtype"
            )

    def batch(
        self, shape: tuple[int, int], step: int, replica: int, seed: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        g = _gen(seed, step, replica)
        lo = replica * self.shard
        starts = torch.randint(0, self.shard - self.seq, shape, generator=g) + lo
        idx = starts.numpy()[..., None] + np.arange(self.seq + 1)
        toks = np.asarray(self.data[idx], dtype=np.int64)
        self._check_ids(int(toks.max()))
        t = torch.from_numpy(toks)
        return t[..., :-1].contiguous(), t[..., 1:].contiguous()


class DataSource:
    """Batches of one job; ``batch(step, replica, replicas)`` is deterministic."""

    def __init__(
        self,
        data: DataSettings,
        st: ModelSettings,
        microbatches: int,
        job_dir: str | Path | None = None,
        replicas: int = 1,
    ) -> None:
        self.d, self.st, self.m = data, st, microbatches
        self.tokens: TokenFile | None = None
        self.hook: Any = None
        if data.kind == "tokens":
            if st.input != "tokens":
                raise input_error(
                    "executor config", "data.kind", "a token file needs a model whose first "
                    "layer is an embedding", "use synthetic data or a data hook",
                )  # fmt: skip
            path = Path(data.path)
            if not path.is_absolute() and job_dir is not None:
                path = Path(job_dir) / path
            self.tokens = TokenFile(path, data.token_dtype, st.vocab, st.seq, replicas)
        elif data.kind == "hook":
            self.hook = load_hook(data.hook)

    def batch(self, step: int, replica: int, replicas: int) -> tuple[torch.Tensor, torch.Tensor]:
        st, m = self.st, self.m
        if self.d.kind == "synthetic":
            return synthetic_batch(st, m, step, replica)
        if self.d.kind == "fixed":
            return make_batch(ModelSettings(**{**st.to_dict(), "seed": st.seed + replica}), m)
        if self.tokens is not None:
            return self.tokens.batch((m, st.microbatch_size), step, replica, st.seed)
        return self._hook_batch(step, replica, replicas)

    def _hook_batch(
        self, step: int, replica: int, replicas: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        st, m = self.st, self.m
        avail = {
            "step": step,
            "replica": replica,
            "replicas": replicas,
            "microbatches": m,
            "microbatch_size": st.microbatch_size,
            "seq": st.seq,
            "vocab": st.vocab,
            "seed": st.seed,
        }
        params = inspect.signature(self.hook).parameters
        out = self.hook(**{k: v for k, v in avail.items() if k in params})
        spec = f"data hook {self.d.hook!r}"
        if not (isinstance(out, tuple) and len(out) == 2):
            raise OctoPipeError(f"{spec}: returned {type(out).__name__}; fix: return (x, y)")
        x, y = (torch.as_tensor(t) for t in out)
        want = (m, st.microbatch_size, st.seq)
        for name, t in (("x", x), ("y", y)):
            lead = tuple(t.shape[:3]) if t.dim() >= 3 else tuple(t.shape[:2])
            ok = lead == want or lead == (m * st.microbatch_size, st.seq)
            if not ok:
                raise OctoPipeError(
                    f"{spec}: {name} has shape {tuple(t.shape)}; fix: return [{m}, "
                    f"{st.microbatch_size}, {st.seq}] (microbatches, microbatch_size, seq)"
                )
        if st.input == "tokens":
            x = x.reshape(want).long()
            if int(x.max()) >= st.vocab or int(x.min()) < 0:
                raise OctoPipeError(
                    f"{spec}: token ids outside [0, {st.vocab}); fix: return ids below --vocab"
                )
        else:
            if x.numel() != m * st.microbatch_size * st.seq * st.hidden:
                raise OctoPipeError(
                    f"{spec}: x has shape {tuple(x.shape)}; fix: return hidden states "
                    f"[{m}, {st.microbatch_size}, {st.seq}, {st.hidden}]"
                )
            x = x.reshape(*want, st.hidden).to(st.torch_dtype())
        return x, y.reshape(want).long()


def load_hook(spec: str) -> Any:
    """Import ``module:function`` (a data hook); a one-line error if it cannot."""
    mod, _, fn = spec.partition(":")
    if not mod or not fn.isidentifier():
        raise OctoPipeError(f"data hook {spec!r}: expected module:function; fix: e.g. mydata:batch")
    try:
        return getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError) as e:
        raise OctoPipeError(
            f"data hook {spec!r}: cannot import ({e}); fix: put the module on PYTHONPATH of "
            "every node"
        ) from None


def check_token_file(
    path: str | Path, token_dtype: str, vocab: int, seq: int, replicas: int
) -> int:
    """Validate a token file at export time; returns its token count."""
    return TokenFile(Path(path), token_dtype, vocab, seq, replicas).n


def config_batches(
    cfg: dict[str, Any], step: int = 0, job_dir: str | Path | None = None
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every replica's batch of ``step`` for an executor config (what the job trains on; the
    reference check runs on their union)."""
    from octopipe_core.executor.mesh import config_layout
    from octopipe_core.profile import Profile

    prof = Profile.from_dict(cfg["plan"]["profile"])
    st = ModelSettings.from_dict(cfg.get("model", {})).resolved(
        [lt.family for lt in prof.layer_costs()]
    )
    dp = config_layout(cfg).dp
    src = DataSource(
        DataSettings.from_dict(cfg.get("data", {"kind": "fixed"})),
        st,
        int(cfg["plan"]["num_microbatches"]),
        job_dir,
        dp,
    )
    return [src.batch(step, r, dp) for r in range(dp)]
