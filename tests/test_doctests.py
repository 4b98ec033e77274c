"""The runnable examples in the library's docstrings stay true."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import octopipe_core

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(octopipe_core.__path__, "octopipe_core.")
    if not m.name.endswith("__main__")
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
