"""The Compare page's "Measured (verify)" view (issue 34): a real ``octopipe verify --json``
result uploaded through the page's file uploader, bad uploads as one-line errors, a run here
with its progress bar, and ``VerifyResult.from_dict`` round-tripping ``to_dict``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from app.components import analysis, verify_view
from octopipe_core.errors import OctoPipeError
from octopipe_core.plan import load_plan
from octopipe_core.profile import load_sample
from octopipe_core.verify import VerifyResult, peer_candidates, summarize
from tests.dash_helpers import ok, start

ROOT = Path(__file__).resolve().parent.parent
TINY = {"sample": "tiny-hybrid", "devices": "2", "microbatches": "4"}
VIEW = "Measured (verify)"


def cli(*argv: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "octopipe_core", *argv],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def verified(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    """A plan written by ``octopipe tune`` and what ``octopipe verify ... --json`` printed for
    it against two peers (real runs, 2 rounds x 2 steps)."""
    d = tmp_path_factory.mktemp("app-verify")
    tune = ["tune", "--profile", "tiny-hybrid", "--devices", "2", "--microbatches", "4",
            "--time-budget-s", "1", "--out", "tuned.json"]  # fmt: skip
    r = cli(*tune, cwd=d, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    argv = ["verify", "tuned.json", "--peers", "zb-h1,1f1b", "--rounds", "2", "--steps", "2"]
    r = cli(*argv, "--json", cwd=d)
    assert r.returncode == 0, r.stderr[-2000:]
    return d / "tuned.json", r.stdout.encode()


def opened() -> AppTest:
    """The Compare page on tiny-hybrid (2 devices, 4 micro-batches), on the verify view."""
    at = start("compare", timeout=240, **TINY)
    at.segmented_control(key="compare_view").set_value(VIEW).run()
    ok(at)
    return at


def upload(at: AppTest, name: str, body: bytes) -> None:
    at.file_uploader(key="verify_upload").set_value((name, body, "application/json")).run()
    ok(at)


def errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


def sample_result() -> VerifyResult:
    """A result of three candidates (a plan, two peers) over two rounds, without jobs."""
    samples = [[[10.0, 11.0], [10.5, 12.0]], [[12.0, 13.0], [12.5, 12.0]], [[9.0, 9.5], [9.2, 9.9]]]
    res = summarize(["tuned.json", "zb-h1/balanced", "1f1b/balanced"], [8.0, 9.0, 11.0], samples,
                    peers=["zb-h1/balanced", "1f1b/balanced"])  # fmt: skip
    res.settings = {"rounds": 2, "steps_per_round": 2, "warmup_steps_per_round": 1}
    return res


# ---------------------------------------------------------------------------- the reader
def test_from_dict_round_trips_to_dict() -> None:
    res = sample_result()
    d = res.to_dict()
    again = VerifyResult.from_dict(d, "v.json")
    assert again.to_dict() == d
    assert again.best == res.best and again.peers == res.peers
    # what `verify --json` prints (its "plan" key is not part of the result), through the page
    raw = json.dumps({**d, "plan": None}).encode()
    assert verify_view.read_result(raw, "v.json").to_dict() == d


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d.pop("rows"), "'rows'"),
        (lambda d: d["rows"][0].update(measured_median_ms=-5), "'rows[0].measured_median_ms'"),
        (lambda d: d["rows"][1].pop("p25_ms"), "'rows[1].p25_ms'"),
        (lambda d: d.update(best="nobody"), "'best'"),
        (lambda d: d["rows"][0]["speedup_over"]["zb-h1/balanced"].update(ci95=[2, 1]), "ci95"),
        (lambda d: d.update(rows=[{}] * 17), "'rows'"),
    ],
)
def test_from_dict_names_the_field(change: Any, field: str) -> None:
    d = sample_result().to_dict()
    change(d)
    with pytest.raises(OctoPipeError) as e:
        VerifyResult.from_dict(d, "v.json")
    msg = str(e.value)
    assert msg.startswith("v.json: field ") and field in msg and "fix:" in msg and "\n" not in msg


# ---------------------------------------------------------------------------- uploads
@pytest.mark.dist
@pytest.mark.timeout(300)
def test_a_real_verify_result_shows_as_a_table_beside_the_plans(
    verified: tuple[Path, bytes],
) -> None:
    tuned, body = verified
    d = json.loads(body)
    at = opened()
    # the session's tuned plan is the file's plan, so its row sits beside the page's "tuned"
    plan, _ = load_plan(tuned)
    ss = at.session_state
    ss["tuned"] = {"key": (ss["profile_version"], 2, 4), "plan": analysis.plan_json(plan)}
    at.run()
    upload(at, "verify.json", body)
    assert not at.error, errors(at)
    table = at.dataframe[0].value
    assert list(table["candidate"]) == [r["name"] for r in d["rows"]]
    assert list(table["candidate"]) == ["tuned.json", "zb-h1/balanced", "1f1b/balanced"]
    assert list(table["measured_median_ms"]) == [r["measured_median_ms"] for r in d["rows"]]
    assert list(table["predicted_ms"]) == [r["predicted_ms"] for r in d["rows"]]
    assert list(table["error_%"]) == [r["error_pct"] for r in d["rows"]]
    best = table.loc[table["measured best"] == "★", "candidate"]
    assert list(best) == [d["best"]]
    # the page simulates the plans of the same names on the same profile: the same step
    for sim, pred in zip(table["simulated here_ms"], table["predicted_ms"], strict=True):
        assert sim == pytest.approx(pred, abs=1e-3)
    for r in d["rows"]:
        row = table[table["candidate"] == r["name"]].iloc[0]
        assert row["p25-p75_ms"] == f"{r['p25_ms']:,.1f}-{r['p75_ms']:,.1f}"
        for p in d["peers"]:
            cell = row[f"vs {p} (x, 95% CI)"]
            s = r["speedup_over"].get(p)
            if s is None:
                assert cell == "-"
            else:
                lo, hi = s["ci95"]
                assert cell == (
                    f"{s['median']:.2f}x ({lo:.2f}-{hi:.2f}), predicted {s['predicted']:.2f}x"
                )
    assert any("bootstrap" in c.value and "uploaded verify" in c.value for c in at.caption)


def test_bad_uploads_are_one_line_errors_naming_the_field() -> None:
    at = opened()
    good = sample_result().to_dict()
    neg = json.loads(json.dumps(good))
    neg["rows"][0]["measured_median_ms"] = -5.0
    for name, body, needle in (
        ("junk.json", b"not json {", "junk.json"),
        ("norows.json", json.dumps({"best": "a", "peers": []}).encode(), "field 'rows'"),
        ("neg.json", json.dumps(neg).encode(), "field 'rows[0].measured_median_ms'"),
    ):
        upload(at, name, body)
        assert len(at.error) == 1 and needle in at.error[0].value, errors(at)
        assert name in at.error[0].value and "\n" not in at.error[0].value
        assert not at.dataframe
    upload(at, "good.json", json.dumps(good).encode())  # a good file replaces the error
    assert not at.error, errors(at)
    assert list(at.dataframe[0].value["candidate"]) == [r["name"] for r in good["rows"]]
    upload(at, "neg.json", json.dumps(neg).encode())  # and a bad one replaces the good table
    assert len(at.error) == 1 and not at.dataframe, errors(at)


# ---------------------------------------------------------------------------- run here
def test_run_here_reports_each_run_to_the_progress_callback() -> None:
    # the component's run with a fake runner: real job folders, no processes
    prof = load_sample("tiny-hybrid")
    cands = peer_candidates(prof, 2, 4, ["1f1b/uniform", "zb-h1/balanced"])
    lines: list[str] = []
    seen: list[int] = []

    def fake(paths: list[Path], timeout_s: float, backend: str) -> Any:
        assert [p.is_dir() for p in paths] == [True, True]
        seen.append(len(paths))
        return lambda i, r: [10.0 * (i + 1), 10.0 * (i + 1)]

    res = verify_view.run_here(cands, rounds=3, steps=2, warmup=0, model={"hidden": 8},
                               progress=lines.append, runner=fake)  # fmt: skip
    assert seen == [2] and len(lines) == 6 and lines[0].startswith("round 1/3: ")
    assert res.best == "1f1b/uniform" and res.settings["model"]["hidden"] == 8
    assert res.row("zb-h1/balanced").speedup_over["1f1b/uniform"].median == 0.5
    with pytest.raises(OctoPipeError, match="600 steps, over the 200"):
        verify_view.run_here(cands * 3, rounds=5, steps=20, warmup=0, model={},
                             progress=lines.append, runner=fake)  # fmt: skip


def test_run_here_refusals_are_one_line_errors() -> None:
    at = opened()
    options = at.multiselect(key="verify_plans").options
    for plans, rounds, steps, needle in (
        (options[:7], 1, 1, "7 plans, over the 6"),
        (options[:3], 5, 20, "300 steps, over the 200"),
        ([], 1, 1, "no plan picked"),
    ):
        at.multiselect(key="verify_plans").set_value(plans)
        at.number_input(key="verify_rounds").set_value(rounds)
        at.number_input(key="verify_steps").set_value(steps)
        at.button(key="verify_run").click().run()
        ok(at)
        assert len(at.error) == 1 and needle in at.error[0].value, errors(at)
        assert "\n" not in at.error[0].value and not at.dataframe and not at.get("progress")


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_run_here_fills_the_progress_bar_and_shows_the_table() -> None:
    at = opened()
    at.multiselect(key="verify_plans").set_value(["1f1b/uniform", "zb-h1/balanced"])
    at.number_input(key="verify_rounds").set_value(1)
    at.number_input(key="verify_steps").set_value(1)
    at.number_input(key="verify_warmup").set_value(0)
    at.button(key="verify_run").click().run()
    ok(at)
    assert not at.error, errors(at)
    (bar,) = at.get("progress")
    assert bar.proto.value == 100 and bar.proto.text.startswith("done: 2 runs")
    table = at.dataframe[0].value
    assert list(table["candidate"]) == ["1f1b/uniform", "zb-h1/balanced"]
    assert (table["measured_median_ms"] > 0).all() and list(table["steps"]) == [1, 1]
    assert list(table["measured best"]).count("★") == 1
    assert all(math.isfinite(x) for x in table["simulated here_ms"])
    assert any("measured here" in c.value for c in at.caption)
    at.run()  # the table stays on the next rerun; the bar does not
    ok(at)
    assert list(at.dataframe[0].value["candidate"]) == ["1f1b/uniform", "zb-h1/balanced"]
    assert not at.get("progress")
