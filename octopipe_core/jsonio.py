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
x.json: field '<file>': nested 100 levels deep (limit 32); fix: flatten the JSON
"""

from __future__ import annotations

import json
import math
from typing import Any

from octopipe_core.errors import input_error

MAX_FILE_MIB = 64.0  # larger inputs are refused before parsing
MAX_DEPTH = 32  # no OctoPipe file nests deeper than about 6
MAX_INT_DIGITS = 18  # every integer field fits in 64 bits


def _depth(text: str) -> int:
    depth = best = 0
    in_str = esc = False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            best = max(best, depth)
        elif ch in "]}":
            depth -= 1
    return best


def _parse_int(s: str) -> int:
    if len(s.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"integer with {len(s.lstrip('-'))} digits")
    return int(s)


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-standard number {name}")


def _check_text(obj: Any, src: str) -> None:
    stack: list[tuple[Any, str]] = [(obj, "<root>")]
    while stack:
        o, where = stack.pop()
        if isinstance(o, str):
            try:
                o.encode("utf-8")
            except UnicodeEncodeError:
                raise input_error(
                    src, where, "text with an unpaired surrogate (\\ud800-\\udfff)",
                    "write valid Unicode text",
                ) from None  # fmt: skip
        elif isinstance(o, dict):
            for k, v in o.items():
                stack.append((k, where))
                stack.append((v, k if where == "<root>" else f"{where}.{k}"))
        elif isinstance(o, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(o))
        elif isinstance(o, float) and not math.isfinite(o):
            raise input_error(src, where, f"got {o}", "write a finite number")


def loads_checked(raw: bytes | str, src: str) -> Any:
    """Parse JSON from an untrusted source; one-line ``OctoPipeError`` on any problem.

    Refuses files over ``MAX_FILE_MIB``, non-UTF-8 bytes, syntax errors (with line and
    column), nesting deeper than ``MAX_DEPTH``, integers of more than ``MAX_INT_DIGITS``
    digits, ``NaN``/``Infinity`` and numbers that overflow to infinity, and unpaired
    surrogates in any string.
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
    depth = _depth(text)
    if depth > MAX_DEPTH:
        raise input_error(
            src, "<file>", f"nested {depth} levels deep (limit {MAX_DEPTH})", "flatten the JSON"
        )
    try:
        data = json.loads(text, parse_int=_parse_int, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise input_error(
            src, "<file>", f"invalid JSON at line {e.lineno}, column {e.colno} ({e.msg})",
            "fix the JSON syntax",
        ) from None  # fmt: skip
    except ValueError as e:
        raise input_error(src, "<file>", str(e), "write plain finite numbers") from None
    except RecursionError:
        raise input_error(src, "<file>", "nested too deeply", "flatten the JSON") from None
    _check_text(data, src)
    return data
