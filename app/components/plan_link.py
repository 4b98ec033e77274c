"""A plan carried by a link: a compact, checked encoding for the URL's ``plan`` parameter.

The plan (partition, placement, per-device orders, name; no profile) is written as JSON,
deflated and base64url-encoded. In the orders an action omits its micro-batch when it is the
next one of its stage and kind on that device (``2F`` after ``2F4`` is ``2F5``; otherwise
``2F@7``), which is what makes links short: a ZB-V plan on 8 devices with 32 micro-batches
takes about 1,100 characters, on 16 devices with 64 about 2,900. Plans whose link would pass
:data:`MAX_LINK_CHARS` are shared as a file instead
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
import re
import zlib

from octopipe_core.errors import OctoPipeError
from octopipe_core.jsonio import loads_checked
from octopipe_core.plan import Action, Plan, plan_from_dict, validate_plan

MAX_LINK_CHARS = 6000  # longer links break in chats and some browsers: share a file
MAX_INFLATED_BYTES = 4 * 2**20
SRC = "URL parameter plan"
VERSION = 2
TOKEN = re.compile(r"^(\d{1,6})(BW|F|B|W)(?:@(\d{1,7}))?$")


def compact_row(actions: list[Action]) -> str:
    """One device's order with implicit micro-batches.

    >>> from octopipe_core.plan import parse_actions
    >>> compact_row(parse_actions("0F0 0F1 0B1 0F2"))
    '0F 0F 0B@1 0F'
    """
    nxt: dict[tuple[int, str], int] = {}
    out = []
    for a in actions:
        key = (a.stage, a.kind)
        out.append(f"{a.stage}{a.kind}" + ("" if a.mb == nxt.get(key, 0) else f"@{a.mb}"))
        nxt[key] = a.mb + 1
    return " ".join(out)


def expand_row(text: str, where: str) -> str:
    """The plan-file form (``0F0 0F1 ...``) of a compact row."""
    nxt: dict[tuple[str, str], int] = {}
    out = []
    for tok in text.split():
        m = TOKEN.match(tok)
        if m is None:
            raise _fail(f"{where}: {tok[:20]!r} is not an action")
        stage, kind, mb = m[1], m[2], m[3]
        n = int(mb) if mb is not None else nxt.get((stage, kind), 0)
        out.append(f"{stage}{kind}{n}")
        nxt[(stage, kind)] = n + 1
    return " ".join(out)


def encode(plan: Plan) -> str:
    """The plan as URL-safe text (no padding)."""
    d = plan.to_dict()
    d.pop("format", None)
    d["schedule"] = [compact_row(acts) for acts in plan.schedule]
    d["v"] = VERSION
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
    if not isinstance(data, dict) or data.pop("v", None) != VERSION:
        raise _fail("not a plan link (expected a plan object of this version)")
    rows = data.get("schedule")
    if not isinstance(rows, list) or not all(isinstance(r, str) for r in rows):
        raise _fail("not a plan link (schedule is not a list of rows)")
    data["schedule"] = [expand_row(r, f"schedule[{d}]") for d, r in enumerate(rows)]
    plan = plan_from_dict({"format": "octopipe.plan/v1", **data}, SRC)
    validate_plan(plan, num_layers, src=SRC)
    return plan
