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
    return OctoPipeError(f"{source}: field '{field}': {problem}; fix: {fix}")
