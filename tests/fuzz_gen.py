"""Seeded generators of hostile inputs for tests/test_fuzz.py: profiles, plans, cluster files
and command lines, each a small mutation of a valid input (one field replaced by a value from
``HOSTILE``, or a structural change), so that every case reaches a different check."""

from __future__ import annotations

import copy
import json
import random
import re
from collections.abc import Iterator
from typing import Any

HOSTILE: list[Any] = [
    10**400, 1e200, 1e308, -1, 0, -0.0, 5e-324, 1e-320, 2**63, 1.5, True, None, "x", "",
    "\ud800", "9" * 5000, [], {}, [[-1, -1]], {"a": 1}, "0F0", [1, 2],
]  # fmt: skip
DEEP = "@deep@"
FLAG_VALUES = ["0", "-5", "nan", "inf", "-inf", "1e400", "1e9", "abc", "", "3.5", "9" * 40]


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield (*prefix, k)
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:6]):
            yield (*prefix, i)
            yield from _paths(v, (*prefix, i))


def mutate(doc: dict[str, Any], rng: random.Random) -> tuple[dict[str, Any], str]:
    """One hostile change to a copy of ``doc``; returns it and a description."""
    d = copy.deepcopy(doc)
    roll = rng.random()
    if roll < 0.08:
        depth = rng.choice([40, 3000])
        d["meta" if "schedule" in d else "source"] = f"{DEEP}{depth}"
        return d, f"nesting {depth} deep"
    if roll < 0.14 and isinstance(d.get("layers"), list):
        d["layers"] = d["layers"] * rng.choice([0, 500])
        return d, f"layers x{len(d['layers'])}"
    paths = list(_paths(d))
    path = rng.choice(paths)
    target = d
    for k in path[:-1]:
        target = target[k]
    value = rng.choice(HOSTILE)
    if rng.random() < 0.15 and isinstance(target, dict):
        del target[path[-1]]
        return d, f"drop {'.'.join(map(str, path))}"
    target[path[-1]] = value
    return d, f"{'.'.join(map(str, path))} = {str(value)[:30]!r}"


def dumps(doc: dict[str, Any]) -> bytes:
    """JSON bytes as a hostile writer makes them (NaN/Infinity and lone surrogates kept)."""
    text = json.dumps(doc, allow_nan=True, ensure_ascii=True)
    m = re.search(f'"{DEEP}(\\d+)"', text)
    if m:  # json.dumps itself cannot write deep nesting
        n = int(m.group(1))
        text = text[: m.start()] + "[" * n + "1" + "]" * n + text[m.end() :]
    return text.encode("utf-8", "surrogatepass")


def flag_case(rng: random.Random, flags: dict[str, list[str]]) -> tuple[str, list[str]]:
    """A command line with one numeric flag set to a hostile value."""
    cmd = rng.choice(sorted(flags))
    flag = rng.choice(flags[cmd])
    return cmd, [flag, rng.choice(FLAG_VALUES)]
