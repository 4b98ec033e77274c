"""Checkpoints of a training job with ``torch.distributed.checkpoint`` (DCP).

Layout: ``<dir>/step_000012/`` (DCP files + ``octopipe.json``: step, layout, partition) and
``<dir>/latest`` (the name of the newest complete checkpoint, written by rank 0 after every
rank has saved). Every rank saves its stages' parameters (``model.<layer>.<name>``), the master
copies and the optimizer state (``master.s<stage>``, ``optim.s<stage>.<state>``; under ZeRO-1
one key per shard, ``...s<stage>.dp<replica>...``). Tensors that replicas hold identically share
a key and are written once.

Loading a checkpoint unpickles its DCP metadata, so a job loads only the checkpoints a job on
this machine wrote, as recorded then (``ckpt_trust``), unless the user passes ``--trust``; the
rotation (``keep``) deletes only step folders this job wrote.

Checkpoints are taken every ``every`` steps, at the end of a run (when ``every > 0``), and on
request: a file ``CHECKPOINT`` (checkpoint and go on) or ``STOP`` (checkpoint and stop) in the job
folder, or ``SIGUSR1`` to a worker. A multi-node job needs ``dir`` on a shared file system.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from octopipe_core.errors import OctoPipeError
from octopipe_core.executor import ckpt_trust

STOP_FILE, CHECKPOINT_FILE = "STOP", "CHECKPOINT"


def latest(ckpt_dir: Path) -> Path | None:
    """The newest complete checkpoint folder, or None."""
    ptr = ckpt_dir / "latest"
    if not ptr.is_file():
        return None
    path = ckpt_dir / ptr.read_text().strip()
    if not (path / "octopipe.json").is_file():
        raise OctoPipeError(
            f"checkpoint {path}: missing octopipe.json (incomplete checkpoint); fix: point "
            f"{ptr} at a complete step folder, or run with --no-resume"
        )
    return path


def save(
    ckpt_dir: Path,
    step: int,
    state: dict[str, torch.Tensor],
    meta: dict[str, Any],
    keep: int,
    job: Path | None = None,
) -> Path:
    """Collective: every rank saves ``state`` at ``step``; rank 0 then records the step
    folder's files as written by the job in folder ``job`` (``ckpt_trust``), updates
    ``latest`` and deletes the oldest step folders beyond ``keep`` that this job wrote."""
    import torch.distributed.checkpoint as dcp

    path = ckpt_dir / f"step_{step:06d}"
    owner = ckpt_dir.parent if job is None else job
    if path.exists() and not ckpt_trust.written_by(path, owner):
        raise OctoPipeError(
            f"checkpoint {path}: exists and this job did not write it; fix: move it away, or "
            "keep this job's checkpoints elsewhere (octopipe run --checkpoint-dir DIR)"
        )
    dist.barrier()  # every rank has looked before rank 0 creates it
    if dist.get_rank() == 0:
        path.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dcp.save({**state, "step": torch.tensor([step], dtype=torch.int64)}, checkpoint_id=str(path))
    dist.barrier()
    if dist.get_rank() == 0:
        (path / "octopipe.json").write_text(json.dumps({**meta, "step": step}) + "\n")
        ckpt_trust.record(path, owner)
        tmp = ckpt_dir / "latest.tmp"
        tmp.write_text(path.name + "\n")
        os.replace(tmp, ckpt_dir / "latest")
        if keep > 0:  # never a folder this job did not write
            old = sorted(
                p for p in ckpt_dir.glob("step_*")
                if p.is_dir() and p != path and ckpt_trust.written_by(p, owner)
            )  # fmt: skip
            for p in old[: max(0, len(old) - (keep - 1))]:
                shutil.rmtree(p, ignore_errors=True)
                ckpt_trust.forget(p)
    dist.barrier()
    return path


def foreign_steps(ckpt_dir: Path, job: Path, after: int) -> list[Path]:
    """Step folders past step ``after`` in ``ckpt_dir`` that the job in folder ``job`` did
    not write: a run from ``after`` on could overwrite them (``octopipe run`` refuses first)."""
    out = []
    for p in sorted(ckpt_dir.glob("step_*")) if ckpt_dir.is_dir() else []:
        num = p.name.removeprefix("step_")
        if num.isdigit() and int(num) > after and not ckpt_trust.written_by(p, job):
            out.append(p)
    return out


def job_meta(layout: dict[str, Any], partition: list[tuple[int, int]]) -> dict[str, Any]:
    """What a checkpoint must share with the job that resumes it: layout and partition."""
    return {"layout": layout, "partition": [list(p) for p in partition]}


def saved_step(path: Path, meta: dict[str, Any]) -> int:
    """The step of the checkpoint at ``path``, after checking that ``meta`` (layout,
    partition) matches the one saved; no process group needed (``octopipe run`` checks
    before launching)."""
    try:
        saved = json.loads((path / "octopipe.json").read_text())
        step = int(saved["step"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise OctoPipeError(
            f"checkpoint {path}/octopipe.json: unreadable ({type(e).__name__}); fix: point "
            f"{path.parent}/latest at a complete step folder, or run with --no-resume"
        ) from None
    for key, want in meta.items():
        if saved.get(key) != want:
            raise OctoPipeError(
                f"checkpoint {path}: field '{key}': saved {saved.get(key)!r}, this job has "
                f"{want!r}; fix: resume with the same plan and layout, or run with --no-resume"
            )
    return step


def check_trusted(path: Path) -> None:
    """Refuse a checkpoint that no job on this machine wrote as it is now (loading one
    unpickles its metadata), unless the user trusts it (``--trust``)."""
    why = None if ckpt_trust.trusted_by_user() else ckpt_trust.untrusted(path)
    if why is not None:
        raise OctoPipeError(
            f"checkpoint {path}: not loaded: {why}, and loading a checkpoint runs code from "
            "it; fix: pass --trust to octopipe run if you trust where it came from "
            f"({ckpt_trust.TRUST_ENV}=1 for launch.sh), or run with --no-resume"
        )


def load(path: Path, state: dict[str, torch.Tensor], meta: dict[str, Any]) -> int:
    """Collective: load ``state`` in place from ``path``; returns the checkpoint's step.
    ``meta`` (layout, partition) must match the one saved, and the checkpoint must be one a
    job on this machine wrote (``check_trusted``)."""
    import torch.distributed.checkpoint as dcp

    check_trusted(path)
    saved_step(path, meta)
    step = torch.zeros(1, dtype=torch.int64)
    dcp.load({**state, "step": step}, checkpoint_id=str(path))
    return int(step[0])


def requested(job_dir: Path) -> tuple[bool, bool]:
    """``(stop, checkpoint)`` requested through the job folder's STOP / CHECKPOINT files."""
    return (job_dir / STOP_FILE).exists(), (job_dir / CHECKPOINT_FILE).exists()


def clear_requests(job_dir: Path, *, stop: bool, checkpoint: bool) -> None:
    """Remove the request files a checkpoint has just answered: STOP only when the job stops
    for it, CHECKPOINT only when one was asked for. A STOP that arrives while a checkpoint is
    being written (a periodic one, or one a CHECKPOINT file or SIGUSR1 asked for) stays, and
    the next step reads it.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp()); (d / STOP_FILE).touch(); (d / CHECKPOINT_FILE).touch()
    >>> clear_requests(d, stop=False, checkpoint=True)
    >>> sorted(p.name for p in d.iterdir())
    ['STOP']
    """
    for name, answered in ((STOP_FILE, stop), (CHECKPOINT_FILE, checkpoint)):
        if answered:
            (job_dir / name).unlink(missing_ok=True)
