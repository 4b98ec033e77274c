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
