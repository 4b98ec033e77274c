"""``octopipe verify`` (issue 34): candidates measured on the executor in interleaved rounds,
against the simulator's predictions. The pure parts (order, statistics, JSON shape) without
jobs; the command on real plan files and real runs (tiny-hybrid, 2 devices, 4 micro-batches,
the default CPU-small model)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from octopipe_core.cli import main
from octopipe_core.commands import verify as verify_cmd
from octopipe_core.errors import OctoPipeError
from octopipe_core.executor.verify import check_workdir, run_all_sh
from octopipe_core.plan import load_plan
from octopipe_core.profile import load_sample
from octopipe_core.verify import (
    MAX_CANDIDATES,
    check_budget,
    parse_peers,
    peer_candidates,
    round_order,
    speedup_ci,
    summarize,
    verify,
)  # fmt: skip

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--rounds", "2", "--steps", "2"]


def cli(*argv: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "octopipe_core", *argv],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


# ---------------------------------------------------------------------------- pure functions
def test_round_order_rotates() -> None:
    orders = [round_order(4, r) for r in range(4)]
    assert all(sorted(o) == [0, 1, 2, 3] for o in orders)  # everyone once a round
    for pos in range(4):  # over 4 rounds each candidate runs once in each position
        assert sorted(o[pos] for o in orders) == [0, 1, 2, 3]
    assert round_order(3, 3) == round_order(3, 0)


def test_speedup_of_identical_samples_contains_one() -> None:
    a = [[10.0, 11.5, 9.8, 10.7], [10.2, 10.9, 11.1, 9.9]]
    s = speedup_ci(a, a)
    assert s.median == pytest.approx(1.0)
    assert s.ci95_lo <= 1.0 <= s.ci95_hi and s.ci95_lo < s.ci95_hi
    assert speedup_ci(a, a, seed=3) == speedup_ci(a, a, seed=3)  # seeded


def test_twice_as_slow_gets_half_the_speed() -> None:
    peer = [[10.0, 10.4, 9.7], [10.1, 9.9, 10.3]]
    slow = [[2 * x for x in rd] for rd in peer]
    s = speedup_ci(peer, slow)
    assert s.median == pytest.approx(0.5)
    assert 0.45 < s.ci95_lo <= 0.5 <= s.ci95_hi < 0.55
    res = summarize(["slow", "p"], [20.0, 10.0], [slow, peer], peers=["p"])
    assert res.best == "p" and set(res.row("slow").speedup_over) == {"p"}
    assert res.row("p").speedup_over == {}  # not over itself
    assert res.row("slow").speedup_over["p"].median == pytest.approx(0.5)
    row = res.row("slow").to_dict()
    assert row["p25_ms"] <= row["measured_median_ms"] <= row["p75_ms"]
    assert row["error_pct"] == pytest.approx(100 * (20 / row["measured_median_ms"] - 1), abs=1e-3)


def test_verify_runs_in_rotated_rounds_and_reports_each_run() -> None:
    prof = load_sample("tiny-hybrid")
    cands = peer_candidates(prof, 2, 4, ["1f1b/balanced", "zb-h1/balanced", "gpipe/uniform"])
    calls: list[tuple[int, int]] = []
    lines: list[str] = []

    def runner(i: int, r: int) -> list[float]:
        calls.append((i, r))
        return [100.0 + 10 * i, 101.0 + 10 * i]

    res = verify(cands, runner, rounds=2, progress=lines.append)
    assert calls == [(0, 0), (1, 0), (2, 0), (1, 1), (2, 1), (0, 1)]
    assert lines[3] == "round 2/2: zb-h1/balanced 110.5 ms median"
    d = res.to_dict()
    assert d["best"] == "1f1b/balanced" and d["peers"] == [c.name for c in cands]
    assert [r["steps"] for r in d["rows"]] == [4, 4, 4]
    assert d["rows"][0]["predicted_ms"] == pytest.approx(cands[0].predicted_ms, rel=1e-6)
    json.dumps(d)  # JSON-ready


def test_run_all_sh_follows_the_round_order() -> None:
    text = run_all_sh(["00-a", "01-b"], 2)
    runs = [ln.split()[1:3] for ln in text.splitlines() if ln.startswith("run ")]
    assert runs == [["00-a", "1"], ["01-b", "1"], ["01-b", "2"], ["00-a", "2"]]
    assert "launch.sh" in text and "slurm.sbatch" in text and "--no-resume" in text


def test_parse_peers_and_bounds(tmp_path: Path) -> None:
    assert parse_peers("zb-h1, 1f1b,zb-h1/balanced") == (["zb-h1/balanced", "1f1b/balanced"], 0)
    assert parse_peers("best:3") == ([], 3)
    for bad in ("nope", "zb-h1/even", "best:0", "best:x"):
        with pytest.raises(OctoPipeError, match="--peers"):
            parse_peers(bad)
    with pytest.raises(OctoPipeError, match=f"over {MAX_CANDIDATES}"):
        check_budget(MAX_CANDIDATES + 1, 1, 1, 0)
    (tmp_path / "x").write_text("")
    with pytest.raises(OctoPipeError, match=r"--workdir .*not empty"):
        check_workdir(tmp_path)
    with pytest.raises(OctoPipeError, match=r"--peers interleaved/uniform: .*needs 128 stages"):
        peer_candidates(load_sample("tiny-hybrid"), 2, 4, ["interleaved/uniform"], chunks=64)


# ---------------------------------------------------------------------------- the command
@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plan file written by ``octopipe tune``."""
    d = tmp_path_factory.mktemp("verify")
    argv = ["tune", "--profile", "tiny-hybrid", "--devices", "2", "--microbatches", "4",
            "--time-budget-s", "1", "--out", "tuned.json"]  # fmt: skip
    r = cli(*argv, cwd=d, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return d / "tuned.json"


def _check_rows(d: dict[str, Any], names: list[str]) -> None:
    assert [r["name"] for r in d["rows"]] == names and d["best"] in names
    for r in d["rows"]:
        for k in ("predicted_ms", "measured_median_ms", "p25_ms", "p75_ms"):
            assert math.isfinite(r[k]) and r[k] > 0, (k, r)
        assert r["p25_ms"] <= r["measured_median_ms"] <= r["p75_ms"]
        assert math.isfinite(r["error_pct"])
        assert r["error_pct"] == pytest.approx(
            100 * (r["predicted_ms"] / r["measured_median_ms"] - 1), abs=0.01
        )
        for peer, s in r["speedup_over"].items():
            assert peer in names and peer != r["name"]
            assert 0 < s["ci95"][0] <= s["median"] <= s["ci95"][1]


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_verify_cli_measures_plan_and_peers(tuned: Path, capsys: pytest.CaptureFixture) -> None:
    d = tuned.parent
    argv = ["verify", "tuned.json", "--peers", "zb-h1,1f1b", *SMALL, "--json",
            "--out", "best.json", "--workdir", "work"]  # fmt: skip
    r = cli(*argv, cwd=d)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    names = ["tuned.json", "zb-h1/balanced", "1f1b/balanced"]
    _check_rows(out, names)
    assert all(row["steps"] == 4 for row in out["rows"])  # 2 rounds x 2 measured steps
    assert set(out["rows"][0]["speedup_over"]) == {"zb-h1/balanced", "1f1b/balanced"}
    assert out["settings"]["rounds"] == 2 and out["settings"]["steps_per_round"] == 2
    progress = [ln for ln in r.stderr.splitlines() if ln.startswith("round ")]
    assert len(progress) == 6 and progress[3].startswith("round 2/2: zb-h1/balanced ")
    assert progress[0].endswith(" ms median")
    # --out: the measured best's plan, which `simulate --plan` reads
    _, prof = load_plan(d / "best.json")
    assert prof is not None and prof.name == "tiny-hybrid"
    assert main(["simulate", "--plan", str(d / "best.json"), "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    best_row = next(row for row in out["rows"] if row["name"] == out["best"])
    assert sim["step_time_ms"] == pytest.approx(best_row["predicted_ms"], rel=1e-3)
    # --workdir kept the job folders: --collect reads them back into the same table
    assert (d / "work" / "run_all.sh").is_file()
    assert main(["verify", "--collect", str(d / "work"), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert [row["measured_median_ms"] for row in again["rows"]] == [
        row["measured_median_ms"] for row in out["rows"]
    ]
    assert again["best"] == out["best"]
    assert main(["verify", "--collect", str(d / "work")]) == 0
    text = capsys.readouterr().out
    assert "predicted_ms" in text and "vs zb-h1/balanced (x, 95% CI)" in text
    assert "bootstrap" in text


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_verify_best_peers(tuned: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["verify", str(tuned), "--peers", "best:2", "--rounds", "1", "--steps", "1",
            "--warmup", "0", "--json"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    peers = [row for row in out["rows"] if row["source"] == "peer"]
    assert len(peers) == 2 and out["rows"][0]["name"] == "tuned.json"
    _check_rows(out, [row["name"] for row in out["rows"]])


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_tune_verify(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in (("ROUNDS_DEFAULT", 1), ("STEPS", 1), ("WARMUP", 0)):
        monkeypatch.setattr(verify_cmd, k, v)
    out = tmp_path / "t.json"
    argv = ["tune", "--profile", "tiny-hybrid", "--devices", "2", "--microbatches", "4",
            "--time-budget-s", "0.5", "--out", str(out), "--verify", "1", "--json"]  # fmt: skip
    assert main(argv) == 0
    ver = json.loads(capsys.readouterr().out)["verify"]
    rows = ver["rows"]
    # the tuned plan, its runners-up (the best plans of other layouts), then the best peer
    ups = [r["name"] for r in rows[1:-1]]
    assert ups == [f"runner-up-{i + 1}" for i in range(len(ups))] and len(ups) <= 3
    assert [row["source"] for row in rows] == ["plan"] * (1 + len(ups)) + ["peer"]
    _check_rows(ver, ["t.json", *ups, rows[-1]["name"]])


def test_bad_inputs_are_one_line(tuned: Path) -> None:
    d = tuned.parent
    (d / "exists.json").write_text("{}")
    (d / "full").mkdir(exist_ok=True)
    (d / "full" / "x").write_text("")
    cases = [
        (["--peers", "nope"], "--peers 'nope'"),
        (["--rounds", "0"], "--rounds"),
        (["--out", "exists.json"], "--force"),
        (["--workdir", "full"], "--workdir"),
        (["--rounds", "100", "--steps", "1000"], "fewer --rounds or --steps"),
        (["--export-only"], "--workdir"),
    ]
    for extra, needle in cases:
        r = cli("verify", "tuned.json", *extra, cwd=d, timeout=60)
        assert r.returncode == 2, (extra, r.stderr)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert needle in r.stderr, (needle, r.stderr)
        assert not (d / "full" / "00-tuned.json").exists()
