"""``octopipe profile --links``: point-to-point bandwidth and latency between local gloo ranks
(spawned, and under torchrun), written as an ``octopipe.cluster/v1`` file that loads."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from octopipe_core.cli import main
from octopipe_core.cluster import load_cluster, load_cluster_sample
from octopipe_core.commands.run import run_process_group
from octopipe_core.executor.links import fit_link, pick_pairs

ROOT = Path(__file__).resolve().parent.parent
FAST = ["--sizes-mib", "0.0001,1,2", "--iters", "3"]


def test_fit_and_pairs() -> None:
    samples = [(4, 20e-6), (2**20, 20e-6 + 2**20 / 2e9), (2**21, 20e-6 + 2**21 / 2e9)]
    assert fit_link(samples) == (2.0, 20.0)
    assert pick_pairs(["a", "a", "b", "b"]) == {"intra_node": (0, 1), "inter_node": (0, 2)}
    # the inter-node pair joins the same local rank on both nodes (one NIC per GPU)
    assert pick_pairs(["a", "b", "a", "b"]) == {"intra_node": (0, 2), "inter_node": (0, 1)}
    assert pick_pairs(["a", "b", "b"])["intra_node"] == (1, 2)


@pytest.mark.dist
@pytest.mark.timeout(180)
def test_links_two_local_ranks(tmp_path: Path) -> None:
    out = tmp_path / "cluster.json"
    assert main(["profile", "--links", "--nproc", "2", "--out", str(out), *FAST]) == 0
    c = load_cluster(out)
    assert (c.nodes, c.gpus_per_node) == (1, 2)
    assert c.intra_node.name.startswith("measured intra-node")
    assert c.inter_node.name == "inter-node (not measured)"
    assert c.intra_node.bandwidth_gbytes_per_s > 0.001 and c.intra_node.latency_us > 0
    assert c.hbm_gbytes_per_s > 0 and "ranks 0<->1" in c.source


@pytest.mark.dist
@pytest.mark.timeout(180)
def test_links_pretend_nodes_measure_both_classes(tmp_path: Path) -> None:
    out = tmp_path / "cluster.json"
    args = ["profile", "--links", "--nproc", "4", "--simulate-nodes", "2", "--out", str(out)]
    assert main([*args, *FAST]) == 0
    c = load_cluster(out)
    assert (c.nodes, c.gpus_per_node) == (2, 2)
    assert c.intra_node.name.startswith("measured") and c.inter_node.name.startswith("measured")
    assert "ranks 0<->1" in c.source and "ranks 0<->2" in c.source
    # onto a bundled cluster: its shape and GPU stay, its intra/inter links are replaced
    out2 = tmp_path / "onto.json"
    args = ["profile", "--links", "--nproc", "2", "--simulate-nodes", "2", "--out", str(out2)]
    assert main([*args, "--cluster", "16x8-h800-ib400", *FAST]) == 0
    c2, base = load_cluster(out2), load_cluster_sample("16x8-h800-ib400")
    assert (c2.nodes, c2.gpus_per_node, c2.gpu_name) == (base.nodes, 8, base.gpu_name)
    assert c2.inter_node.name.startswith("measured") and c2.inter_node != base.inter_node


@pytest.mark.dist
@pytest.mark.timeout(180)
def test_links_under_torchrun(tmp_path: Path) -> None:
    out = tmp_path / "cluster.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "octopipe_core", "profile", "--links", "--out", str(out), *FAST]  # fmt: skip
    proc = run_process_group(cmd, env, timeout=150, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("wrote ") == 1  # rank 0 only
    c = load_cluster(out)
    assert (c.nodes, c.gpus_per_node) == (1, 2) and c.intra_node.name.startswith("measured")


def test_links_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "c.json")
    with pytest.raises(SystemExit) as e:  # argparse's one line: a flag out of its range
        main(["profile", "--links", "--nproc", "1", "--out", out])
    assert e.value.code == 2 and "--nproc: 1 is out of range; use 2..64" in capsys.readouterr().err
    assert main(["profile", "--links", "--sizes-mib", "a,b", "--out", out]) == 2
    assert "not numbers" in capsys.readouterr().err
    assert main(["profile", "--links", "--nproc", "3", "--simulate-nodes", "2", "--out", out]) == 2
    assert "does not split 3 ranks evenly" in capsys.readouterr().err
