"""``.ci/lanes.py`` runs every test exactly once: its three marker expressions split every
combination of the suite's markers."""

from __future__ import annotations

import importlib.util
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

ROOT = Path(__file__).resolve().parent.parent


def _lanes() -> object:
    spec = importlib.util.spec_from_file_location("lanes", ROOT / ".ci" / "lanes.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _selects(expr: str, marked: set[str]) -> bool:
    return Expression.compile(expr).evaluate(lambda name, **_: name in marked)


def test_lanes_select_every_test_exactly_once() -> None:
    lanes = _lanes()
    exprs = [lanes.IN_PROCESS, lanes.BESIDE, lanes.ALONE]  # type: ignore[attr-defined]
    markers = ("dist", "e2e", "wheel")
    for bits in itertools.product((False, True), repeat=len(markers)):
        marked = {m for m, on in zip(markers, bits, strict=True) if on}
        hits = [e for e in exprs if _selects(e, marked)]
        assert len(hits) == 1, (marked, hits)


def test_every_marker_of_the_suite_is_one_the_lanes_know() -> None:
    """The markers declared in pyproject.toml are the three the lanes split on (a new marker
    must be placed in a lane)."""
    text = (ROOT / "pyproject.toml").read_text()
    block = text[text.index("markers = [") :].split("]", 1)[0]
    names = {line.strip().strip('"').split(":")[0] for line in block.splitlines()[1:]}
    assert names - {""} == {"dist", "e2e", "wheel"}, names


def test_fast_lane_runs_only_the_in_process_shards_in_the_foreground(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--fast`` keeps the in-process shards (sharing one claims folder) and drops the
    multi-process, browser and wheel jobs; a whole run has all three lanes, only the
    multi-process one in the foreground."""
    lanes = _lanes()
    jobs, background = lanes.plan_jobs("CLAIMS", fast=True)  # type: ignore[attr-defined]
    assert background == set() and len(jobs) == lanes.SHARDS >= 2  # type: ignore[attr-defined]
    for args, env in jobs.values():
        assert args[args.index("-m") + 1] == lanes.IN_PROCESS  # type: ignore[attr-defined]
        assert env == {"OCTOPIPE_TEST_CLAIMS": "CLAIMS"}
    jobs, background = lanes.plan_jobs("CLAIMS")  # type: ignore[attr-defined]
    exprs = {args[args.index("-m") + 1] for args, _ in jobs.values()}
    assert exprs == {lanes.IN_PROCESS, lanes.BESIDE, lanes.ALONE}  # type: ignore[attr-defined]
    assert set(jobs) - background == {"processes"}
    assert lanes.main(["--fast", "-x"]) == 2  # type: ignore[attr-defined]
    assert "--fast takes no other argument" in capsys.readouterr().err


def test_shards_share_the_tests_out_without_loss_or_overlap(tmp_path: Path) -> None:
    """Three pytest processes on the same tests with one claims folder (as ``.ci/lanes.py``
    starts the in-process shards) run every test exactly once between them, and a slow test
    does not hold the others back: the first test waits (up to 60 s) until other processes
    have run 12 of the rest, which only happens if they claim tests as they go."""
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "test_many.py").write_text(
        "import os, time\n"
        "import pytest\n"
        "def others(path):\n"
        "    rows = open(path).read().split() if os.path.exists(path) else []\n"
        "    return sum(pid != str(os.getpid()) for pid in rows[1::2])\n"
        "@pytest.mark.parametrize('k', range(24))\n"
        "def test_one(k):\n"
        "    deadline = time.monotonic() + 60\n"
        "    while k == 0 and others(os.environ['RAN']) < 12 and time.monotonic() < deadline:\n"
        "        time.sleep(0.05)\n"
        "    with open(os.environ['RAN'], 'a') as f:\n"
        "        f.write(f'{k} {os.getpid()}\\n')\n"
    )
    claims = tmp_path / "claims"
    claims.mkdir()
    ran = tmp_path / "ran.txt"
    env = {**os.environ, "OCTOPIPE_TEST_CLAIMS": str(claims), "RAN": str(ran)}
    env.pop("PYTEST_ADDOPTS", None)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_many.py"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(3)
    ]
    assert [proc.wait(timeout=120) for proc in procs] == [0, 0, 0]
    rows = [line.split() for line in ran.read_text().splitlines()]
    assert sorted(int(k) for k, _ in rows) == list(range(24))  # each test once
    assert len(list(claims.iterdir())) == 24
    slow_pid = next(pid for k, pid in rows if k == "0")
    assert sum(pid != slow_pid for _, pid in rows) >= 12  # the others took most of the rest


def test_a_failing_or_empty_job_fails_the_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs run at once; each one's exit code comes back, and any non-zero one fails the run
    (pytest exits 5 when a lane selects no test)."""
    monkeypatch.delenv("OCTOPIPE_TEST_CLAIMS", raising=False)  # set when this runs in a shard
    lanes = _lanes()
    here = "tests/test_lanes.py"
    codes = lanes.run_together(  # type: ignore[attr-defined]
        {
            "ok": ([here, "-k", "every_marker"], {}),
            "empty": ([here, "-k", "no_such_test"], {}),
        }
    )
    assert codes == {"ok": 0, "empty": 5}
    out = capsys.readouterr()
    assert "[ok] " in out.out and "== empty: exit 5" in out.out
    assert lanes.failed(codes) == 1 and "== FAILED: empty" in capsys.readouterr().err  # type: ignore[attr-defined]
    assert lanes.failed({"ok": 0}) == 0  # type: ignore[attr-defined]


def test_background_jobs_run_at_idle_priority(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs named in ``background`` (and their children) run under ``SCHED_IDLE``, so the
    multi-process tests in the foreground never wait for them; the others keep the normal
    policy. Every job may write compiled bytecode, even when the shell forbids it."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    if not hasattr(os, "SCHED_IDLE"):
        pytest.skip("SCHED_IDLE is Linux-only; elsewhere background jobs get nice 19")
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "import os, subprocess, sys\n"
        "def test_idle():\n"
        "    child = 'import os; print(os.sched_getscheduler(0))'\n"
        "    out = subprocess.run([sys.executable, '-c', child], capture_output=True, text=True)\n"
        "    assert os.sched_getscheduler(0) == int(out.stdout) == os.SCHED_IDLE\n"
        "    assert not sys.dont_write_bytecode\n"
    )
    codes = _lanes().run_together(  # type: ignore[attr-defined]
        {"bg": ([str(probe)], {}), "fg": ([str(probe)], {})}, background={"bg"}
    )
    assert codes == {"bg": 0, "fg": 1}
