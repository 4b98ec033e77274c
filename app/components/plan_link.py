"""A plan carried by a link: a compact, checked encoding for the URL's ``plan`` parameter.

The plan (partition, placement, per-device orders, name; no profile) is written as JSON,
deflated and base64url-encoded. A hand-edited 8-device, 32-micro-batch plan takes about a
kilobyte; plans whose link would pass :data:`MAX_LINK_CHARS` are shared as a file instead
(download, then "Open a plan file" on the Plan page). Decoding never executes anything: the
text is size-checked before and after inflating, read with ``jsonio.loads_checked`` and
validated as a plan file would be.

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> from octopipe_core.schedules import build_plan
>>> prof = Profile.from_dict(example_profile_dict())
>>> plan = build_plan(prof, "zbv", 2, 4)
>>> text = encode(plan)
>>> decode(text, prof.num_layers).schedule == plan.schedule
True
>>> try:
...     decode("not a plan!", 4)
... except OctoPipeError as e:
...     print(str(e)[:58])
URL parameter plan: not a plan link (bad compressed data);
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib

from octopipe_core.errors import OctoPipeError
from octopipe_core.jsonio import loads_checked
from octopipe_core.plan import Plan, plan_from_dict, validate_plan

MAX_LINK_CHARS = 6000  # longer links break in chats and some browsers: share a file
MAX_INFLATED_BYTES = 4 * 2**20
SRC = "URL parameter plan"


def encode(plan: Plan) -> str:
    """The plan as URL-safe text (no padding)."""
    d = plan.to_dict()
    d.pop("format", None)
    raw = json.dumps(d, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(zlib.compress(raw, 9)).decode().rstrip("=")


def link_or_none(plan: Plan) -> str | None:
    """:func:`encode`, or None when the link would be longer than :data:`MAX_LINK_CHARS`."""
    text = encode(plan)
    return text if len(text) <= MAX_LINK_CHARS else None


def _fail(what: str) -> OctoPipeError:
    return OctoPipeError(
        f"{SRC}: {what}; fix: copy the whole link again, or share the plan as a file "
        "(download it, then 'Open a plan file' on the Plan page)"
    )


def decode(text: str, num_layers: int) -> Plan:
    """The plan of a link, validated for a profile of ``num_layers`` layers."""
    if len(text) > 4 * MAX_LINK_CHARS:
        raise _fail(f"{len(text):,} characters is over the {4 * MAX_LINK_CHARS:,} limit")
    try:
        packed = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise _fail("not a plan link (bad base64)") from None
    z = zlib.decompressobj()
    try:
        raw = z.decompress(packed, MAX_INFLATED_BYTES)
    except zlib.error:
        raise _fail("not a plan link (bad compressed data)") from None
    if z.unconsumed_tail:
        raise _fail(f"inflates past {MAX_INFLATED_BYTES // 2**20} MiB")
    data = loads_checked(raw, SRC)
    if not isinstance(data, dict):
        raise _fail("not a plan link (expected a plan object)")
    plan = plan_from_dict({"format": "octopipe.plan/v1", **data}, SRC)
    validate_plan(plan, num_layers, src=SRC)
    return plan
