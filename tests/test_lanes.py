"""``.ci/lanes.py`` runs every test exactly once: its three marker expressions split every
combination of the suite's markers."""

from __future__ import annotations

import importlib.util
import itertools
import os
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


class _Hooks:
    def __init__(self) -> None:
        self.deselected: list[object] = []

    def pytest_deselected(self, items: list[object]) -> None:
        self.deselected += items


class _Config:
    def __init__(self) -> None:
        self.hook = _Hooks()


def test_shards_split_the_selected_tests_without_loss_or_overlap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from conftest import pytest_collection_modifyitems as shard

    whole = [f"t{k}" for k in range(23)]
    parts = []
    for i in range(3):
        monkeypatch.setenv("OCTOPIPE_TEST_SHARD", f"{i}/3")
        items, config = list(whole), _Config()
        shard(config, items)  # type: ignore[arg-type]
        assert sorted(items + config.hook.deselected) == sorted(whole)  # the rest is reported
        parts.append(items)
    assert sorted(t for p in parts for t in p) == sorted(whole)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    for bad in ("3/3", "1", "a/b", "-1/2"):
        monkeypatch.setenv("OCTOPIPE_TEST_SHARD", bad)
        with pytest.raises(pytest.UsageError, match="expected i/n with 0 <= i < n"):
            shard(_Config(), list(whole))  # type: ignore[arg-type]


def test_a_failing_or_empty_job_fails_the_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs run at once; each one's exit code comes back, and any non-zero one fails the run
    (pytest exits 5 when a lane selects no test)."""
    monkeypatch.delenv("OCTOPIPE_TEST_SHARD", raising=False)  # set when this runs in a shard
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


def test_background_jobs_run_at_idle_priority(tmp_path: Path) -> None:
    """Jobs named in ``background`` (and their children) run under ``SCHED_IDLE``, so the
    multi-process tests in the foreground never wait for them; the others keep the normal
    policy."""
    if not hasattr(os, "SCHED_IDLE"):
        pytest.skip("SCHED_IDLE is Linux-only; elsewhere background jobs get nice 19")
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "import os, subprocess, sys\n"
        "def test_idle():\n"
        "    child = 'import os; print(os.sched_getscheduler(0))'\n"
        "    out = subprocess.run([sys.executable, '-c', child], capture_output=True, text=True)\n"
        "    assert os.sched_getscheduler(0) == int(out.stdout) == os.SCHED_IDLE\n"
    )
    codes = _lanes().run_together(  # type: ignore[attr-defined]
        {"bg": ([str(probe)], {}), "fg": ([str(probe)], {})}, background={"bg"}
    )
    assert codes == {"bg": 0, "fg": 1}
