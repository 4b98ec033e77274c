"""Which checkpoints a job may load and delete: the ones a job on this machine wrote.

Loading a ``torch.distributed.checkpoint`` folder unpickles its ``.metadata``: a checkpoint is
code, like the job folder it sits in. So when a job saves a checkpoint, rank 0 records the
SHA-256 of every file of its step folder in a manifest kept outside the job, in
``~/.cache/octopipe/checkpoints/`` (``OCTOPIPE_HOME`` moves it), where a folder someone sends
you cannot put one. A job then resumes only from a checkpoint whose files match a manifest
recorded for that very folder; any other (received, copied, edited) is refused unless the user
passes ``--trust`` (``OCTOPIPE_TRUST_CHECKPOINTS=1`` for ``launch.sh``). The rotation of old
checkpoints deletes only step folders recorded as written by the same job folder.

Nothing here imports torch.

>>> import tempfile, os
>>> home = tempfile.mkdtemp(); os.environ["OCTOPIPE_HOME"] = home
>>> step = Path(tempfile.mkdtemp()) / "step_000001"; step.mkdir()
>>> _ = (step / ".metadata").write_bytes(b"saved")
>>> untrusted(step) is not None
True
>>> record(step, job=step.parent)
>>> untrusted(step) is None, written_by(step, step.parent)
(True, True)
>>> _ = (step / ".metadata").write_bytes(b"edited")
>>> untrusted(step)
'.metadata differs from what was saved'
>>> del os.environ["OCTOPIPE_HOME"]
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

TRUST_ENV = "OCTOPIPE_TRUST_CHECKPOINTS"
CHECKPOINT_DIR_ENV = "OCTOPIPE_CHECKPOINT_DIR"  # run --checkpoint-dir DIR (absolute) to ranks
MAX_FILES = 100_000


def _registry() -> Path:
    home = os.environ.get("OCTOPIPE_HOME") or str(Path.home() / ".cache" / "octopipe")
    return Path(home) / "checkpoints"


def _entry(step_dir: Path) -> Path:
    key = hashlib.sha256(str(step_dir.resolve()).encode("utf-8")).hexdigest()
    return _registry() / f"{key}.json"


def manifest(step_dir: Path) -> dict[str, str]:
    """SHA-256 of every file under ``step_dir``, by its path relative to it."""
    out: dict[str, str] = {}
    for p in sorted(step_dir.rglob("*")):
        if p.is_file() and not p.is_symlink():
            h = hashlib.sha256()
            with p.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            out[p.relative_to(step_dir).as_posix()] = h.hexdigest()
            if len(out) > MAX_FILES:
                break
    return out


def record(step_dir: Path, job: Path) -> None:
    """Remember that the job in folder ``job`` wrote ``step_dir`` with its current files (best
    effort: a read-only home only means the job will not resume without ``--trust``)."""
    data = {
        "step_dir": str(step_dir.resolve()),
        "job": str(Path(job).resolve()),
        "files": manifest(step_dir),
    }
    try:
        entry = _entry(step_dir)
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = entry.with_suffix(".tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, entry)
    except OSError:
        pass


def _recorded(step_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(_entry(step_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(data, dict) and data.get("step_dir") == str(step_dir.resolve())
    return data if ok and isinstance(data.get("files"), dict) else None


def untrusted(step_dir: Path) -> str | None:
    """Why ``step_dir`` may not be loaded without ``--trust``, or None when a job on this
    machine wrote it as it is now."""
    rec = _recorded(step_dir)
    if rec is None:
        return "no job on this machine wrote it"
    now = manifest(step_dir)
    saved: dict[str, str] = rec["files"]
    for name in sorted(set(now) | set(saved)):
        if name not in saved:
            return f"{name} was added after it was saved"
        if name not in now:
            return f"{name} is missing"
        if now[name] != saved[name]:
            return f"{name} differs from what was saved"
    return None


def written_by(step_dir: Path, job: Path) -> bool:
    """Whether the job in folder ``job`` recorded ``step_dir`` (the rotation deletes only
    those)."""
    rec = _recorded(step_dir)
    return rec is not None and rec.get("job") == str(Path(job).resolve())


def forget(step_dir: Path) -> None:
    """Drop the record of a step folder the rotation deleted."""
    with contextlib.suppress(OSError):
        _entry(step_dir).unlink(missing_ok=True)


def trusted_by_user() -> bool:
    """``--trust`` (or ``OCTOPIPE_TRUST_CHECKPOINTS=1``): load checkpoints not written here."""
    return os.environ.get(TRUST_ENV) == "1"
