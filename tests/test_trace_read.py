"""Reading back executed traces (``executor/trace_read.py``): what ``records_trace`` writes
comes back as the same records, tail, step spans and layout; hostile or foreign traces are
one-line errors; and the trace of a real ``octopipe run`` (DP 1 and DP 2) holds every op of
the plan on the right device, as result.json does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from octopipe_core.errors import OctoPipeError
from octopipe_core.executor.mesh import JobLayout
from octopipe_core.executor.trace import records_trace
from octopipe_core.executor.trace_read import (
    COMPUTE,
    load_executed_trace,
    read_executed_trace,
)
from tests.dash_helpers import real_run

RECORDS = [  # (rank, step, op, start_s, end_s, wait_s) on two replicas of a 2-device pipeline
    (0, 3, "0F0", 100.0, 100.25, 0.0),
    (0, 3, "0SEND_F0", 100.25, 100.3, 0.0),
    (2, 3, "1RECV_F0", 100.1, 100.3, 0.125),
    (2, 3, "1F0", 100.3, 100.5, 0.0),
    (2, 3, "1BW0", 100.5, 101.0, 0.0),
    (1, 3, "0F0", 100.0, 100.2, 0.0),
    (3, 3, "1F0", 100.4, 100.6, 0.1),
    (0, 4, "0F0", 102.0, 102.25, 0.5),
]
TAIL = [(0, 3, "0DP", 101.0, 101.1), (2, 3, "SYNC", 101.1, 101.2), (0, 3, "OPT", 101.2, 101.3)]
LAYOUT = JobLayout(pp=2, dp=2)


def _same(got: list[tuple[Any, ...]], want: list[tuple[Any, ...]], shift: float) -> None:
    """Equal but for times, which are ``shift`` s earlier, up to float rounding (1e-9 s)."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g[:3] == w[:3]  # rank, step, op or name
        assert g[3] == pytest.approx(w[3] - shift, abs=1e-9)
        assert g[4] == pytest.approx(w[4] - shift, abs=1e-9)
        assert g[5:] == pytest.approx(w[5:], abs=1e-9)


def test_records_trace_reads_back_as_the_same_records() -> None:
    steps = [(3, 99.5, 101.5), (4, 101.5, 102.5)]
    peaks = [10.0, None, 12.5, 11.0]
    trace = records_trace(RECORDS, tail=TAIL, peak_memory_gib=peaks, layout=LAYOUT, steps=steps)
    t = read_executed_trace(json.dumps(trace).encode(), "run.json")
    base = 99.5  # the earliest step start comes before every op and wait
    _same(t.records, RECORDS, base)
    _same(t.tail, TAIL, base)
    assert t.layout == LAYOUT and t.peak_memory_gib == peaks
    assert t.step_spans == {3: pytest.approx((0.0, 2.0)), 4: pytest.approx((2.0, 3.0))}
    assert [t.device_of(r) for r in range(4)] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    # a layout with an explicit mapping and ZeRO-1 comes back as it was
    mapped = JobLayout(pp=2, dp=2, zero1=True, mapping=((3, 1), (0, 2)))
    again = read_executed_trace(json.dumps(records_trace(RECORDS, layout=mapped)).encode(), "r")
    assert again.layout == mapped and again.device_of(3) == (0, 0)


def test_a_trace_without_layout_or_steps_is_one_pipeline() -> None:
    one = [(r, s, op, a, b, w) for r, s, op, a, b, w in RECORDS if r < 2]  # ranks 0, 1
    trace = records_trace(one)
    del trace["otherData"]["steps"]  # as traces written before the steps were kept
    t = read_executed_trace(json.dumps(trace).encode(), "old.json")
    assert t.layout == JobLayout(pp=2) and t.tail == [] and t.peak_memory_gib == []
    base = 100.0
    _same(t.records, one, base)
    spans = {3: pytest.approx((0.0, 0.3)), 4: pytest.approx((1.5, 2.25))}
    assert t.step_spans == spans  # each step's first to last event


def _trace(**change: Any) -> dict[str, Any]:
    trace = records_trace(RECORDS, tail=TAIL, layout=LAYOUT)
    trace["otherData"].update(change)
    return trace


def _event(**ev: Any) -> dict[str, Any]:
    base = {"ph": "X", "name": "0F0", "cat": "compute", "pid": 0, "ts": 1, "dur": 1}
    return {**base, "args": {"step": 0}, **ev}


@pytest.mark.parametrize(
    ("trace", "needle"),
    [
        ({"traceEvents": [_event(cat="dp", name="0XDP")]}, "traceEvents[0].name"),
        ({"traceEvents": [_event(cat="gpu")]}, "cat 'gpu'"),
        ({"traceEvents": [_event(), _event()]}, "twice on rank 0"),
        ({"traceEvents": [_event(), _event(cat="wait", name="wait 0B0")]}, "never ran"),
        ({"traceEvents": [_event(dur=-1)]}, "traceEvents[0].dur"),
        ({"traceEvents": [_event(args={"step": True})]}, "args.step"),
        ({"traceEvents": [_event(cat="comm")]}, "not a plan action"),
        ({"traceEvents": [_event()], "otherData": []}, "otherData"),
        (_trace(layout={"pp": 2, "dp": 2, "tp": 8}), "otherData.layout"),
        (_trace(layout={"pp": 0}), "otherData.layout"),
        (_trace(layout={"pp": 2, "dp": 9999}), "at most 4096 ranks"),
        (_trace(layout={"pp": 2, "dp": 2, "order": "x"}), "layout.order"),
        (_trace(layout={"pp": 2, "dp": 1}), "rank 2 is not in the PP2 x DP1 job"),
        (_trace(steps=[[3, 0, 1]]), "no span of step 4"),
        (_trace(steps=[[3, 5, 1], [4, 0, 9]]), "otherData.steps[0][2]"),
        (_trace(steps=[[3, 0, 1], [3, 0, 1]]), "otherData.steps[1][0]"),
        (_trace(steps={"3": 1}), "otherData.steps"),
        (_trace(peak_memory_gib=[1, "x"]), "peak_memory_gib[1]"),
        (_trace(source="simulated"), "simulated trace"),
    ],
)
def test_bad_traces_are_one_line_errors(trace: dict[str, Any], needle: str) -> None:
    with pytest.raises(OctoPipeError) as e:
        read_executed_trace(json.dumps(trace).encode(), "run.json")
    msg = str(e.value)
    assert msg.startswith("run.json") and needle in msg and "fix:" in msg and "\n" not in msg


def test_load_reads_a_file_and_names_a_missing_one(tmp_path: Path) -> None:
    path = tmp_path / "trace_executed.json"
    path.write_text(json.dumps(records_trace(RECORDS, layout=LAYOUT)))
    assert load_executed_trace(path).records == read_executed_trace(path.read_bytes(), "x").records
    with pytest.raises(OctoPipeError, match="file not found"):
        load_executed_trace(tmp_path / "none.json")


def test_the_reader_imports_without_torch_or_pandas() -> None:
    code = (
        "import sys, octopipe_core.executor.trace_read; "
        "assert not {'torch', 'pandas'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ---- the trace of a real run -----------------------------------------------------------------
@pytest.mark.dist
@pytest.mark.timeout(300)
@pytest.mark.parametrize("dp", [1, 2])
def test_a_real_runs_trace_has_every_op_of_the_plan(tmp_path: Path, dp: int) -> None:
    plan, job = real_run(tmp_path, dp=dp, steps=2)
    t = load_executed_trace(job / "out" / "trace_executed.json")
    res = json.loads((job / "out" / "result.json").read_text())
    assert t.layout == JobLayout.from_dict(res["layout"], plan.num_devices)
    assert (t.layout.pp, t.layout.dp) == (plan.num_devices, dp)
    steps = [res["start_step"] + i for i in range(len(res["step_ms"]))]
    assert sorted(t.step_spans) == steps == [0, 1]
    for replica in range(dp):
        for d in range(plan.num_devices):
            rank = t.layout.rank(replica, d)
            assert t.device_of(rank) == (replica, d)
            stages = {s for s, dev in enumerate(plan.placement) if dev == d}
            for step in steps:
                mine = [r[2] for r in t.records if r[:2] == (rank, step)]
                ran = sorted(op for op in mine if COMPUTE.match(op))
                assert ran == sorted(str(a) for a in plan.schedule[d]), (rank, step)
                names = [x[2] for x in t.tail if x[:2] == (rank, step)]
                assert names.count("SYNC") == 1 and names.count("OPT") == 1, (rank, step, names)
                reduced = {n for n in names if n.endswith("DP")}
                if dp > 1:
                    assert reduced == {f"{s}DP" for s in stages}
                else:
                    assert reduced <= {f"{s}DP" for s in stages}
    # the same op records and step spans as result.json, on the trace's time base
    base = min(
        [r[3] - r[5] for r in res["records"]] + [x[3] for x in res["tail"]] + res["step_starts"]
    )
    assert len(t.records) == len(res["records"])
    for got, want in zip(t.records, res["records"], strict=True):
        assert list(got[:3]) == want[:3]
        assert got[3:] == pytest.approx((want[3] - base, want[4] - base, want[5]), abs=1e-6)
    assert [x[:3] for x in t.tail] == [tuple(x[:3]) for x in res["tail"]]
    for step, start, ms in zip(steps, res["step_starts"], res["step_ms"], strict=True):
        assert t.step_spans[step] == pytest.approx(
            (start - base, start - base + ms / 1e3), abs=1e-6
        )
