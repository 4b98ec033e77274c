"""The ``octopipe`` command: simulate and baselines on every sample, errors as one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from octopipe_core.cli import main
from octopipe_core.plan import save_plan
from octopipe_core.profile import list_samples, load_sample
from octopipe_core.schedules import SCHEDULES, build_plan

SAMPLES = [s for s in list_samples() if s != "tiny-hybrid"]


@pytest.mark.parametrize("sample", SAMPLES)
def test_every_sample_under_every_peer(sample: str, capsys: pytest.CaptureFixture) -> None:
    for sched in SCHEDULES:
        assert (
            main(
                [
                    "simulate",
                    "--profile",
                    sample,
                    "--schedule",
                    sched,
                    "--devices",
                    "4",
                    "--microbatches",
                    "16",
                    "--json",
                ]
            )
            == 0
        )
        out = json.loads(capsys.readouterr().out)
        assert out["schedule"] == f"{sched}/uniform"
        assert out["step_time_ms"] >= out["lower_bound_ms"] > 0
        assert len(out["peak_memory_gib"]) == 4
        assert 0 <= out["bubble_ratio"] < 1 and 0 <= out["comm_overlap_ratio"] <= 1


def test_baselines_side_by_side(capsys: pytest.CaptureFixture) -> None:
    assert (
        main(["baselines", "--profile", "nemotron-h-8b", "--devices", "8", "--microbatches", "32"])
        == 0
    )
    text = capsys.readouterr().out
    for sched in SCHEDULES:
        assert f"{sched}/uniform" in text and f"{sched}/balanced" in text
    assert (
        main(
            [
                "baselines",
                "--profile",
                "llama-3-8b",
                "--devices",
                "4",
                "--microbatches",
                "8",
                "--json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert set(data["baselines"]) == {
        f"{s}/{p}" for s in SCHEDULES for p in ("uniform", "balanced")
    }


def test_simulate_plan_file_and_readable_table(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    prof = load_sample("jamba-v0.1")
    plan = build_plan(prof, "interleaved", 4, 8, chunks=2, partition="balanced")
    path = tmp_path / "p.json"
    save_plan(plan, path, prof)
    assert main(["simulate", "--plan", str(path), "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert (
        main(
            [
                "simulate",
                "--profile",
                "jamba-v0.1",
                "--schedule",
                "interleaved",
                "--partition",
                "balanced",
                "--devices",
                "4",
                "--microbatches",
                "8",
                "--chunks",
                "2",
                "--json",
            ]
        )
        == 0
    )
    b = json.loads(capsys.readouterr().out)
    assert a["step_time_ms"] == b["step_time_ms"]
    assert main(["simulate", "--plan", str(path), "--memory-gib", "1"]) == 0
    text = capsys.readouterr().out
    assert "step_time_ms" in text and "fits_memory" in text and "NO" in text


def test_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "octopipe.profile/v1", "name": "x"}')
    assert main(["simulate", "--profile", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "bad.json" in err and "tokens_per_microbatch" in err
    assert main(["simulate", "--profile", "llama-3-8b", "--devices", "64"]) == 2
    assert "fewer devices" in capsys.readouterr().err
    assert (
        main(
            [
                "simulate",
                "--profile",
                "llama-3-8b",
                "--schedule",
                "dualpipev",
                "--devices",
                "4",
                "--microbatches",
                "4",
            ]
        )
        == 2
    )
    assert "--microbatches 8" in capsys.readouterr().err


def test_python_dash_m_entry_point() -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "octopipe_core",
            "simulate",
            "--profile",
            "tiny-hybrid",
            "--devices",
            "2",
            "--microbatches",
            "4",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["devices"] == 2


def test_plan_without_embedded_profile_needs_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    prof = load_sample("tiny-hybrid")
    path = tmp_path / "bare.json"
    save_plan(build_plan(prof, "1f1b", 2, 4), path)  # no profile embedded
    assert main(["simulate", "--plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert "no embedded profile" in err and "--profile" in err
    assert main(["simulate", "--plan", str(path), "--profile", "tiny-hybrid", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["devices"] == 2
