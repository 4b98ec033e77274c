"""User-facing errors.

Every problem with user input is reported as one line that names the file, the field and
what would fix it, in the spirit of torchtitan's error messages.
"""

from __future__ import annotations


class OctoPipeError(ValueError):
    """A one-line, user-facing error about bad input (a profile, a plan or an option)."""


def input_error(source: str, field: str, problem: str, fix: str) -> OctoPipeError:
    """Build the standard one-line error.

    >>> str(input_error("p.json", "layers[3]", "unknown layer type 'mamba'", "define it"))
    "p.json: field 'layers[3]': unknown layer type 'mamba'; fix: define it"
    """
    return OctoPipeError(
        f"{_clean(source, 200)}: field '{_clean(field, 120)}': {_clean(problem, 500)}; fix: {fix}"
    )


def _clean(text: str, limit: int) -> str:
    r"""``text`` from a file, fit for one line: control characters (a newline, a terminal
    escape) written as escapes, and at most ``limit`` characters.

    >>> _clean("a\nb\x1b[2J", 80), _clean("k" * 50, 10)
    ('a\\nb\\x1b[2J', 'kkkkkkk...')
    """
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))
    return out if len(out) <= limit else out[: limit - 3] + "..."
