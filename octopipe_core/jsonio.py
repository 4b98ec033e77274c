"""Reading untrusted JSON: size, syntax, nesting and text checked before any field is parsed.

Every file OctoPipe reads (profiles, plans, clusters, job configs, uploads) goes through
:func:`loads_checked`, so a hostile file gets one line naming the file and the fix instead of a
``RecursionError``, a ``UnicodeEncodeError`` much later when a name is printed, or a hang.

>>> loads_checked(b'{"a": [1, 2]}', "x.json")
{'a': [1, 2]}
>>> try:
...     loads_checked(b'[' * 100 + b']' * 100, "x.json")
... except ValueError as e:
...     print(e)
x.json: field '<file>': nested over 32 levels deep; fix: flatten the JSON
"""

from __future__ import annotations

import json
import math
from typing import Any

from octopipe_core.errors import input_error

MAX_FILE_MIB = 64.0  # larger inputs are refused before parsing
MAX_DEPTH = 32  # no OctoPipe file nests deeper than about 6
MAX_INT_DIGITS = 18  # every integer field fits in 64 bits


def _parse_int(s: str) -> int:
    if len(s.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"integer with {len(s.lstrip('-'))} digits")
    return int(s)


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-standard number {name}")


def _check_tree(obj: Any, src: str) -> None:
    """One iterative walk: nesting depth, unpaired surrogates, numbers that overflowed. A
    value's field name is only spelled out when it is reported."""
    stack: list[tuple[Any, Any, int]] = [(obj, (), 0)]
    while stack:
        o, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise input_error(
                src, "<file>", f"nested over {MAX_DEPTH} levels deep", "flatten the JSON"
            )
        if isinstance(o, str):
            try:
                o.encode("utf-8")
            except UnicodeEncodeError:
                raise input_error(
                    src, _field(path), "text with an unpaired surrogate (\\ud800-\\udfff)",
                    "write valid Unicode text",
                ) from None  # fmt: skip
        elif isinstance(o, dict):
            for k, v in o.items():
                stack.append((k, path, depth))
                stack.append((v, (path, k), depth + 1))
        elif isinstance(o, list):
            stack.extend((v, (path, i), depth + 1) for i, v in enumerate(o))
        elif isinstance(o, float) and not math.isfinite(o):
            raise input_error(src, _field(path), f"got {o}", "write a finite number")


def _field(path: Any) -> str:
    """``(((), "a"), 3)`` -> ``"a[3]"``."""
    parts: list[Any] = []
    while path:
        path, key = path
        parts.append(key)
    out = ""
    for key in reversed(parts):
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out or "<root>"


def loads_checked(raw: bytes | str, src: str) -> Any:
    """Parse JSON from an untrusted source; one-line ``OctoPipeError`` on any problem.

    Refuses files over ``MAX_FILE_MIB``, non-UTF-8 bytes, syntax errors (with line and
    column), nesting deeper than ``MAX_DEPTH``, integers of more than ``MAX_INT_DIGITS``
    digits, ``NaN``/``Infinity`` and numbers that overflow to infinity, unpaired surrogates
    in any string, and a key given twice in one object.
    """
    size_mib = len(raw) / 2**20
    if size_mib > MAX_FILE_MIB:
        raise input_error(
            src, "<file>", f"{size_mib:.0f} MiB is over the {MAX_FILE_MIB:.0f} MiB limit",
            "give a smaller file (a profile lists layer types once and layers by name)",
        )  # fmt: skip
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise input_error(src, "<file>", "not UTF-8 text", "give a UTF-8 JSON file") from None
    else:
        text = raw
    overflow: list[str] = []

    def parse_float(t: str) -> float:
        v = float(t)
        if not math.isfinite(v):
            overflow.append(t)
        return v

    dup: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(items)
        if len(out) != len(items) and not dup:  # a key given twice: which one was meant?
            seen: set[str] = set()
            for k, _ in items:
                if k in seen:
                    dup.append(k)
                    break
                seen.add(k)
        return out

    try:
        data = json.loads(
            text, parse_int=_parse_int, parse_float=parse_float, parse_constant=_reject_constant,
            object_pairs_hook=pairs,
        )  # fmt: skip
    except json.JSONDecodeError as e:
        raise input_error(
            src, "<file>", f"invalid JSON at line {e.lineno}, column {e.colno} ({e.msg})",
            "fix the JSON syntax",
        ) from None  # fmt: skip
    except ValueError as e:
        raise input_error(src, "<file>", str(e), "write plain finite numbers") from None
    except RecursionError:
        raise input_error(src, "<file>", "nested too deeply", "flatten the JSON") from None
    if dup:
        raise input_error(
            src, dup[0], "given twice in one object", "keep one of them (JSON keeps the last)"
        )
    if _max_depth(data) > MAX_DEPTH or overflow or not _encodes(data):
        _check_tree(data, src)  # the slow walk names the field
    return data


def _encodes(data: Any) -> bool:
    """No unpaired surrogate anywhere (the C encoder checks every string at once)."""
    try:
        json.dumps(data, ensure_ascii=False, check_circular=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _max_depth(data: Any) -> int:
    """Nesting depth, visiting containers only."""
    best, stack = 0, [(data, 0)]
    while stack:
        o, d = stack.pop()
        if d > best:
            best = d
        items = o.values() if isinstance(o, dict) else o
        stack.extend((v, d + 1) for v in items if isinstance(v, (dict, list)))
    return best if isinstance(data, (dict, list)) else 0
