"""Launch anywhere: the job folder names no path or python of the exporting machine;
launch.sh and slurm.sbatch pass ``bash -n`` and share one torchrun line (apart from the node
rank's variable); a two-"node" launch on localhost (node ranks 0 and 1) runs from a moved copy
of the folder; the SLURM script runs under stand-in ``srun``/``scontrol`` commands."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from octopipe_core.cli import main
from octopipe_core.executor.harness import free_port
from octopipe_core.plan import save_plan
from octopipe_core.profile import load_sample
from octopipe_core.schedules import build_plan

ROOT = Path(__file__).resolve().parents[1]


def export(tmp: Path, *extra: str) -> Path:
    prof = load_sample("tiny-hybrid")
    tmp.mkdir(parents=True, exist_ok=True)
    plan = tmp / "plan.json"
    save_plan(build_plan(prof, "1f1b", 2, 2), plan, prof)
    job = tmp / "job"
    assert main(["export", str(plan), "--out", str(job), "--dp", "2", *extra]) == 0
    return job


def torchrun_line(script: str) -> str:
    """The torchrun command of a script, continuation lines joined, variables normalised."""
    text = script.replace("\\\n", " ")
    m = re.search(r'"\$PY" -m torch\.distributed\.run .*?"\$@"', text)
    assert m, script
    line = re.sub(r"\s+", " ", m.group(0))
    return line.replace('"$NODE_RANK"', '"$NODE"').replace('"$SLURM_NODEID"', '"$NODE"')


def env_for_jobs() -> dict[str, str]:
    """This checkout's code for the workers (the job folder itself names none)."""
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(ROOT) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    return env


def test_scripts_are_portable_and_share_one_torchrun_line(tmp_path: Path) -> None:
    job = export(tmp_path, "--nnodes", "2")
    sh, slurm = (job / "launch.sh").read_text(), (job / "slurm.sbatch").read_text()
    for name in ("launch.sh", "slurm.sbatch"):
        assert subprocess.run(["bash", "-n", str(job / name)]).returncode == 0
    assert torchrun_line(sh) == torchrun_line(slurm)
    assert "--rdzv-backend static" in torchrun_line(sh) and '--node-rank "$NODE"' in torchrun_line(
        sh
    )
    assert '"$NODE_RANK"' in sh and '"$SLURM_NODEID"' in slurm
    assert 'NNODES="${NNODES:-2}"' in sh and "#SBATCH --nodes=2" in slurm
    assert "#SBATCH --gpus-per-node=2" in slurm and "srun" in slurm
    for f in job.iterdir():  # no path of this checkout or its python anywhere in the folder
        text = f.read_text()
        assert str(ROOT) not in text and sys.executable not in text, f.name
        assert "PYTHONPATH" not in text, f.name
    # a node rank outside the job is refused before torchrun starts
    proc = subprocess.run(["bash", str(job / "launch.sh"), "--nnodes", "2", "--node-rank", "2"],
                          capture_output=True, text=True, env=env_for_jobs())  # fmt: skip
    assert proc.returncode == 2 and "--node-rank 2 is outside 0..1" in proc.stderr


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_two_node_launch_from_a_moved_copy(tmp_path: Path) -> None:
    job = export(tmp_path / "made", "--steps", "2")
    moved = tmp_path / "elsewhere" / "job2"
    shutil.copytree(job, moved)
    shutil.rmtree(tmp_path / "made")
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [
                "bash",
                str(moved / "launch.sh"),
                "--nnodes",
                "2",
                "--node-rank",
                str(k),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                port,
                "--",
                "--backend",
                "gloo",
            ],
            cwd=tmp_path,
            env=env_for_jobs(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for k in (0, 1)
    ]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    res = json.loads((moved / "out" / "result.json").read_text())
    assert len(res["losses"]) == 2 and res["layout"]["dp"] == 2
    ranks = {e["pid"] for e in json.loads((moved / "out" / "trace_executed.json").read_text())[
        "traceEvents"] if e["ph"] == "X"}  # fmt: skip
    assert ranks == {0, 1, 2, 3}


FAKE_SRUN = """#!/usr/bin/env bash
# stand-in srun: run the command once per node, SLURM_NODEID set, all at once
while [[ "$1" == --* ]]; do shift; done
pids=()
for ((k = 0; k < SLURM_JOB_NUM_NODES; k++)); do SLURM_NODEID=$k "$@" & pids+=($!); done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; done; exit "$rc"
"""


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_slurm_script_runs_under_stand_in_srun(tmp_path: Path) -> None:
    job = export(tmp_path, "--nnodes", "2")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "scontrol").write_text("#!/usr/bin/env bash\necho 127.0.0.1\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = env_for_jobs()
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env['PATH']}",
        SLURM_JOB_NUM_NODES="2",
        SLURM_JOB_NODELIST="node[1-2]",
        SLURM_SUBMIT_DIR=str(job),
        MASTER_PORT=str(free_port()),
    )
    proc = subprocess.run(
        ["bash", str(job / "slurm.sbatch"), "--", "--steps", "1", "--backend", "gloo"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    res = json.loads((job / "out" / "result.json").read_text())
    assert len(res["losses"]) == 1 and res["layout"]["pp"] == 2
