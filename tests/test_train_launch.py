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
from octopipe_core.commands.run import run_process_group
from octopipe_core.executor.harness import free_port
from octopipe_core.plan import save_plan
from octopipe_core.profile import load_sample
from octopipe_core.schedules import build_plan
from tests.helpers import job_group

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
    nodes = [
        ["bash", str(moved / "launch.sh"), "--nnodes", "2", "--node-rank", str(k),
         "--master-addr", "127.0.0.1", "--master-port", port, "--", "--backend", "gloo"]
        for k in (0, 1)
    ]  # fmt: skip
    out = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}
    env = env_for_jobs()
    with (  # both nodes at once, so not run_process_group
        job_group(nodes[0], cwd=tmp_path, env=env, **out) as node0,
        job_group(nodes[1], cwd=tmp_path, env=env, **out) as node1,
    ):
        outs = [p.communicate(timeout=240)[0] for p in (node0, node1)]
    assert [node0.returncode, node1.returncode] == [0, 0], outs
    res = json.loads((moved / "out" / "result.json").read_text())
    assert len(res["losses"]) == 2 and res["layout"]["dp"] == 2
    assert res["peak_memory_gib"] == [None] * 4  # one per rank; the CUDA allocator's alone
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
    # one rank per node: the two-node test covers DP across nodes; this one, the SLURM script
    job = export(tmp_path, "--nnodes", "2", "--dp", "1")
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
    cmd = ["bash", str(job / "slurm.sbatch"), "--", "--steps", "1", "--backend", "gloo"]
    proc = run_process_group(cmd, env, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    res = json.loads((job / "out" / "result.json").read_text())
    assert len(res["losses"]) == 1 and res["layout"]["pp"] == 2 and res["layout"]["dp"] == 1


def test_torchtitan_and_megatron_fragments_or_the_failing_constraint(tmp_path: Path) -> None:
    from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

    from octopipe_core.executor.export import export_job
    from octopipe_core.executor.frameworks import placement_style
    from octopipe_core.executor.plans import irregular_plan

    tomllib = pytest.importorskip("tomllib")
    llama = load_sample("llama-3-8b")
    cases = [("interleaved", "loop", "Interleaved1F1B"), ("zbv", "v", "ZBVZeroBubble"),
             ("1f1b", "loop", "1F1B")]  # fmt: skip
    for sched, style, name in cases:
        plan = build_plan(llama, sched, 2, 4)
        assert placement_style(plan) == style
        # the placement torchtitan builds for that schedule name is the plan's
        torch_map = generate_stage_to_rank_mapping(2, plan.num_stages, style=style)
        assert [torch_map[s] for s in range(plan.num_stages)] == list(plan.placement)
        job = export_job(plan, llama, tmp_path / sched)
        tt = tomllib.loads((job / "torchtitan.toml").read_text())["parallelism"]
        assert tt["pipeline_parallel_schedule"] == name and tt["pipeline_parallel_degree"] == 2
        assert (job / tt["pipeline_parallel_schedule_csv"]).is_file()
        fqns = tt["module_fqns_per_model_part"]
        assert len(fqns) == plan.num_stages and fqns[0][0] == "tok_embeddings"
        assert [f for part in fqns for f in part] == ["tok_embeddings"] + [
            f"layers.{i}" for i in range(32)] + ["norm", "lm_head"]  # fmt: skip
        md = (job / "FRAMEWORKS.md").read_text()
        if style == "loop":
            layout = md.split('--pipeline-model-parallel-layout "')[1].split('"')[0]
            assert layout.count("|") == plan.num_stages - 1 and layout.startswith("Et")
            assert layout.endswith("tL") and layout.count("t") == 32
        else:
            assert "Megatron-LM\n\nNot expressible: placement [0, 1, 1, 0] is not loop" in md
    hybrid = load_sample("nemotron-h-8b")
    md = (export_job(build_plan(hybrid, "interleaved", 2, 4), hybrid, tmp_path / "h")
          / "FRAMEWORKS.md").read_text()  # fmt: skip
    pattern = md.split('--hybrid-layer-pattern "')[1].split('"')[0]
    assert pattern.count("|") == 3 and set(pattern) <= set("M*-E|")
    job = export_job(irregular_plan(hybrid.num_layers, 4), hybrid, tmp_path / "irr")
    assert not (job / "torchtitan.toml").exists()
    md = (job / "FRAMEWORKS.md").read_text()
    assert "Not expressible: placement [0, 1, 0] ([2, 1] stages per rank)" in md
