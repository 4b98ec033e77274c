"""Unit tests of the dashboard's pure helpers: figures, plan edits, diffs, adapters."""

from __future__ import annotations

import json
import zipfile
from io import BytesIO
from typing import Any

import numpy as np
import pandas as pd
import pytest

from app.components import analysis, charts, exporting, tuning
from app.components.analysis import Settings
from octopipe_core.errors import OctoPipeError
from octopipe_core.plan import Plan
from octopipe_core.profile import load_sample
from octopipe_core.schedules import build_plan
from octopipe_core.simulator import simulate


@pytest.fixture(scope="module")
def prof() -> Any:
    return load_sample("nemotron-h-8b")


def timeline(prof: Any, sched: str, d: int, m: int) -> pd.DataFrame:
    return simulate(prof, build_plan(prof, sched, d, m)).timeline()


# ---- charts ---------------------------------------------------------------------------------
def test_gantt_one_trace_per_kind_with_hover(prof: Any) -> None:
    tl = timeline(prof, "zb-h1", 4, 8)
    fig = charts.gantt_figure(tl, title="zb-h1")
    bars = [t for t in fig.data if t.type == "bar"]
    kinds = sorted(tl["kind"].unique())
    assert len(bars) == len(kinds)  # one trace per op kind, never one per block
    assert sum(len(t.x) for t in bars) == len(tl)
    assert {t.name for t in bars} == {charts.KIND_LABELS[k] for k in kinds}
    colors = {t.marker.color for t in bars}
    assert len(colors) == len(bars)  # distinct colours
    f = next(t for t in bars if t.name == charts.KIND_LABELS["F"])
    assert "stage" in f.hovertemplate and "micro-batch" in f.hovertemplate
    assert "layers" in f.hovertemplate
    # stage, mb, layers, device, start, end, duration, chunk
    assert f.customdata.shape == (int((tl["kind"] == "F").sum()), 9)
    # bars start where the op starts (base) and last its duration (x)
    g = tl[tl["kind"] == "F"]
    assert np.allclose(f.base, g["start_ms"]) and np.allclose(f.x, g["end_ms"] - g["start_ms"])
    assert fig.layout.xaxis.title.text == "time (ms)"
    assert fig.layout.barmode == "overlay"
    assert not fig.layout.meta["raster"]


def test_compare_gantt_shares_time_axis(prof: Any) -> None:
    a = timeline(prof, "1f1b", 4, 8)
    b = timeline(prof, "zbv", 4, 8)
    fig = charts.compare_gantt_figure({"1F1B": a, "ZB-V": b})
    assert [a.text for a in fig.layout.annotations] == ["1F1B", "ZB-V"]
    assert fig.layout.xaxis.matches == "x2" or fig.layout.xaxis2.matches == "x"
    assert fig.layout.xaxis2.range[1] >= max(a["end_ms"].max(), b["end_ms"].max())
    # the legend lists every kind once
    names = [t.name for t in fig.data if t.showlegend]
    assert len(names) == len(set(names))
    assert fig.layout.yaxis.ticktext[0] == "d0"


def test_large_plan_becomes_a_raster_with_hover() -> None:
    big = load_sample("nemotron-h-56b")
    tl = timeline(big, "1f1b", 64, 256)
    fig = charts.gantt_figure(tl)
    heat = [t for t in fig.data if t.type == "heatmap"]
    assert fig.layout.meta["raster"] and len(heat) == 2
    comp = heat[0]
    assert comp.z.shape == (64, charts.DEFAULT_BINS)
    assert comp.customdata.shape == (64, charts.DEFAULT_BINS, 4)
    assert "micro-batch" in comp.hovertemplate and "layers" in comp.hovertemplate
    assert (~np.isnan(comp.z)).mean() > 0.5  # most cells of a busy pipeline hold an op
    assert comp.hoverongaps is False  # idle cells show no hover
    assert len(fig.to_json()) < 2_000_000


def test_memory_figure_draws_cap_and_units(prof: Any) -> None:
    r = simulate(prof, build_plan(prof, "1f1b", 4, 8))
    fig = charts.memory_figure({"1F1B": r.memory_curves()}, 80.0)
    assert len(fig.data) == 4  # one line per device
    assert any("cap 80 GiB" in (a.text or "") for a in fig.layout.annotations)
    assert fig.layout.yaxis.title.text == "memory (GiB)"
    assert fig.layout.shapes[0].y0 == 80.0
    big = pd.concat([r.memory_curves().assign(device=lambda df, k=k: df.device + 4 * k)
                     for k in range(17)])  # fmt: skip
    assert len(charts.memory_figure({"x": big}, 80.0).data) == 1  # >64 devices: one trace


def test_layer_cost_and_sweep_figures(prof: Any) -> None:
    fig = charts.layer_cost_figure(analysis.layers_frame(prof), analysis.layer_types_frame(prof))
    assert [t.name for t in fig.data[:3]] == ["F time (ms)", "B time (ms)", "W time (ms)"]
    assert fig.layout.yaxis.title.text == "time (ms)"
    df = pd.DataFrame(
        [
            {"plan": p, "microbatches": m, "tokens_per_gpu_per_s": 1.0 * m,
             "max_peak_memory_gib": 10.0}
            for p in ("1f1b/uniform", "zbv/uniform") for m in (8, 16)
        ]
    )  # fmt: skip
    fig = charts.sweep_figure(df, "microbatches", 80.0)
    assert len(fig.data) == 4
    assert fig.layout.yaxis.title.text == "tokens/GPU/s"


# ---- analysis -------------------------------------------------------------------------------
def test_metrics_table_deltas(prof: Any) -> None:
    ms = {
        k: analysis.summary_metrics(simulate(prof, build_plan(prof, k, 8, 32)))
        for k in ("1f1b", "zbv")
    }
    t = analysis.metrics_table(ms)
    assert t.loc["1f1b", "Δ step time (%)"] == 0.0
    assert t.loc["zbv", "speedup (×)"] > 1.0
    assert {"step time (ms)", "tokens/GPU/s", "bubble ratio", "comm overlap",
            "peak memory (GiB)"} <= set(t.columns)  # fmt: skip


def test_edit_stages_moves_boundaries_and_devices(prof: Any) -> None:
    plan = build_plan(prof, "1f1b", 4, 8)
    firsts = [a for a, _ in plan.partition]
    new = analysis.edit_stages(plan, prof, [firsts[0], firsts[1] + 2, *firsts[2:]], [0, 1, 2, 3])
    assert new.partition[0][1] == plan.partition[0][1] + 2
    assert new.placement == plan.placement and new.name.endswith("+edits")
    moved = analysis.edit_stages(plan, prof, firsts, [0, 1, 2, 2])
    assert moved.placement == [0, 1, 2, 2] and moved.schedule[3] == []
    assert len(moved.schedule[2]) == len(plan.schedule[2]) + len(plan.schedule[3])
    simulate(prof, moved)  # a valid, simulatable plan
    with pytest.raises(OctoPipeError, match="first layer"):
        analysis.edit_stages(plan, prof, [0, 5, 4, 30], [0, 1, 2, 3])
    with pytest.raises(OctoPipeError, match="out of range"):
        analysis.edit_stages(plan, prof, firsts, [0, 1, 2, 9])


def test_schedule_text_round_trip_and_errors(prof: Any) -> None:
    plan = build_plan(prof, "1f1b", 2, 3)
    text = analysis.schedule_text(plan)
    assert text.splitlines()[0].startswith("d0: 0F0 0F1")
    same = analysis.apply_schedule_text(plan, text, prof.num_layers)
    assert same.schedule == plan.schedule
    with pytest.raises(OctoPipeError, match="2 devices"):
        analysis.apply_schedule_text(plan, "d0: 0F0", prof.num_layers)
    with pytest.raises(OctoPipeError, match="bad action"):
        analysis.apply_schedule_text(plan, text.replace("0F1", "0X1"), prof.num_layers)
    with pytest.raises(OctoPipeError, match="missing"):
        analysis.apply_schedule_text(plan, text.replace(" 0F2", ""), prof.num_layers)
    swapped = text.replace("d1: 1F0 1BW0", "d1: 1BW0 1F0")
    with pytest.raises(OctoPipeError, match="contradict"):
        analysis.apply_schedule_text(plan, swapped, prof.num_layers)


def test_plan_diff_names_what_moved(prof: Any) -> None:
    a = build_plan(prof, "1f1b", 4, 8)
    b = analysis.edit_stages(a, prof, [0, 16, 28, 42], [0, 1, 2, 3])
    d = analysis.plan_diff(a, b)
    assert d["stages"]["boundary moved"].sum() >= 2
    assert not d["stages"]["placement moved"].any()
    assert any("changed layers" in s for s in d["summary"])
    c = build_plan(prof, "zbv", 4, 8)
    d2 = analysis.plan_diff(a, c)
    assert any("different stage structure" in s for s in d2["summary"])
    assert (d2["devices"]["positions changed"] > 0).all()


def test_profile_type_edits_validate(prof: Any) -> None:
    types = analysis.layer_types_frame(prof)
    types.loc[types["type"] == "mlp", "forward_ms"] = 9.0
    new = analysis.profile_with_types(prof, types)
    assert new.type_map()["mlp"].forward_ms == 9.0
    types.loc[types["type"] == "mlp", "forward_ms"] = -1.0
    with pytest.raises(OctoPipeError, match="forward_ms"):
        analysis.profile_with_types(prof, types)
    types.loc[types["type"] == "mlp", "forward_ms"] = None
    with pytest.raises(OctoPipeError, match="empty"):
        analysis.profile_with_types(prof, types)


def test_peer_plan_and_json_round_trip(prof: Any) -> None:
    plan = analysis.peer_plan(prof, Settings(devices=4, microbatches=8, schedule="zbv"))
    again = analysis.plan_from_json(analysis.plan_json(plan))
    assert again.schedule == plan.schedule and again.partition == plan.partition
    assert "1f1b/uniform" in analysis.peer_keys()


# ---- tuner adapter --------------------------------------------------------------------------
def test_progress_reports_become_page_progress(prof: Any) -> None:
    from octopipe_core.tuner.search import TuneProgress

    plan = build_plan(prof, "1f1b", 2, 2)
    p = tuning.from_report(TuneProgress(3, "partition", 9.0, 2.5, True, "rebalance", plan), 10.0)
    assert (p.phase, p.best_step_ms, p.fraction, p.message) == ("partition", 9.0, 0.25, "rebalance")
    assert p.plan is not None and p.plan.schedule == plan.schedule and p.plan is not plan


def test_real_tuner_reports_and_returns_a_plan(prof: Any) -> None:
    tune, why = tuning.load_tuner()
    assert tune is not None, why
    seen: list[tuning.Progress] = []
    res = tuning.call_tune(tune, prof, 4, 8, 80.0, 2.0, 0, seen.append)
    plan = tuning.result_plan(res)
    assert isinstance(plan, Plan)
    assert seen and seen[0].best_step_ms is not None
    assert all(s.plan is not None for s in seen)  # what "Stop" keeps
    assert tuning.result_notes(res)


# ---- export adapter -------------------------------------------------------------------------
def test_job_zip_holds_a_runnable_job(prof: Any) -> None:
    mod, why = exporting.exporter()
    assert mod is not None, why
    plan = build_plan(prof, "zb-h1", 4, 8)
    data, names = exporting.job_zip(plan, prof, "job")
    with zipfile.ZipFile(BytesIO(data)) as zf:
        files = set(zf.namelist())
        assert {"job/launch.sh", "job/schedule.csv", "job/plan.json"} <= files
        assert zf.getinfo("job/launch.sh").external_attr >> 16 & 0o100  # executable
    assert set(names) == files
    csv = exporting.torch_schedule_csv(plan)
    assert csv.splitlines()[0].startswith("0F0")
    trace = json.loads(exporting.chrome_trace(prof, plan))
    assert trace["traceEvents"]
    assert exporting.safe_name("a/b c+d") == "a-b-c-d"


def test_plan_download_loads_back_with_its_profile(prof: Any, tmp_path: Any) -> None:
    from octopipe_core.plan import load_plan

    plan = build_plan(prof, "zbv", 4, 8)
    path = tmp_path / "plan.json"
    path.write_text(exporting.plan_file_json(plan, prof))
    again, embedded = load_plan(path)
    assert again.schedule == plan.schedule and embedded == prof
