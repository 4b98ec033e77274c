"""One typed peer table (``peers.PeerTable`` of ``PeerScore`` rows) for ``octopipe baselines``,
the tuner and the dashboard: same rows, errors carried in the row, JSON shapes unchanged."""

from __future__ import annotations

import dataclasses
import json
import pickle

import pytest

from octopipe_core.cli import main
from octopipe_core.peers import (
    TABLE_METRICS,
    TUNE_METRICS,
    PeerScore,
    PeerTable,
    peer_table,
    run_peers,
)
from octopipe_core.profile import load_sample
from octopipe_core.schedules import PARTITIONS, SCHEDULES
from octopipe_core.tuner import tune
from octopipe_core.tuner.climb import peer_candidates
from octopipe_core.tuner.evaluate import Evaluator

KEYS = [f"{s}/{p}" for s in SCHEDULES for p in PARTITIONS]


@pytest.mark.parametrize(
    ("sample", "devices", "mbs", "cap_gib"),
    [("tiny-hybrid", 2, 4, 8.0), ("tiny-hybrid", 2, 2, 80.0), ("nemotron-h-8b", 4, 8, 80.0)],
)
def test_tuner_and_cli_build_the_same_table(
    sample: str, devices: int, mbs: int, cap_gib: float
) -> None:
    prof = load_sample(sample)
    tuner_table, cands = peer_candidates(Evaluator(prof, devices, mbs, cap_gib))
    cli_table = PeerTable.of(run_peers(prof, devices, mbs, 2, cap_gib))
    assert type(tuner_table) is type(cli_table) is PeerTable
    assert list(tuner_table) == list(cli_table) == KEYS
    for key in KEYS:
        t, c = tuner_table[key], cli_table[key]
        assert (t.ok, t.error, t.fits_memory) == (c.ok, c.error, c.fits_memory), key
        assert t.step_time_ms == c.step_time_ms and t.peak_memory_gib == c.peak_memory_gib, key
        assert t.row(TUNE_METRICS) == c.row(TUNE_METRICS)
    assert sorted(c.origin for c in cands) == sorted(k for k in KEYS if cli_table[k].ok)


def test_a_tight_cap_leaves_peers_that_do_not_fit() -> None:
    table = peer_table(load_sample("tiny-hybrid"), 2, 4, memory_gib=8.0)
    fits = {s.fits_memory for s in table.values() if s.ok}
    assert fits == {True, False}  # the table above compares fitting and non-fitting rows
    best = table.best()
    assert best is not None and best.fits_memory and best.step_time_ms is not None
    slower = [s.step_time_ms for s in table.values() if s.fits_memory and s.step_time_ms]
    assert best.step_time_ms == min(slower)


def test_an_unbuildable_peer_carries_its_error() -> None:
    table = peer_table(load_sample("tiny-hybrid"), 2, 2)
    bad = table["dualpipev/uniform"]
    assert bad.ok is False and bad.step_time_ms is None and not bad.fits_memory
    assert bad.error is not None and "--microbatches 4" in bad.error
    assert bad.row() == {"error": bad.error}
    assert table.step_ms("dualpipev/uniform") is None and table.step_ms("nope/uniform") is None
    assert all(s.key != bad.key for s in (table.best(), table.best(fitting=False)) if s)
    assert pickle.loads(pickle.dumps(table)) == table  # the dashboard's st.cache_data pickles it


def test_best_peer_skips_error_rows_and_rows_over_the_cap() -> None:
    res = tune(load_sample("tiny-hybrid"), 2, 4, time_budget_s=1, stop_at_convergence=True)
    fake = PeerTable(
        (
            PeerScore("1f1b", "uniform", error="too few layers"),
            PeerScore("zbv", "uniform", 1.0, fits_memory=False, peak_memory_gib=(9.0, 9.5)),
            PeerScore("gpipe", "balanced", 3.0, fits_memory=True, peak_memory_gib=(1.0, 2.0)),
            PeerScore("zb-h1", "balanced", 2.0, fits_memory=True, peak_memory_gib=(1.5, 2.5)),
        )
    )
    r = dataclasses.replace(res, baselines=fake)
    assert r.best_peer() == ("zb-h1/balanced", 2.0)
    assert r.best_peer(fitting=False) == ("zbv/uniform", 1.0)
    assert r.speedup_over("1f1b/uniform") is None and r.speedup_over("missing/uniform") is None
    assert r.speedup_over("gpipe/balanced") == pytest.approx(3.0 / r.step_time_ms)
    d = r.to_dict()
    assert d["best_peer"] == "zb-h1/balanced" and d["speedup_vs_1f1b_uniform"] is None
    assert d["baselines"] == {
        "1f1b/uniform": {"error": "too few layers"},
        "zbv/uniform": {"step_time_ms": 1.0, "fits_memory": False, "peak_memory_gib": [9.0, 9.5]},
        "gpipe/balanced": {"step_time_ms": 3.0, "fits_memory": True, "peak_memory_gib": [1.0, 2.0]},
        "zb-h1/balanced": {"step_time_ms": 2.0, "fits_memory": True, "peak_memory_gib": [1.5, 2.5]},
    }


def test_baselines_json_keeps_its_shape(capsys: pytest.CaptureFixture) -> None:
    args = ["baselines", "--profile", "tiny-hybrid", "--devices", "2", "--microbatches", "2"]
    assert main([*args, "--memory-gib", "8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data) == ["profile", "devices", "microbatches", "baselines"]
    table = data["baselines"]
    assert list(table) == KEYS
    errors = [k for k, v in table.items() if "error" in v]
    assert errors == ["dualpipev/uniform", "dualpipev/balanced"]
    for key, row in table.items():
        if key in errors:
            assert list(row) == ["error"] and isinstance(row["error"], str)
            continue
        assert tuple(row) == TABLE_METRICS
        assert isinstance(row["peak_memory_gib"], list) and len(row["peak_memory_gib"]) == 2
        assert isinstance(row["fits_memory"], bool) and row["step_time_ms"] > 0
    typed = peer_table(load_sample("tiny-hybrid"), 2, 2, memory_gib=8.0)
    assert json.loads(json.dumps(typed.to_json())) == table  # the CLI prints the typed table
