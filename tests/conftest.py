"""Shared test setup: make the repository root importable (for ``app.components``)."""

from __future__ import annotations

import functools
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


@pytest.hookimpl(trylast=True)  # after -m/-k deselection, so the shards are even
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``OCTOPIPE_TEST_SHARD=i/n`` keeps every n-th test from the i-th (round robin over the
    collected order), so ``.ci/lanes.py`` can run the in-process tests in several processes at
    once."""
    spec = os.environ.get("OCTOPIPE_TEST_SHARD")
    if not spec:
        return
    try:
        i, n = (int(x) for x in spec.split("/"))
        if not 0 <= i < n:
            raise ValueError
    except ValueError:
        raise pytest.UsageError(
            f"OCTOPIPE_TEST_SHARD={spec!r}: expected i/n with 0 <= i < n, e.g. 0/2"
        ) from None
    keep = items[i::n]
    config.hook.pytest_deselected(items=[it for k, it in enumerate(items) if k % n != i])
    items[:] = keep
