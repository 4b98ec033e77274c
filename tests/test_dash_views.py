"""Unit tests of the dashboard views of issues 11 and 12, on the pure helpers (no Streamlit
session): where the time goes, the critical path, colours, plan diff by layers, sweeps over
the cap, the run-trace overlay, plan links, the light/dark look and the work cap."""

from __future__ import annotations

import ast
import base64
import doctest
import importlib
import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from app.components import (
    analysis,
    charts,
    guard,
    layer_diff,
    palette,
    plan_link,
    plots,
    trace_overlay,
    where,
)
from app.components.analysis import Settings
from octopipe_core.breakdown import critical_path
from octopipe_core.errors import OctoPipeError
from octopipe_core.executor.trace import sim_trace
from octopipe_core.plan import Plan
from octopipe_core.profile import load_sample
from octopipe_core.schedules import build_plan
from octopipe_core.simulator import simulate
from tests.dash_helpers import TINY_RUN, executed_trace, real_run

ROOT = Path(__file__).resolve().parent.parent
NEW_MODULES = [
    "app.components.analysis",
    "app.components.charts",
    "app.components.guard",
    "app.components.layer_diff",
    "app.components.palette",
    "app.components.plan_link",
    "app.components.plots",
    "app.components.trace_overlay",
    "app.components.where",
]


@pytest.fixture(scope="module")
def prof() -> Any:
    return load_sample("nemotron-h-8b")


@pytest.mark.parametrize("name", NEW_MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


# ---- 1. where the time goes, critical path, peak memory -------------------------------------
def test_where_the_time_goes_adds_up_to_the_step(prof: Any) -> None:
    r = simulate(prof, build_plan(prof, "1f1b", 8, 32), 80.0)
    a = where.analyse(r)
    f = a["frame"]
    parts = [c for c, _, _ in plots.TIME_PARTS]
    assert np.allclose(f[parts].sum(axis=1), r.step_time_ms)
    assert a["bubble_ratio"] == pytest.approx(r.bubble_ratio, abs=1e-6)
    assert (f["fill_ms"].diff().dropna() > 0).all()  # 1F1B: later devices start later
    fig = plots.where_time_figure({"1F1B": f})
    assert [t.name for t in fig.data] == [label for _, label, _ in plots.TIME_PARTS]
    assert "bubble ratio 0.3" in fig.layout.annotations[0].text
    assert fig.layout.barmode == "stack"


def test_peak_memory_bars_mark_devices_over_the_cap(prof: Any) -> None:
    r = simulate(prof, build_plan(prof, "zb-h2", 8, 32), 80.0)
    fig = plots.peak_memory_figure({"zb-h2": r.peak_memory_gib}, 80.0)
    bars = fig.data[0]
    over = np.asarray(r.peak_memory_gib) > 80.0
    assert over.any() and not over.all()
    assert [s == "x" for s in bars.marker.pattern.shape] == list(over)
    assert fig.data[-1].name == "over the cap"
    assert fig.layout.shapes[0].y0 == 80.0


def test_critical_path_is_outlined_and_the_rest_dimmed(prof: Any) -> None:
    r = simulate(prof, build_plan(prof, "1f1b", 4, 8))
    path = where.analyse(r)["path"]
    ops = [p for p in path if p.kind == "op"]
    assert [p.row for p in ops] == [p.op for p in critical_path(r) if p.kind == "op"]
    fig = charts.compare_gantt_figure({"p": r.timeline()}, critical={"p": path})
    crit = [t for t in fig.data if t.name == "critical path"]
    assert {t.type for t in crit} == {"bar", "scatter"}
    bar = next(t for t in crit if t.type == "bar")
    assert len(bar.x) == len(ops) and bar.meta == palette.OUTLINE
    f = next(t for t in fig.data if t.name == "F (forward)")
    assert set(np.round(f.marker.opacity, 2)) == {0.3, 1.0}
    # without a path nothing is dimmed
    plain = charts.compare_gantt_figure({"p": r.timeline()})
    assert next(t for t in plain.data if t.name == "F (forward)").marker.opacity is None


# ---- 2. colours ------------------------------------------------------------------------------
def test_v_shape_second_chunk_is_hatched_in_its_kind_colour(prof: Any) -> None:
    plan = build_plan(prof, "zbv", 4, 8)
    tl = charts.with_chunks(simulate(prof, plan).timeline(), plan.placement)
    fig = charts.gantt_figure(tl)
    f = next(t for t in fig.data if t.name == "F (forward)")
    assert f.marker.color == palette.KIND_COLORS["F"]
    comp = tl[(tl["kind"] == "F")]
    assert [s == "/" for s in f.marker.pattern.shape] == list(comp["chunk"] > 0)
    assert palette.CHUNK_LABEL in {t.name for t in fig.data}
    assert "chunk %{customdata[8]}" in f.hovertemplate
    # the raster draws the second chunk lighter
    big = charts.gantt_figure(tl, max_bars=10)
    z = big.data[0].z
    codes, colors, _ = charts._raster_codes()
    assert codes["F+"] in set(np.unique(z[~np.isnan(z)]).astype(int))
    assert colors[codes["F+"] - 2] == palette.lighter(palette.KIND_COLORS["F"])


def test_memory_curve_colours_do_not_repeat_at_16_devices(prof: Any) -> None:
    r = simulate(prof, build_plan(prof, "1f1b", 16, 32))
    fig = charts.memory_figure({"1F1B": r.memory_curves()}, 80.0)
    colors = [t.line.color for t in fig.data]
    assert len(colors) == 16 == len(set(colors))


# ---- 3. plan diff by layers ------------------------------------------------------------------
def test_layer_diff_of_plans_with_different_stage_counts(prof: Any) -> None:
    a = simulate(prof, build_plan(prof, "1f1b", 4, 8))
    b = simulate(prof, build_plan(prof, "zbv", 4, 8, partition="balanced"))
    d = layer_diff.layer_diff(prof, a, b)
    assert any("stages: 4 in A, 8 in B" in s for s in d["summary"])
    mv = d["moves"]
    assert len(mv) > 0 and set(mv["device in A"]) <= {"d0", "d1", "d2", "d3"}
    # every moved layer really is on the named devices
    for row in mv.itertuples():
        for layer in range(row[1], row[2] + 1):
            place = zip(a.plan.partition, a.plan.placement, strict=True)
            da = next(x for (lo, hi), x in place if lo <= layer < hi)
            assert f"d{da}" == row[4]
    dev = d["devices"]
    assert list(dev["device"]) == ["d0", "d1", "d2", "d3"]
    assert dev["layers A"].sum() == dev["layers B"].sum() == prof.num_layers
    assert np.allclose(dev["Δ peak (GiB)"], dev["peak B (GiB)"] - dev["peak A (GiB)"], atol=2e-3)
    fig = layer_diff.device_change_figure(dev, ("1f1b", "zbv"))
    assert len(fig.data) == 4


# ---- 4. sweeps -------------------------------------------------------------------------------
def test_sweep_marks_points_over_the_cap() -> None:
    df = pd.DataFrame(
        [
            {"plan": "a", "microbatches": m, "tokens_per_gpu_per_s": 1.0 * m,
             "max_peak_memory_gib": 10.0 * m, "fits_memory": 10.0 * m <= 80}
            for m in (4, 8, 16)
        ]
    )  # fmt: skip
    fig = charts.sweep_figure(df, "microbatches", 80.0)
    line = fig.data[0]
    assert list(line.marker.symbol) == ["circle", "circle", "x-thin-open"]
    assert fig.data[-1].name == "does not fit the memory cap"
    assert "OVER the memory cap" in list(line.customdata)


# ---- 5. simulated vs executed ----------------------------------------------------------------
@pytest.fixture(scope="module")
def dp2_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Plan, pd.DataFrame, Path]:
    """A real 2-step run of ``TINY_RUN`` on 2 replicas (4 ranks): the plan, its parsed trace
    and the job folder."""
    plan, job = real_run(tmp_path_factory.mktemp("dp2"), dp=2)
    path = job / "out" / "trace_executed.json"
    return plan, trace_overlay.parse_trace(path.read_bytes(), path.name), job


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_a_real_runs_trace_overlays_the_simulated_timeline(
    dp2_run: tuple[Plan, pd.DataFrame, Path],
) -> None:
    plan, trace, job = dp2_run
    res = json.loads((job / "out" / "result.json").read_text())
    lay = trace_overlay.layout_of(trace)
    assert (lay.pp, lay.dp) == (2, 2) and trace_overlay.steps(trace) == [0, 1]
    assert set(trace["device"]) == {0, 1} and set(trace["replica"]) == {0, 1}
    tail = trace[trace["cat"] == "dp"]
    assert set(tail["kind"]) == {"DP", "SYNC", "OPT"}
    assert set(tail.loc[tail["kind"] != "DP", "stage"]) == {-1}
    r = simulate(load_sample(TINY_RUN[0]), plan)
    sim = r.timeline()
    ops = sum(len(plan.schedule[d]) for d in range(plan.num_devices))
    for replica in (0, 1):
        run = trace_overlay.match_plan(trace, plan, "trace_executed.json", 1, replica)
        assert set(run["rank"]) == set(lay.pipeline(replica))
        assert run.attrs["step_ms"] == pytest.approx(res["step_ms"][1], abs=1e-3)
        assert run["start_ms"].min() >= 0 and run["end_ms"].max() <= run.attrs["step_ms"] + 1e-6
        table = trace_overlay.compare_frame(sim, run, plan, r.step_time_ms)
        dev, whole = table.iloc[:2], table.iloc[2]
        assert list(dev["order as planned"]) == ["yes", "yes"]
        assert (dev["executed_busy_ms"] > 0).all()
        assert (dev["executed_span_ms"] >= dev["executed_busy_ms"] - 1e-3).all()
        assert (dev["simulated_busy_ms"] > 0).all()
        assert whole["device"] == "whole step"
        assert whole["simulated_span_ms"] == round(r.step_time_ms, 3)
        assert whole["executed_span_ms"] == pytest.approx(res["step_ms"][1], abs=1e-3)
        err = 100 * (r.step_time_ms / res["step_ms"][1] - 1)
        assert whole["span_error_%"] == pytest.approx(err, abs=0.1)
        fig = trace_overlay.overlay_figure(sim, run, plan)
        names = {t.name for t in fig.data}
        assert {"simulated F (forward)", "executed F (forward)"} <= names
        assert "executed: DP reduction, step sync, optimizer" in names
        executed = [t for t in fig.data if t.name.startswith("executed ")]
        assert sum(len(t.x) for t in executed) == ops  # every op of the plan, drawn once
        assert all(np.all(np.asarray(t.y) > -0.5) for t in executed)
    with pytest.raises(OctoPipeError, match=r"no replica 2, the run had 2; fix: pick 0\.\.1"):
        trace_overlay.match_plan(trace, plan, "trace_executed.json", 1, 2)


def test_a_gpu_run_keeps_its_peak_memory_in_the_trace(prof: Any) -> None:
    plan = build_plan(prof, "1f1b", 4, 8)

    # octopipe run on GPUs records each rank's allocator peak; on the CPU there is none
    def peaks_of(body: bytes) -> Any:
        return trace_overlay.parse_trace(body, "run.json").attrs["peak_memory_gib"]

    assert peaks_of(executed_trace(prof, plan)) == []
    cpu = executed_trace(prof, plan, peaks=[None] * 4)
    assert "peak_memory_gib" not in json.loads(cpu)["otherData"]
    body = executed_trace(prof, plan, peaks=[40.0, 41.5, None, 39.0])
    peaks = peaks_of(body)
    assert peaks == [40.0, 41.5, None, 39.0]
    sim = simulate(prof, plan).peak_memory_gib
    table = trace_overlay.peak_frame(sim, peaks)
    assert list(table["device"]) == ["d0", "d1", "d2", "d3"]
    assert table["measured peak (GiB)"].iloc[1] == 41.5
    assert table["simulated / measured - 1"].iloc[0] == f"{sim[0] / 40.0 - 1:+.1%}"
    assert table["simulated / measured - 1"].iloc[2] == ""
    bad = json.loads(body)
    bad["otherData"]["peak_memory_gib"][1] = "lots"
    with pytest.raises(OctoPipeError, match=r"otherData\.peak_memory_gib\[1\]") as e:
        peaks_of(json.dumps(bad).encode())
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"[1, 2]", "not a Chrome trace"),
        (b'{"traceEvents": [{"ph": "X", "name": "0F0", "cat": "compute", "pid": 0, "ts": 1e400,'
         b' "dur": 1, "args": {"step": 0}}]}', "run.json"),
        (b'{"traceEvents": [{"ph": "X", "name": "rm -rf", "cat": "compute", "pid": 0, "ts": 1,'
         b' "dur": 1, "args": {"step": 0}}]}', "not a plan action"),
        (b'{"traceEvents": [{"ph": "X", "name": "0F0", "cat": "compute", "pid": -1, "ts": 1,'
         b' "dur": 1, "args": {"step": 0}}]}', "pid"),
        (b'{"traceEvents": []}', "no executed compute ops"),
    ],
)  # fmt: skip
def test_bad_traces_are_one_line_errors(body: bytes, needle: str) -> None:
    with pytest.raises(OctoPipeError) as e:
        trace_overlay.parse_trace(body, "run.json")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_simulated_trace_or_another_plan_is_refused(prof: Any) -> None:
    plan = build_plan(prof, "1f1b", 4, 8)
    simulated = json.dumps(sim_trace(simulate(prof, plan))).encode()
    with pytest.raises(OctoPipeError, match="simulated trace"):
        trace_overlay.parse_trace(simulated, "trace_simulated.json")
    other = build_plan(prof, "zb-h1", 4, 8)
    trace = trace_overlay.parse_trace(executed_trace(prof, other), "run.json")
    with pytest.raises(OctoPipeError, match="rank 0 ran"):
        trace_overlay.match_plan(trace, plan, "run.json", 0)
    with pytest.raises(OctoPipeError, match="8 devices"):
        trace_overlay.match_plan(trace, build_plan(prof, "1f1b", 8, 8), "run.json", 0)


# ---- 6, 7. downloads, hover, links, theme ----------------------------------------------------
def test_gantt_hover_shows_the_duration_and_the_raster_names_the_kind(prof: Any) -> None:
    tl = simulate(prof, build_plan(prof, "1f1b", 4, 8)).timeline()
    fig = charts.gantt_figure(tl)
    for t in fig.data:
        if t.type != "bar":
            continue
        cd = np.asarray(t.customdata, np.float64)
        assert np.allclose(cd[:, 7], cd[:, 6] - cd[:, 5], atol=1e-2)  # end - start
        assert "(%{customdata[7]:.3f} ms)" in t.hovertemplate and "%{x" not in t.hovertemplate
    raster = charts.gantt_figure(tl, max_bars=10).data[0]
    assert "%{text}" in raster.hovertemplate and "compute" not in raster.hovertemplate
    kinds = set(np.asarray(raster.text).ravel()) - {""}
    assert {"F", "BW"} <= kinds


def test_device_without_stages_is_an_idle_lane(prof: Any) -> None:
    plan = analysis.edit_stages(build_plan(prof, "1f1b", 4, 8), prof, [0, 14, 28, 41], [0, 1, 2, 2])
    tl = simulate(prof, plan).timeline()
    assert tl["device"].max() == 2  # d3 runs nothing
    fig = charts.compare_gantt_figure({"p": tl}, devices={"p": 4})
    assert list(fig.layout.yaxis.range) == [3.5, -0.5]
    assert list(fig.layout.yaxis.ticktext) == ["d0", "d1", "d2", "d3"]
    assert any("idle: no stages" in (a.text or "") and a.y == 3 for a in fig.layout.annotations)


def test_plan_link_round_trip_and_hostile_links(prof: Any, monkeypatch: Any) -> None:
    base = build_plan(prof, "zbv", 8, 32)
    firsts = [lo for lo, _ in base.partition]
    firsts[1] += 1
    plan = analysis.edit_stages(base, prof, firsts, list(base.placement))
    text = plan_link.encode(plan)
    assert len(text) < 1500
    again = plan_link.decode(text, prof.num_layers)
    assert again.schedule == plan.schedule and again.partition == plan.partition
    with pytest.raises(OctoPipeError, match="layers"):
        plan_link.decode(text, 20)  # a plan for more layers than the profile has
    bomb = base64.urlsafe_b64encode(zlib.compress(b" " * (8 * 2**20))).decode()
    with pytest.raises(OctoPipeError, match="inflates past"):
        plan_link.decode(bomb, prof.num_layers)
    deep = base64.urlsafe_b64encode(zlib.compress(b"[" * 5000 + b"]" * 5000)).decode()
    with pytest.raises(OctoPipeError) as e:
        plan_link.decode(deep, prof.num_layers)
    assert "\n" not in str(e.value)
    assert plan_link.link_or_none(plan) == text
    monkeypatch.setattr(plan_link, "MAX_LINK_CHARS", 100)
    assert plan_link.link_or_none(plan) is None  # too long: share the file


def test_dark_theme_recolours_background_masks_and_highlights(prof: Any) -> None:
    r = simulate(prof, build_plan(prof, "1f1b", 4, 8))
    path = where.analyse(r)["path"]
    fig = charts.compare_gantt_figure({"p": r.timeline()}, max_bars=10, critical={"p": path})
    assert palette.themed(fig, dark=False) is fig
    dark = palette.themed(fig, dark=True)
    assert dark.layout.paper_bgcolor == palette.DARK_BG
    mask = next(t for t in dark.data if t.meta == palette.MASK)
    assert palette.DARK_BG in {c for _, c in mask.colorscale}
    assert palette.LIGHT_BG not in {c.upper() for _, c in mask.colorscale}
    crit = [t for t in dark.data if t.meta == palette.OUTLINE]
    assert crit and all(
        (t.line.color if t.type == "scatter" else t.marker.line.color) == palette.DARK_FG
        for t in crit
    )
    # the original (cached) figure is untouched
    assert next(t for t in fig.data if t.meta == palette.MASK).colorscale[0][1] == "#FFFFFF"


def test_every_figure_starts_light_without_naming_the_template(prof: Any) -> None:
    # the app's figures take plotly_white as plotly's default (made once, not re-validated
    # for each figure): its plot background is white, plotly's own default is blue-grey
    r = simulate(prof, build_plan(prof, "zbv", 4, 8))
    data = where.analyse(r)
    figs = [
        charts.compare_gantt_figure({"p": r.timeline()}, max_bars=10),
        plots.where_time_figure({"p": data["frame"]}),
        plots.peak_memory_figure({"p": data["peaks_gib"]}, 80.0),
        charts.memory_figure({"p": r.memory_curves()}, 80.0),
    ]
    assert [f.layout.template.layout.plot_bgcolor for f in figs] == ["white"] * len(figs)


def test_every_module_that_makes_figures_imports_the_palette() -> None:
    # the light template is set where the palette is imported: a module that makes figures
    # without importing it would draw them in plotly's own default when used on its own
    makers = []
    for path in sorted((ROOT / "app").rglob("*.py")):
        tree = ast.parse(path.read_text())
        calls = {
            n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
            for n in ast.walk(tree)
            if isinstance(n, ast.Call)
        }
        if {"Figure", "make_subplots"} & calls and path.name != "palette.py":
            imports = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
            makers.append((path.name, "app.components.palette" in imports))
    assert len(makers) >= 5 and all(ok for _, ok in makers), makers


def test_theme_config_offers_light_and_dark() -> None:
    lines = [ln.strip() for ln in (ROOT / ".streamlit" / "config.toml").read_text().splitlines()]
    assert {"[theme]", "[theme.light]", "[theme.dark]"} <= set(lines)
    # no fixed base: the system's light/dark setting applies
    assert not any(ln.replace(" ", "").startswith("base=") for ln in lines)


def test_layer_chart_groups_very_long_models() -> None:
    n = 5000
    layers = pd.DataFrame(
        {"layer": range(n), "type": ["mlp"] * n, "F (ms)": 1.0, "B (ms)": 2.0, "W (ms)": 1.0}
    )
    types = pd.DataFrame(
        {"type": ["mlp"], "activation_mib": [1.0], "w_stash_mib": [1.0], "weight_mib": [1.0]}
    )
    fig = plots.layer_cost_figure(layers, types)
    assert len(fig.data[0].x) <= plots.MAX_LAYER_BARS
    assert fig.layout.meta["layers_per_bar"] == 4
    assert "mean of 4 layers" in fig.layout.annotations[0].text


# ---- 8. the work cap -------------------------------------------------------------------------
def test_work_cap_refuses_heavy_settings_and_plans(prof: Any) -> None:
    guard.check_settings(Settings(devices=64, microbatches=256))
    with pytest.raises(OctoPipeError) as e:
        guard.check_settings(Settings(devices=59, microbatches=1000))
    msg = str(e.value)
    assert "590,000 ops" in msg and "400,000" in msg and "fix:" in msg and "\n" not in msg
    with pytest.raises(OctoPipeError, match="over the limit"):
        guard.check_settings(Settings(devices=32, microbatches=1024, chunks=8))
    with pytest.raises(OctoPipeError, match="plan 1f1b"):
        guard.check_plan(build_plan(load_sample("nemotron-h-56b"), "1f1b", 100, 1000))
