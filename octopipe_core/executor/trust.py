"""A job folder is code, like a script: its ``model.factory`` and ``data.hook``
(``module:function``) are imported and called in every worker. ``octopipe run`` therefore
shows that code and asks before running a job that was not exported on this machine.

``export`` records a digest of each config it writes in ``~/.cache/octopipe/exported_jobs``
(``OCTOPIPE_HOME`` moves that folder). ``run`` looks the config up there; a job with user code
that is not listed (received from someone else, or edited since) needs a "y" at the prompt, or
``--trust`` where there is no terminal. Jobs whose model and data are OctoPipe's own stand-ins
run without asking: they import nothing from outside the package.

>>> user_code({"model": {"factory": "mypkg.model:build"}, "data": {"kind": "synthetic"}})
['model.factory = mypkg.model:build']
>>> user_code({"model": {"factory": "octopipe_core.executor.hf:llama_tiny"}})
[]
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from octopipe_core.errors import OctoPipeError


def user_code(cfg: dict[str, Any]) -> list[str]:
    """The ``module:function`` entries of a config that import code from outside OctoPipe."""
    out = []
    factory = str(cfg.get("model", {}).get("factory", "") or "")
    if factory and not factory.startswith("octopipe_core."):
        out.append(f"model.factory = {factory}")
    data = cfg.get("data") or {}
    hook = str(data.get("hook", "") or "")
    if data.get("kind") == "hook" and hook and not hook.startswith("octopipe_core."):
        out.append(f"data.hook = {hook}")
    return out


def _registry() -> Path:
    home = os.environ.get("OCTOPIPE_HOME") or str(Path.home() / ".cache" / "octopipe")
    return Path(home) / "exported_jobs"


def config_digest(cfg: dict[str, Any]) -> str:
    text = json.dumps(cfg, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def record_export(cfg: dict[str, Any]) -> None:
    """Remember that this machine wrote ``cfg`` (best effort: a read-only home only means
    that ``run`` will ask)."""
    try:
        reg = _registry()
        reg.parent.mkdir(parents=True, exist_ok=True)
        with reg.open("a", encoding="utf-8") as f:
            f.write(config_digest(cfg) + "\n")
    except OSError:
        pass


def exported_here(cfg: dict[str, Any]) -> bool:
    try:
        lines = _registry().read_text(encoding="utf-8").split()
    except OSError:
        return False
    return config_digest(cfg) in set(lines)


def confirm_user_code(cfg: dict[str, Any], job: Path, trust: bool) -> None:
    """Refuse (or ask, on a terminal) before running user code from a job not made here."""
    code = user_code(cfg)
    if not code or trust or exported_here(cfg):
        return
    what = "; ".join(code)
    if sys.stdin.isatty():
        print(
            f"{job} was not exported on this machine (or was edited since). Running it imports "
            f"and runs this code in every worker: {what}",
            file=sys.stderr,
        )
        answer = input("run it? [y/N] ").strip().lower()
        if answer in ("y", "yes"):
            return
    raise OctoPipeError(
        f"run: {job} was not exported here and runs your code in every worker ({what}); fix: "
        "read that code, then pass --trust"
    )


def strip_cwd_from_path() -> None:
    """Keep the current directory off ``sys.path`` (``python -m`` puts it first) unless
    ``OCTOPIPE_IMPORT_CWD=1``: a job folder run from inside must not import its own files."""
    if os.environ.get("OCTOPIPE_IMPORT_CWD") == "1":
        return
    cwd = os.getcwd()
    sys.path[:] = [p for p in sys.path if p not in ("", ".", cwd)]
