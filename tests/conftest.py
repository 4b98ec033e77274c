"""Shared test setup: the repository root importable (for ``app.components``), AppTest's
component scan done once, a short landing-page tune for the page tests, and shards that share
the tests out (``OCTOPIPE_TEST_CLAIMS``, used by ``.ci/lanes.py``)."""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _scan_installed_components_once() -> None:
    """Streamlit's AppTest rescans every installed package's metadata for v2 components on
    each run (about 0.4 s a run, 40 s over the app tests); the installed packages do not
    change during a test session, so scan once."""
    try:
        from streamlit.components.v2 import manifest_scanner
    except ImportError:  # an older Streamlit without v2 components
        return
    manifest_scanner.scan_component_manifests = functools.cache(
        manifest_scanner.scan_component_manifests
    )


_scan_installed_components_once()

QUICK_TUNE_S = 0.5  # the landing page's quick tune in the AppTest page tests (3 s in the app)


@pytest.fixture(autouse=True)
def _quick_landing_tune(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The AppTest page tests (``test_app*.py``, ``test_dash_*.py``) check the pages, not the
    tuner (``test_tuner_*.py`` does), and each opens the landing page in a fresh cache, which
    runs the quick tune again: give it 0.5 s instead of 3 s (about 25 s of the suite)."""
    if not request.path.name.startswith(("test_app", "test_dash_")):
        return
    from app.components import state

    monkeypatch.setattr(state, "AUTO_TUNE_BUDGET_S", QUICK_TUNE_S)


def _claim(folder: str, item: pytest.Item) -> bool:
    """Claim ``item`` for this process: True for the first process to ask, once."""
    name = hashlib.sha1(item.nodeid.encode()).hexdigest()
    try:
        os.close(os.open(os.path.join(folder, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    """With ``OCTOPIPE_TEST_CLAIMS=FOLDER``, several pytest processes started on the same tests
    share them out as they go: each runs the next test no other process has claimed (a file
    per test in FOLDER, created exclusively), so they end together whatever each test costs
    (``.ci/lanes.py`` runs the in-process tests this way). The next test is claimed before
    the current one runs, so fixtures are torn down knowing which test follows."""
    folder = os.environ.get("OCTOPIPE_TEST_CLAIMS")
    if not folder or session.config.option.collectonly:
        return None
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted(f"{session.testsfailed} errors during collection")
    items = session.items

    def next_claimed(start: int) -> int | None:
        return next((k for k in range(start, len(items)) if _claim(folder, items[k])), None)

    cur = next_claimed(0)
    while cur is not None:
        nxt = next_claimed(cur + 1)
        session.config.hook.pytest_runtest_protocol(
            item=items[cur], nextitem=items[nxt] if nxt is not None else None
        )
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)
        cur = nxt
    return True
