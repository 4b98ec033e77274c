"""Settings of an exported training job (no torch import): data, optimizer, checkpoints.

Each is a dataclass stored in the executor config under ``data``, ``train`` and
``checkpoint``; ``from_dict`` reports a bad field in one line (file, field, fix).

>>> OptimSettings.from_dict({"lr": 3e-4}).optimizer
'adamw'
>>> DataSettings.from_dict({"kind": "tokens"})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
octopipe_core.errors.OctoPipeError: executor config: field 'data.path': empty; fix: ...
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from octopipe_core.errors import OctoPipeError, input_error

KINDS = ("synthetic", "fixed", "tokens", "hook")
TOKEN_DTYPES = ("uint16", "uint32")


@dataclass
class DataSettings:
    """Where a job's batches come from (see ``executor.data``)."""

    kind: str = "synthetic"
    path: str = ""  # token file; relative paths resolve against the job folder
    token_dtype: str = "uint16"
    hook: str = ""  # module:function

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any] | None, src: str = "executor config") -> DataSettings:
        d = dict(d or {})
        known = set(DataSettings.__dataclass_fields__)
        for k in d:
            if k not in known:
                raise input_error(
                    src, f"data.{k}", "unknown key", f"use {', '.join(sorted(known))}"
                )
        ds = DataSettings(**d)
        if ds.kind not in KINDS:
            raise input_error(
                src, "data.kind", f"got {ds.kind!r}", f"use one of {', '.join(KINDS)}"
            )
        if ds.token_dtype not in TOKEN_DTYPES:
            raise input_error(
                src, "data.token_dtype", f"got {ds.token_dtype!r}", "use uint16 or uint32"
            )
        if ds.kind == "tokens" and not ds.path:
            raise input_error(src, "data.path", "empty", "give the token file (--data FILE)")
        if ds.kind == "hook" and ":" not in ds.hook:
            raise input_error(src, "data.hook", f"got {ds.hook!r}", "write module:function")
        return ds


@dataclass
class OptimSettings:
    """Optimizer, learning-rate schedule (linear warm-up, then cosine) and clipping."""

    optimizer: str = "adamw"  # "adamw" | "sgd"
    lr: float = 1e-3
    min_lr: float = 1e-4  # the cosine ends here
    warmup_steps: int = 0
    decay_steps: int = 0  # cosine horizon (steps); 0: the job's --steps at export
    weight_decay: float = 0.01  # decoupled (AdamW), on every parameter
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    clip: float = 1.0  # max global gradient norm; 0: no clipping

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any] | None, src: str = "executor config") -> OptimSettings:
        d = dict(d or {})
        known = set(OptimSettings.__dataclass_fields__)
        for k, v in d.items():
            if k not in known:
                raise input_error(
                    src, f"train.{k}", "unknown key", f"use {', '.join(sorted(known))}"
                )
            if k != "optimizer" and (
                isinstance(v, bool)
                or not isinstance(v, (int, float))
                or v < 0
                or not math.isfinite(v)
            ):
                raise input_error(src, f"train.{k}", f"got {v!r}", "use a number >= 0")
        o = OptimSettings(**d)
        if o.optimizer not in ("adamw", "sgd"):
            raise input_error(src, "train.optimizer", f"got {o.optimizer!r}", "use adamw or sgd")
        if o.min_lr > o.lr:
            raise input_error(src, "train.min_lr", f"{o.min_lr} > lr {o.lr}", "use min_lr <= lr")
        return o

    def lr_at(self, step: int, total_steps: int) -> float:
        """Learning rate of ``step`` (0-based).

        >>> o = OptimSettings(lr=1.0, min_lr=0.0, warmup_steps=2, decay_steps=6)
        >>> [round(o.lr_at(s, 6), 3) for s in range(6)]
        [0.5, 1.0, 1.0, 0.854, 0.5, 0.146]
        """
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        horizon = (self.decay_steps or total_steps) - self.warmup_steps
        frac = min(1.0, (step - self.warmup_steps) / max(1, horizon))
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1 + math.cos(math.pi * frac))


@dataclass
class CheckpointSettings:
    """When and where to checkpoint; ``resume``: continue from ``<dir>/latest`` if present."""

    every: int = 0  # steps; 0: only on request
    dir: str = "checkpoints"  # relative paths resolve against the job folder
    keep: int = 2  # newest checkpoints kept (0: all)
    resume: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any] | None, src: str = "executor config") -> CheckpointSettings:
        d = dict(d or {})
        known = set(CheckpointSettings.__dataclass_fields__)
        for k in d:
            if k not in known:
                raise input_error(
                    src, f"checkpoint.{k}", "unknown key", f"use {', '.join(sorted(known))}"
                )
        c = CheckpointSettings(**d)
        for k in ("every", "keep"):
            v = getattr(c, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise input_error(src, f"checkpoint.{k}", f"got {v!r}", "use an integer >= 0")
        return c

    def path(self, job_dir: str | Path, override: str | None = None) -> Path:
        """The checkpoint folder: ``override`` when the user names one on the command line
        (``run --checkpoint-dir``), else ``dir`` inside the job folder. A config whose ``dir``
        leaves the job folder (absolute, or ``..``) is refused: a received job must not write
        or delete anywhere else."""
        if override:
            return Path(override)
        job = Path(job_dir)
        p = job / self.dir
        inside = p.resolve() == job.resolve() or job.resolve() in p.resolve().parents
        if Path(self.dir).is_absolute() or not inside:
            raise OctoPipeError(
                f"executor config: field 'checkpoint.dir': {self.dir!r} is outside the job "
                "folder; fix: use a folder inside the job (the default is 'checkpoints'), or "
                "name the place yourself with octopipe run --checkpoint-dir DIR"
            )
        return p
