"""The jobs of ``octopipe verify``: one job folder per candidate in a work folder (``export``'s
folders: launch.sh, slurm.sbatch), run here in rounds through ``octopipe run``'s launcher, or
on a cluster through the folder's ``run_all.sh``; their ``result.json`` files read back into a
``verify.VerifyResult``. No torch import (the jobs' processes import it).

Layout of a work folder: ``verify.json`` (the manifest: candidates, predictions, rounds,
settings), ``run_all.sh``, and per candidate ``NN-name/`` with its runs in
``NN-name/out/round-R/result.json``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from octopipe_core.errors import OctoPipeError
from octopipe_core.jsonio import loads_checked
from octopipe_core.verify import Candidate, VerifyResult, round_order, summarize

MANIFEST = "verify.json"
MANIFEST_FORMAT = "octopipe.verify/v1"
PIN_ENV = {"OCTOPIPE_PIN": "1", "OMP_NUM_THREADS": "1"}  # one core per rank, as bench_fidelity


def job_dirname(i: int, name: str) -> str:
    """The folder of candidate ``i``.

    >>> job_dirname(1, "zb-h1/balanced")
    '01-zb-h1-balanced'
    """
    slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in name)[:40]
    return f"{i:02d}-{slug}"


def round_out(job: Path, r: int) -> Path:
    """Where the run of round ``r`` (from 0) of ``job`` writes its outputs."""
    return job / "out" / f"round-{r + 1}"


def check_workdir(path: str | Path) -> Path:
    """A work folder must be empty or not exist (checked before any work; never overwritten)."""
    p = Path(path)
    if p.exists() and (not p.is_dir() or any(p.iterdir())):
        raise OctoPipeError(
            f"--workdir {p}: {'is a file' if not p.is_dir() else 'is not empty'}; fix: pass a "
            "new or empty folder"
        )
    return p


def run_all_sh(jobs: Sequence[str], rounds: int) -> str:
    """``run_all.sh``: every job once per round, in the rotated order, through its launch.sh
    (arguments go to every launch.sh) or, with ``--slurm`` inside an allocation, its
    slurm.sbatch."""
    lines = [
        "#!/usr/bin/env bash",
        f"# Run the {len(jobs)} verification jobs of this folder interleaved in {rounds} rounds,",
        "# then read them with `octopipe verify --collect THIS_FOLDER`. One node or several:",
        "#   ./run_all.sh [launch.sh arguments, e.g. --nnodes 2 --node-rank K --master-addr HOST]",
        "# Inside a SLURM allocation (each job's slurm.sbatch runs under srun on all its nodes):",
        "#   sbatch --nodes N --gpus-per-node G run_all.sh --slurm",
        "set -euo pipefail",
        'HERE="${OCTOPIPE_VERIFY_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}"',
        'MODE=launch; if [[ "${1:-}" == "--slurm" ]]; then MODE=slurm; shift; fi',
        "run() {",
        '  local job="$1" round="$2"; shift 2',
        '  local out="$HERE/$job/out/round-$round"',
        '  if [[ "$MODE" == slurm ]]; then',
        '    OCTOPIPE_JOB_DIR="$HERE/$job" bash "$HERE/$job/slurm.sbatch" -- \\',
        '      --no-resume --out "$out"',
        "  else",
        '    "$HERE/$job/launch.sh" "$@" -- --no-resume --out "$out"',
        "  fi",
        f'  echo "round $round/{rounds}: $job done" >&2',
        "}",
    ]
    for r in range(rounds):
        lines += [f'run {shlex.quote(jobs[i])} {r + 1} "$@"' for i in round_order(len(jobs), r)]
    return "\n".join(lines) + "\n"


def export_jobs(
    candidates: Sequence[Candidate],
    workdir: Path,
    *,
    rounds: int,
    model: dict[str, Any],
    runtime: dict[str, Any],
    settings: dict[str, Any] | None = None,
) -> list[Path]:
    """Export every candidate with the same ``model`` and ``runtime`` into ``workdir`` (new or
    empty), with the manifest and ``run_all.sh``; return the job folders."""
    from octopipe_core.executor.export import export_job

    check_workdir(workdir)
    names = [job_dirname(i, c.name) for i, c in enumerate(candidates)]
    jobs = [
        export_job(c.plan, c.profile, workdir / d, model=model, runtime=runtime)
        for c, d in zip(candidates, names, strict=True)
    ]
    manifest = {
        "format": MANIFEST_FORMAT,
        "rounds": rounds,
        "settings": dict(settings or {}),
        "candidates": [
            {"name": c.name, "source": c.source, "job": d, "predicted_ms": c.predicted_ms}
            for c, d in zip(candidates, names, strict=True)
        ],
    }
    (workdir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    (workdir / "run_all.sh").write_text(run_all_sh(names, rounds))
    (workdir / "run_all.sh").chmod(0o755)
    return jobs


def job_world(job: Path) -> int:
    """Ranks of a job (pp x dp of its layout)."""
    lay = loads_checked((job / "executor_config.json").read_bytes(), str(job))["layout"]
    return int(lay["pp"]) * int(lay["dp"])


def measured_ms(result: Path) -> list[float]:
    """The step times (ms) of a run's non-warm-up steps, from its ``result.json``."""
    if not result.is_file():
        raise OctoPipeError(
            f"{result}: file not found; fix: run the jobs first ({result.parents[3]}/run_all.sh)"
        )
    res = loads_checked(result.read_bytes(), str(result))
    try:
        ms = [float(x) for x in res["step_ms"][int(res["warmup"]) :]]
    except (KeyError, TypeError, ValueError):
        raise OctoPipeError(f"{result}: no step_ms/warmup; fix: rerun the job") from None
    if not ms or any(not x > 0 for x in ms):
        raise OctoPipeError(f"{result}: no positive measured step; fix: rerun with --steps 1+")
    return ms


class LocalJobs:
    """The ``verify.Runner`` of exported jobs on this machine: ``octopipe run``'s launcher,
    each rank pinned to a core (``OCTOPIPE_PIN=1``), a fresh start (``--no-resume``) per run."""

    def __init__(self, jobs: Sequence[Path], timeout_s: float, backend: str = "gloo") -> None:
        self.jobs = list(jobs)
        self.timeout_s = timeout_s
        self.backend = backend

    def __call__(self, i: int, r: int) -> list[float]:
        from octopipe_core.commands.run import launch, summarize_failure

        job = self.jobs[i]
        out = round_out(job, r)
        cfg = job / "executor_config.json"
        proc = launch(
            cfg, out, job_world(job), ["--no-resume"], self.timeout_s, PIN_ENV, self.backend
        )
        if proc.returncode != 0:
            errs = summarize_failure(proc.stderr)
            raise OctoPipeError(
                f"verify: {job.name} round {r + 1} failed (launcher exit {proc.returncode}): "
                + (" | ".join(errs) or proc.stderr.strip()[-300:] or "no log")
                + f"; fix: see `octopipe run {job}`"
            )
        return measured_ms(out / "result.json")


def load_manifest(workdir: Path) -> dict[str, Any]:
    """The manifest of a work folder written by ``export_jobs``."""
    path = workdir / MANIFEST
    if not path.is_file():
        raise OctoPipeError(
            f"--collect {workdir}: no {MANIFEST}; fix: pass a folder written by "
            "`octopipe verify --workdir DIR --export-only`"
        )
    m = loads_checked(path.read_bytes(), str(path))
    if not isinstance(m, dict) or m.get("format") != MANIFEST_FORMAT:
        raise OctoPipeError(f"{path}: field 'format': not {MANIFEST_FORMAT}; fix: re-export")
    return m


def collect(workdir: Path, seed: int = 0) -> VerifyResult:
    """The result of a work folder whose jobs have run (``run_all.sh``, or a local verify)."""
    m = load_manifest(workdir)
    try:
        cands = list(m["candidates"])
        rounds = int(m["rounds"])
        if any(Path(str(c["job"])).name != c["job"] or c["job"] in ("", "..") for c in cands):
            raise ValueError("'job' (a folder name in the work folder)")
        samples = [
            [measured_ms(round_out(workdir / c["job"], r) / "result.json") for r in range(rounds)]
            for c in cands
        ]
        names = [str(c["name"]) for c in cands]
        predicted = [float(c["predicted_ms"]) for c in cands]
        sources = [str(c["source"]) for c in cands]
    except (KeyError, TypeError, ValueError) as e:
        raise OctoPipeError(f"{workdir / MANIFEST}: bad field {e}; fix: re-export") from None
    peers = [n for n, s in zip(names, sources, strict=True) if s == "peer"]
    res = summarize(names, predicted, samples, peers, sources=sources, seed=seed)
    res.settings = {**m.get("settings", {}), "workdir": str(workdir)}
    return res
