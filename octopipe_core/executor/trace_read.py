"""Read back the trace ``octopipe run`` writes (``JOB/out/trace_executed.json``, made by
``executor/trace.py:records_trace``): the executed op records, the DP reductions, step
syncs and optimizer steps, each step's span and the job's rank layout. No torch, no pandas.

Every field is checked (sizes, names, numbers; nothing in the file is executed) and every
problem is one ``OctoPipeError`` line naming the file, the field and the fix.

>>> import json
>>> from octopipe_core.executor.trace import records_trace
>>> records = [(0, 0, "0F0", 1.0, 1.5, 0.25), (1, 0, "1F0", 1.5, 2.0, 0.0)]
>>> raw = json.dumps(records_trace(records, tail=[(1, 0, "OPT", 2.0, 2.25)]))
>>> t = read_executed_trace(raw.encode(), "run.json")
>>> t.records[0], t.tail, t.step_spans, t.layout.pp, t.device_of(1)
((0, 0, '0F0', 0.25, 0.75, 0.25), [(1, 0, 'OPT', 1.25, 1.5)], {0: (0.0, 1.5)}, 2, (0, 1))
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from octopipe_core.errors import OctoPipeError, input_error
from octopipe_core.executor.mesh import JobLayout
from octopipe_core.jsonio import MAX_FILE_MIB, loads_checked

MAX_EVENTS = 400_000
MAX_RANKS = 4096
MAX_STEP = 10**6
COMPUTE = re.compile(r"^(\d{1,6})(BW|F|B|W)(\d{1,7})$")  # 2BW5: stage, kind, micro-batch
COMM = re.compile(r"^(\d{1,6})(SEND_F|SEND_B|RECV_F|RECV_B)(\d{1,7})$")
DP = re.compile(r"^(\d{1,6})DP$")  # a stage's DP gradient reduction
TAIL_NAMES = ("SYNC", "OPT")  # the step's small all-reduce, the optimizer step
LAYOUT_KEYS = ("pp", "dp", "zero1", "order", "mapping")
FIX = "use the trace_executed.json that `octopipe run` writes into JOB/out"

Record = tuple[int, int, str, float, float, float]
Tail = tuple[int, int, str, float, float]


@dataclass(frozen=True)
class ExecutedTrace:
    """What a run recorded; times in seconds from the trace's base (its ``ts`` 0)."""

    records: list[Record]  # (rank, step, op, start_s, end_s, wait_s), as result.json's
    tail: list[Tail]  # (rank, step, name, start_s, end_s): "<stage>DP", "SYNC", "OPT"
    step_spans: dict[int, tuple[float, float]]  # step -> (start_s, end_s)
    layout: JobLayout
    peak_memory_gib: list[float | None]  # per global rank; [] when the run measured none
    _coords: dict[int, tuple[int, int]] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        lay = self.layout
        self._coords.update({lay.rank(r, d): (r, d) for r in range(lay.dp) for d in range(lay.pp)})

    def device_of(self, rank: int) -> tuple[int, int]:
        """``(replica, device)`` of a global rank.

        >>> ExecutedTrace([], [], {}, JobLayout(pp=2, dp=2), []).device_of(1)
        (1, 0)
        """
        got = self._coords.get(rank)
        return got if got is not None else self.layout.coords(rank)


def _int(v: Any, hi: int) -> int | None:
    """``v`` if it is an integer in ``0..hi-1`` (not a bool), else None."""
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < hi:
        return None
    return v


def _number(v: Any, src: str, where: str, lo: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise input_error(src, where, f"got {str(v)[:30]!r}", "write a finite number")
    if not lo <= v <= 1e15:
        raise input_error(src, where, f"{v:g} is out of range", f"use {lo:g}..1e15 µs")
    return float(v)


def read_executed_trace(raw: bytes, src: str) -> ExecutedTrace:
    """Parse and check the bytes of a ``trace_executed.json`` (``src`` names it in errors).

    >>> read_executed_trace(b'{"traceEvents": []}', "run.json")
    Traceback (most recent call last):
    ...
    octopipe_core.errors.OctoPipeError: run.json: field 'traceEvents': no executed compute ops; ...
    """
    data = loads_checked(raw, src)
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise input_error(src, "<root>", "not a Chrome trace with traceEvents", FIX)
    other = data.get("otherData")
    if other is not None and not isinstance(other, dict):
        raise input_error(src, "otherData", "not an object", FIX)
    other = other or {}
    if other.get("source") == "simulated":
        raise input_error(src, "otherData.source", "this is the simulated trace", FIX)
    events = data["traceEvents"]
    if len(events) > MAX_EVENTS:
        raise input_error(src, "traceEvents", f"{len(events):,} events", f"at most {MAX_EVENTS:,}")
    ops: list[tuple[int, int, str, float, float]] = []
    seen: set[tuple[int, int, str]] = set()
    waits: dict[tuple[int, int, str], tuple[float, str]] = {}
    tail: list[Tail] = []
    spans: dict[int, tuple[float, float]] = {}
    first_at: dict[int, str] = {}  # rank -> where its first event is
    for i, ev in enumerate(events):
        where = f"traceEvents[{i}]"
        if not isinstance(ev, dict):
            raise input_error(src, where, "not an object", FIX)
        if ev.get("ph") != "X":
            continue  # metadata (process names) and other phases
        name, cat = ev.get("name"), ev.get("cat")
        pid = _int(ev.get("pid"), MAX_RANKS)
        if pid is None:
            got = str(ev.get("pid"))[:20]
            raise input_error(src, f"{where}.pid", f"got {got!r}", "a rank 0..4095")
        if not isinstance(name, str) or cat not in ("compute", "comm", "wait", "dp"):
            raise input_error(
                src, where, f"name {str(name)[:30]!r}, cat {str(cat)[:20]!r}",
                f"{FIX} (cat compute, comm, wait or dp)",
            )  # fmt: skip
        args = ev.get("args")
        step = _int(args.get("step") if isinstance(args, dict) else None, MAX_STEP)
        if step is None:
            raise input_error(src, f"{where}.args.step", "not a step 0..999999", FIX)
        ts = _number(ev.get("ts"), src, f"{where}.ts", -1e15)  # old traces: waits before 0
        end = ts + _number(ev.get("dur"), src, f"{where}.dur", 0.0)
        first_at.setdefault(pid, f"{where}.pid")
        lo, hi = spans.get(step, (ts, end))
        spans[step] = (min(lo, ts), max(hi, end))
        key = (pid, step, name.removeprefix("wait ") if cat == "wait" else name)
        if cat == "dp":
            if not (DP.match(name) or name in TAIL_NAMES):
                raise input_error(
                    src, f"{where}.name", f"{name[:30]!r} in cat dp",
                    "name a DP reduction '<stage>DP', 'SYNC' or 'OPT'",
                )  # fmt: skip
            tail.append((pid, step, name, ts / 1e6, end / 1e6))
            continue
        pattern = {"compute": COMPUTE, "comm": COMM}.get(cat)
        ok = pattern.match(name) if pattern else name.startswith("wait ") and (
            COMPUTE.match(key[2]) or COMM.match(key[2])
        )  # fmt: skip
        if not ok:
            raise input_error(src, f"{where}.name", f"{name[:30]!r} is not a plan action", FIX)
        if key in (waits if cat == "wait" else seen):
            raise input_error(
                src, f"{where}.name", f"{name[:30]!r} twice on rank {pid} in step {step}", FIX
            )
        if cat == "wait":
            waits[key] = ((end - ts) / 1e6, where)
        else:
            seen.add(key)
            ops.append((pid, step, name, ts / 1e6, end / 1e6))
    if not any(COMPUTE.match(op[2]) for op in ops):
        raise input_error(src, "traceEvents", "no executed compute ops", FIX)
    records: list[Record] = []
    for pid, step, name, start, end in ops:
        wait = waits.pop((pid, step, name), (0.0, ""))[0]
        records.append((pid, step, name, start, end, wait))
    if waits:
        (_, _, op), (_, where) = next(iter(waits.items()))
        raise input_error(src, f"{where}.name", f"a wait for {op!r}, which never ran", FIX)
    layout = _layout(other.get("layout"), max(first_at) + 1, src)
    for pid, where in first_at.items():
        if pid >= layout.world:
            raise input_error(
                src, where, f"rank {pid} is not in the {layout.label()} job of otherData.layout",
                FIX,
            )  # fmt: skip
    step_spans = _steps(other.get("steps"), spans, src)
    return ExecutedTrace(records, tail, step_spans, layout, _peaks(other, src))


def load_executed_trace(path: str | Path) -> ExecutedTrace:
    """``read_executed_trace`` of a file (refused unread past ``jsonio.MAX_FILE_MIB``).

    >>> load_executed_trace("no/such/trace.json")
    Traceback (most recent call last):
    ...
    octopipe_core.errors.OctoPipeError: no/such/trace.json: file not found; fix: ...
    """
    p = Path(path)
    if not p.is_file():
        raise OctoPipeError(f"{p}: file not found; fix: {FIX}")
    with p.open("rb") as f:
        raw = f.read(int(MAX_FILE_MIB * 2**20) + 1)  # loads_checked refuses one byte over
    return read_executed_trace(raw, str(p))


def _layout(raw: Any, ranks: int, src: str) -> JobLayout:
    """The run's ``otherData.layout``; a trace without one: one replica of ``ranks`` devices."""
    if raw is None:
        return JobLayout(pp=ranks)
    where = "otherData.layout"
    if not isinstance(raw, dict) or set(raw) - set(LAYOUT_KEYS):
        raise input_error(src, where, f"expected an object of {', '.join(LAYOUT_KEYS)}", FIX)
    pp, dp = _int(raw.get("pp"), MAX_RANKS + 1), _int(raw.get("dp", 1), MAX_RANKS + 1)
    if not pp or not dp or pp * dp > MAX_RANKS:
        raise input_error(
            src, where, f"pp {raw.get('pp')!r} x dp {raw.get('dp', 1)!r}",
            f"positive integers, at most {MAX_RANKS} ranks in all",
        )  # fmt: skip
    return JobLayout.from_dict(raw, pp, f"{src}: otherData")


def _steps(
    raw: Any, spans_us: dict[int, tuple[float, float]], src: str
) -> dict[int, tuple[float, float]]:
    """``otherData.steps`` (``[step, start_us, end_us]`` each) in seconds; a trace without
    it: each step from its first event's start to its last event's end."""
    if raw is None:
        return {s: (a / 1e6, b / 1e6) for s, (a, b) in sorted(spans_us.items())}
    where = "otherData.steps"
    if not isinstance(raw, list) or len(raw) > MAX_STEP:
        raise input_error(src, where, "not a list of [step, start_us, end_us]", FIX)
    out: dict[int, tuple[float, float]] = {}
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(item, list) or len(item) != 3:
            raise input_error(src, at, "not [step, start_us, end_us]", FIX)
        step = _int(item[0], MAX_STEP)
        if step is None or step in out:
            raise input_error(
                src, f"{at}[0]", f"step {str(item[0])[:20]!r}", "a new step 0..999999"
            )
        start = _number(item[1], src, f"{at}[1]", -1e15)
        end = _number(item[2], src, f"{at}[2]", start)
        out[step] = (start / 1e6, end / 1e6)
    missing = sorted(set(spans_us) - set(out))
    if missing:
        raise input_error(src, where, f"no span of step {missing[0]}", FIX)
    return dict(sorted(out.items()))


def _peaks(other: dict[str, Any], src: str) -> list[float | None]:
    """Each rank's measured peak memory (GiB; the CUDA allocator's, None for a CPU rank) from
    ``otherData.peak_memory_gib``; [] when the trace has none."""
    peaks = other.get("peak_memory_gib")
    if peaks is None:
        return []
    where = "otherData.peak_memory_gib"
    if not isinstance(peaks, list) or len(peaks) > MAX_RANKS:
        raise input_error(src, where, "not a list of ranks' peaks", FIX)
    out: list[float | None] = []
    for i, g in enumerate(peaks):
        ok = g is None or (not isinstance(g, bool) and isinstance(g, (int, float)))
        if not ok or (g is not None and not 0 <= g <= 1e5):
            raise input_error(src, f"{where}[{i}]", f"got {str(g)[:20]!r}", "0..100000 GiB or null")
        out.append(None if g is None else float(g))
    return out
