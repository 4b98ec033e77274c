"""Bounded argument types for the command line: every number a flag takes is checked by
argparse itself, so ``--memory-gib nan``, ``--chunks 0`` or ``--devices 0`` stop at once with
one line that names the flag and the valid range, before any work starts.

>>> int_in(1, 8)("3"), float_in(0, 10, lo_open=True)("2.5")
(3, 2.5)
>>> float_in(0, 10, lo_open=True)("nan")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: 'nan' is not a finite number; use a number in (0, 10]
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def int_in(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse ``type=`` that accepts integers in ``lo..hi``."""

    def parse(text: str) -> int:
        try:
            v = int(text.strip()) if len(text) < 20 else None
        except ValueError:
            v = None
        if v is None:
            raise argparse.ArgumentTypeError(
                f"{text[:24]!r} is not an integer; use an integer in {lo:,}..{hi:,}"
            )
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{v:,} is out of range; use {lo:,}..{hi:,}")
        return v

    parse.__name__ = "integer"
    return parse


def float_in(lo: float, hi: float, *, lo_open: bool = False) -> Callable[[str], float]:
    """An argparse ``type=`` that accepts finite numbers in ``[lo, hi]`` (``(lo, hi]``)."""
    span = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text[:24]!r} is not a number; use a number in {span}"
            ) from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(
                f"{text[:24]!r} is not a finite number; use a number in {span}"
            )
        if v < lo or (lo_open and v == lo) or v > hi:
            raise argparse.ArgumentTypeError(f"{v:g} is out of range; use a number in {span}")
        return v

    parse.__name__ = "number"
    return parse


DEVICES = int_in(1, 1024)
MICROBATCHES = int_in(1, 65_536)
CHUNKS = int_in(1, 64)
MEMORY_GIB = float_in(0, 1e5, lo_open=True)
TIME_BUDGET_S = float_in(0, 7 * 86_400, lo_open=True)
SEED = int_in(0, 2**31 - 1)
COUNT = int_in(1, 10**6)
STEPS = int_in(1, 10**9)
STEPS0 = int_in(0, 10**9)
WARMUP = int_in(0, 10**6)
JOB_TIMEOUT_S = float_in(0, 7 * 86_400, lo_open=True)
PEER_TIMEOUT_S = float_in(0, 86_400, lo_open=True)
NONNEG = float_in(0, 1e6)


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (the usage is in ``--help``)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}; fix: see `{self.prog} --help`\n")
