"""Fuzz: hostile profiles, plans, cluster files and flags never crash, hang or lie.

Every case ends in one of two ways: a one-line error that names the field and the fix (exit
code 2), or a valid, finite result (exit code 0). Cases are seeded (``FUZZ_SEED`` changes the
seed) and each is bounded in time with ``SIGALRM``.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import random
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from octopipe_core.cli import main
from octopipe_core.cluster import example_cluster_dict, parse_cluster_bytes
from octopipe_core.errors import OctoPipeError
from octopipe_core.profile import example_profile_dict, parse_profile_bytes
from tests.fuzz_gen import dumps, flag_case, mutate

SEED = int(os.environ.get("FUZZ_SEED", "0"))
CASE_TIMEOUT_S = 30
NONFINITE = re.compile(r"\b(nan|inf|infinity)\b", re.IGNORECASE)


@contextlib.contextmanager
def time_limit(seconds: int, what: str) -> Iterator[None]:
    def on_alarm(signum: int, frame: Any) -> None:
        raise TimeoutError(f"hang: {what} ran past {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with (
        time_limit(CASE_TIMEOUT_S, " ".join(argv)[:80]),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse
            rc = int(e.code or 0)
    return rc, out.getvalue(), err.getvalue()


def assert_clean(argv: list[str], what: str) -> int:
    rc, out, err = run_cli(argv)
    if rc == 2:
        lines = [ln for ln in err.strip().splitlines() if not ln.startswith("octopipe: note")]
        assert len(lines) == 1, f"{what}: error is not one line: {err!r}"
        assert "fix" in lines[0], f"{what}: error says no fix: {lines[0]!r}"
        assert "Traceback" not in err
    elif rc == 3 and argv[0] == "tune":  # documented: no plan fits the cap, and it says why
        assert "fits" in out and "short" in out, f"{what}: exit 3 without the reason: {out!r}"
    else:
        assert rc == 0, f"{what}: exit code {rc}: {err[-300:]!r}"
        bad = NONFINITE.search(out)
        assert bad is None, f"{what}: non-finite figure in the output: {out[:300]!r}"
    return rc


def test_fuzz_profiles(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    base = example_profile_dict()
    outcomes = {0: 0, 2: 0}
    for i in range(300):
        doc, what = mutate(base, rng)
        raw = dumps(doc)
        try:
            with time_limit(CASE_TIMEOUT_S, what):
                parse_profile_bytes(raw, "fuzz.json")
        except OctoPipeError as e:
            assert "\n" not in str(e) and "fix:" in str(e), what
        f = tmp_path / f"p{i}.json"
        f.write_bytes(raw)
        argv = ["simulate", "--profile", str(f), "--devices", "2", "--microbatches", "4"]
        outcomes[assert_clean(argv, what)] += 1
    assert outcomes[2] > 20 and outcomes[0] > 5, outcomes  # both paths were exercised


def test_fuzz_plans(tmp_path: Path) -> None:
    rng = random.Random(SEED + 1)
    saved = tmp_path / "base.json"
    assert run_cli(["simulate", "--profile", "tiny-hybrid", "--devices", "2", "--microbatches",
                    "4", "--out", str(saved)])[0] == 0  # fmt: skip
    with_profile = json.loads(saved.read_text())
    bare = {k: v for k, v in with_profile.items() if k != "profile"}
    for i in range(200):
        base = with_profile if i % 2 else bare
        doc, what = mutate(base, rng)
        if i % 7 == 0 and isinstance(doc.get("schedule"), list) and doc["schedule"]:
            doc["schedule"][0] = rng.choice(
                ["0F0 0F0", "0F" + "9" * 5000, "", "0Q0", "1F0 0F0", [0, 1]]
            )
            what = f"schedule[0] = {str(doc['schedule'][0])[:20]!r}"
        f = tmp_path / f"plan{i}.json"
        f.write_bytes(dumps(doc))
        argv = ["simulate", "--plan", str(f)] + ([] if i % 2 else ["--profile", "tiny-hybrid"])
        assert_clean(argv, what)


def test_plan_for_another_model_is_refused(tmp_path: Path) -> None:
    """A plan without a profile, checked against --profile: wrong layer count, gaps."""
    saved = tmp_path / "p.json"
    run_cli(["simulate", "--profile", "tiny-hybrid", "--devices", "2", "--microbatches", "4",
             "--out", str(saved)])  # fmt: skip
    doc = {k: v for k, v in json.loads(saved.read_text()).items() if k != "profile"}
    for part in ([[0, 2], [2, 4]], [[0, 3], [4, 6]]):
        doc["partition"] = part
        saved.write_text(json.dumps(doc))
        rc, _, err = run_cli(["simulate", "--plan", str(saved), "--profile", "tiny-hybrid"])
        assert rc == 2 and "partition" in err, err


def test_fuzz_cluster_files() -> None:
    rng = random.Random(SEED + 2)
    base = example_cluster_dict()
    for _ in range(150):
        doc, what = mutate(base, rng)
        try:
            with time_limit(CASE_TIMEOUT_S, what):
                c = parse_cluster_bytes(dumps(doc), "fuzz-cluster.json")
        except OctoPipeError as e:
            assert "\n" not in str(e) and "fix:" in str(e), what
        else:
            assert (
                c.total_gpus >= 1
                and math.isfinite(c.inter_node.transfer_ms(1.0))
                and c.inter_node.transfer_ms(1.0) > 0
            ), what


FLAGS = {
    "simulate": ["--devices", "--microbatches", "--chunks", "--memory-gib", "--dp"],
    "baselines": ["--devices", "--microbatches", "--chunks", "--memory-gib"],
}


def test_fuzz_flags() -> None:
    rng = random.Random(SEED + 3)
    for _ in range(100):
        cmd, extra = flag_case(rng, FLAGS)
        argv = [cmd, "--profile", "tiny-hybrid", "--devices", "2", "--microbatches", "4", *extra]
        if extra[0] == "--dp":
            argv += ["--cluster", "1x8-h800"]
        assert_clean(argv, " ".join(argv))


def test_oversized_requests_are_refused_up_front() -> None:
    rc, _, err = run_cli(["simulate", "--profile", "tiny-hybrid", "--devices", "1024",
                          "--microbatches", "65536"])  # fmt: skip
    assert rc == 2 and "ops per simulation" in err and "--microbatches" in err


def test_fuzz_job_configs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hostile executor configs fail in one line before any process starts."""
    from octopipe_core.commands.run import preflight
    from octopipe_core.executor.job_config import load_job_config

    monkeypatch.setenv("OCTOPIPE_HOME", str(tmp_path / "home"))
    plan = tmp_path / "plan.json"
    assert run_cli(["simulate", "--profile", "tiny-hybrid", "--devices", "2", "--microbatches",
                    "4", "--out", str(plan)])[0] == 0  # fmt: skip
    job = tmp_path / "job"
    assert run_cli(["export", str(plan), "--out", str(job)])[0] == 0
    base = json.loads((job / "executor_config.json").read_text())
    small = {k: v for k, v in base.items() if k not in ("plan", "lowered")}
    rng = random.Random(SEED + 4)
    for i in range(150):
        doc, what = mutate(small, rng)
        if i % 3 == 0:
            doc, what = mutate(base, rng)
        doc = {**doc, "plan": base["plan"], "lowered": base["lowered"]}
        if i % 10 == 0:
            doc, what = mutate(base, rng)
        f = tmp_path / f"cfg{i}" / "executor_config.json"
        f.parent.mkdir()
        f.write_bytes(dumps(doc))
        try:
            with time_limit(CASE_TIMEOUT_S, what):
                preflight(load_job_config(f), f)
        except OctoPipeError as e:
            assert "\n" not in str(e) and "fix:" in str(e), (what, str(e))


def test_fuzz_tune_flags(tmp_path: Path) -> None:
    rng = random.Random(SEED + 5)
    flags = {"tune": ["--devices", "--microbatches", "--memory-gib", "--time-budget-s", "--seed"]}
    for _ in range(20):
        cmd, extra = flag_case(rng, flags)
        argv = [cmd, "--profile", "tiny-hybrid", "--devices", "2", "--microbatches", "4",
                "--time-budget-s", "0.3", "--stop-at-convergence", *extra]  # fmt: skip
        assert_clean(argv, " ".join(argv))


def test_tune_checks_out_before_the_search(tmp_path: Path) -> None:
    argv = ["tune", "--profile", "tiny-hybrid", "--devices", "2", "--microbatches", "4",
            "--time-budget-s", "30"]  # fmt: skip
    for out in ("/proc/x.json", str(tmp_path)):
        rc, _, err = run_cli([*argv, "--out", out])
        assert rc == 2 and "fix:" in err and "[tune]" not in err  # refused before any search
    existing = tmp_path / "mine.json"
    existing.write_text("{}")
    rc, _, err = run_cli([*argv, "--out", str(existing)])
    assert rc == 2 and "--force" in err and existing.read_text() == "{}"


def test_long_profiles_are_refused_or_bounded(tmp_path: Path) -> None:
    """Too many layers for the tuner: refused up front; 1,000 layers: the budget holds (the
    30 s alarm is the hang bound, far above the 2 s budget)."""
    doc = example_profile_dict()
    for n, refused in ((25_000, "layers"), (5_000, "tuner can search")):
        doc["layers"] = ["embedding"] + ["mamba2"] * (n - 2) + ["lm_head"]
        f = tmp_path / f"long{n}.json"
        f.write_text(json.dumps(doc))
        rc, _, err = run_cli(["tune", "--profile", str(f), "--devices", "8", "--microbatches",
                              "16", "--time-budget-s", "2"])  # fmt: skip
        assert rc == 2 and refused in err, err
    doc["layers"] = ["embedding"] + ["mamba2"] * 998 + ["lm_head"]
    f = tmp_path / "long1000.json"
    f.write_text(json.dumps(doc))
    assert_clean(["tune", "--profile", str(f), "--devices", "16", "--microbatches", "32",
                  "--time-budget-s", "2"], "1,000-layer tune")  # fmt: skip
