"""AppTest (headless) cases of the views issue 11 asked for, and of issue 12's hostile uploads
and work cap, page by page."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from app.components import analysis, exporting
from octopipe_core.breakdown import critical_path
from octopipe_core.executor.trace import sim_trace
from octopipe_core.profile import load_sample
from octopipe_core.schedules import build_plan
from octopipe_core.simulator import simulate
from tests.dash_helpers import TINY_RUN, executed_trace, ok, real_run, start

C16 = "16x8-h800-ib400"
PLAN_PAGES = ["overview", "plan", "tune", "compare", "cluster"]
ALL_PAGES = ["overview", "profile", "plan", "tune", "compare", "export", "cluster", "layouts"]


def go(at: AppTest, page: str) -> None:
    at.switch_page(f"views/{page}.py")
    at.run()
    ok(at)


def charts(at: AppTest) -> dict[str, Any]:
    return {c.key: c for c in at.get("plotly_chart")}


def spec(at: AppTest, key: str) -> dict[str, Any]:
    return json.loads(charts(at)[key].proto.spec)


def values(v: Any) -> np.ndarray:
    """A plotly JSON array (plain list, or ``{"dtype", "bdata"}`` typed array)."""
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
    return np.asarray(v)


def with_tuned_plan(at: AppTest, schedule: str = "zbv") -> str:
    """What a finished tuner run leaves in the session (a peer plan stands in for speed)."""
    prof = at.session_state["profile"]
    ss = at.session_state
    plan = build_plan(prof, schedule, int(ss["devices"]), int(ss["microbatches"]))
    plan.name = "tuned-zbv"
    js = analysis.plan_json(plan)
    key = (ss["profile_version"], int(ss["devices"]), int(ss["microbatches"]))
    if ss["cluster"] != "none":
        from app.components import cluster_data

        c = ss["cluster_custom"] if ss["cluster"] == "custom" else None
        from octopipe_core.cluster import load_cluster_sample

        c = c or load_cluster_sample(ss["cluster"])
        key = (*key, (cluster_data.cluster_key(c), int(ss["dp"]), bool(ss["zero1"]), ss["order"]))
    ss["tuned"] = {"key": key, "plan": js}
    at.run()
    ok(at)
    return js


def errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


# ---- 1. where the time goes on every page that shows a plan ---------------------------------
@pytest.mark.parametrize("page", PLAN_PAGES)
def test_every_plan_page_shows_where_the_time_goes(page: str) -> None:
    query = {"cluster": C16, "dp": "2", "devices": "8", "microbatches": "16"}
    at = start(page, **(query if page == "cluster" else {}))
    if page == "tune":
        with_tuned_plan(at)
    keys = list(charts(at))
    time_key = next(k for k in keys if k.endswith("_where_time"))
    peak_key = next(k for k in keys if k.endswith("_where_peak"))
    fig = spec(at, time_key)
    parts = [t for t in fig["data"] if t.get("yaxis", "y") == "y"]
    assert [t["name"] for t in parts] == [
        "busy (compute)", "fill: idle before the first op", "waiting on transfers",
        "idle between ops (other)", "drain: idle after the last op",
    ]  # fmt: skip
    title = fig["layout"]["annotations"][0]["text"]
    total = sum(values(t["x"]) for t in parts)
    assert np.allclose(total, total[0], rtol=1e-6)  # every device's bar spans the step
    assert "bubble ratio" in title
    peak = spec(at, peak_key)
    assert peak["layout"]["shapes"][0]["y0"] == at.session_state["memory_gib"]
    assert len(values(peak["data"][0]["y"])) == int(at.session_state["devices"])
    assert any("Bubble ratio = idle device time / (devices × step time)" in c.value
               for c in at.caption)  # fmt: skip
    # and how far each plan's schedule is above what its layout allows
    lb = next(c.value for c in at.caption if c.value.startswith("**Layout bound**"))
    assert "any schedule of its layout needs >= " in lb and "this schedule is +" in lb


def test_critical_path_toggle_highlights_the_path_and_is_shared() -> None:
    at = start("plan", devices="4", microbatches="8")
    assert not any(t.get("name") == "critical path" for t in spec(at, "plan_gantt")["data"])
    at.sidebar.toggle(key="_w_critical").set_value(True).run()
    ok(at)
    data = spec(at, "plan_gantt")["data"]
    crit = [t for t in data if t.get("name") == "critical path"]
    assert {t["type"] for t in crit} == {"bar", "scatter"}
    prof = at.session_state["profile"]
    r = simulate(prof, build_plan(prof, "1f1b", 4, 8))
    ops = [p for p in critical_path(r) if p.kind == "op"]
    bar = next(t for t in crit if t["type"] == "bar")
    assert len(values(bar["x"])) == len(ops)
    assert values(bar["base"])[-1] == pytest.approx(ops[-1].start_ms, rel=1e-5)
    f = next(t for t in data if t.get("name") == "F (forward)")
    assert set(np.round(values(f["marker"]["opacity"]), 2)) == {0.3, 1.0}
    assert any(c.value.startswith("Outlined and joined") for c in at.caption)
    assert at.query_params["critical"] == "1"
    again = start("plan", **dict(at.query_params))
    assert again.sidebar.toggle(key="_w_critical").value is True


# ---- 2. colours ------------------------------------------------------------------------------
def test_v_shape_chunks_are_told_apart_and_kinds_keep_their_colours() -> None:
    at = start("plan", devices="4", microbatches="8", schedule="zbv")
    data = spec(at, "plan_gantt")["data"]
    f = next(t for t in data if t.get("name") == "F (forward)")
    assert f["marker"]["color"] == "#4C78A8"
    assert set(f["marker"]["pattern"]["shape"]) == {"", "/"}
    assert any("2nd chunk" in str(t.get("name")) for t in data)


def test_memory_curves_at_16_devices_have_16_colours() -> None:
    at = start("plan", devices="16", microbatches="32")
    at.toggle(key="plan_memory").set_value(True).run()
    ok(at)
    mem = next(
        json.loads(c.proto.spec)
        for c in at.get("plotly_chart")
        if json.loads(c.proto.spec)["layout"].get("yaxis", {}).get("title", {}).get("text")
        == "memory (GiB)"
    )
    colors = [t["line"]["color"] for t in mem["data"] if str(t.get("name", "")).startswith("d")]
    assert len(colors) == 16 == len(set(colors))
    assert at.query_params["memory"] == "1"  # the shared view shows the curves too
    again = start("plan", **dict(at.query_params))
    assert again.toggle(key="plan_memory").value is True and len(charts(again)) == 4


# ---- 3, 4. plan diff by layers, sweeps ------------------------------------------------------
def test_plan_diff_by_layers_across_stage_counts() -> None:
    at = start("compare", devices="4", microbatches="8")
    at.multiselect(key="compare_plans").set_value(["1f1b/uniform", "zbv/balanced"]).run()
    at.segmented_control(key="compare_view").set_value("Plan diff").run()
    ok(at)
    text = " ".join(m.value for m in at.markdown)
    assert "stages: 4 in A, 8 in B" in text and "run on another device" in text
    moves, devices = at.dataframe[0].value, at.dataframe[1].value
    assert {"first layer", "last layer", "device in A", "device in B"} <= set(moves.columns)
    assert len(moves) > 0
    assert list(devices["device"]) == ["d0", "d1", "d2", "d3"]
    assert {"Δ load (ms)", "Δ peak (GiB)"} <= set(devices.columns)
    assert "diff_chart" in charts(at)
    assert at.query_params["view"] == "diff"
    assert at.query_params["plans"] == "1f1b/uniform,zbv/balanced"
    # the shared URL opens the same view on the same plans
    again = start("compare", **dict(at.query_params))
    assert again.multiselect(key="compare_plans").value == ["1f1b/uniform", "zbv/balanced"]
    assert again.segmented_control(key="compare_view").value == "Plan diff"


def test_sweep_marks_points_that_do_not_fit() -> None:
    at = start("compare", memory_gib="64")
    at.segmented_control(key="compare_view").set_value("Sweep").run()
    ok(at)
    data = spec(at, "sweep_chart")["data"]
    symbols = [s for t in data if "marker" in t and isinstance(t["marker"].get("symbol"), list)
               for s in t["marker"]["symbol"]]  # fmt: skip
    assert "x-thin-open" in symbols and "circle" in symbols
    assert any(t.get("name") == "does not fit the memory cap" for t in data)
    assert any("do not fit the 64 GiB memory cap" in c.value for c in at.caption)
    table = at.dataframe[0].value
    assert "NO" in set(table["fits cap"]) and "yes" in set(table["fits cap"])
    at.radio(key="sweep_axis").set_value("devices").run()
    at.multiselect(key="sweep_peers").set_value(["1f1b/uniform", "zbv/balanced"]).run()
    ok(at)
    assert at.query_params["sweep"] == "devices"
    assert at.query_params["peers"] == "1f1b/uniform,zbv/balanced"
    again = start("compare", **dict(at.query_params))
    assert again.radio(key="sweep_axis").value == "devices"
    assert again.multiselect(key="sweep_peers").value == ["1f1b/uniform", "zbv/balanced"]


# ---- 5. simulated vs executed ----------------------------------------------------------------
@pytest.mark.dist
@pytest.mark.timeout(300)
def test_compare_shows_a_real_runs_trace_predicted_vs_measured(tmp_path: Path) -> None:
    _, job = real_run(tmp_path, dp=2)  # octopipe export --dp 2 + octopipe run: 4 ranks
    body = (job / "out" / "trace_executed.json").read_bytes()
    sample, schedule, devices, mbs = TINY_RUN
    at = start("compare", sample=sample, devices=str(devices), microbatches=str(mbs))
    at.segmented_control(key="compare_view").set_value("Simulated vs executed").run()
    at.selectbox(key="exec_plan").set_value(f"{schedule}/uniform").run()
    at.file_uploader(key="exec_trace").set_value(("trace_executed.json", body, "application/json"))
    at.run()
    ok(at)
    assert not at.error, errors(at)
    assert at.selectbox(key="exec_replica").options == ["0", "1"]
    for replica in (0, 1):
        at.selectbox(key="exec_replica").set_value(replica).run()
        ok(at)
        assert not at.error, errors(at)
        names = {t.get("name") for t in spec(at, "exec_chart")["data"]}
        assert {"simulated F (forward)", "executed F (forward)"} <= names
        table = at.dataframe[0].value
        assert list(table["device"]) == ["d0", "d1", "whole step"]
        assert list(table["order as planned"]) == ["yes", "yes", ""]
        assert (table["executed_busy_ms"].iloc[:2] > 0).all()
        assert {"simulated_span_ms", "executed_span_ms", "span_error_%"} <= set(table.columns)
        assert any(f"replica {replica} of PP2 x DP2" in c.value for c in at.caption)


def test_compare_keeps_gpu_peaks_and_refuses_foreign_traces() -> None:
    # hand-made traces: a GPU run's peaks (a CPU run records none) and inputs that must fail
    at = start("compare", devices="4", microbatches="8")
    at.segmented_control(key="compare_view").set_value("Simulated vs executed").run()
    at.selectbox(key="exec_plan").set_value("1f1b/uniform").run()
    prof = at.session_state["profile"]
    gpu = executed_trace(prof, build_plan(prof, "1f1b", 4, 8), peaks=[30.0, 31.0, 32.0, 33.0])
    at.file_uploader(key="exec_trace").set_value(("gpu.json", gpu, "application/json")).run()
    ok(at)
    assert not at.error, errors(at)
    assert "exec_replica" not in {w.key for w in at.selectbox}  # one replica: no choice
    assert len(at.dataframe) == 2  # predicted vs measured, then the peaks
    peaks = at.dataframe[1].value
    assert list(peaks["measured peak (GiB)"]) == [30.0, 31.0, 32.0, 33.0]
    assert any("max_memory_allocated" in c.value for c in at.caption)
    # the simulated trace, or another plan's run, is a one-line error in the page
    for name, bad, needle in (
        ("trace_simulated.json", json.dumps(sim_trace(simulate(prof, build_plan(prof, "1f1b",
         4, 8)))).encode(), "simulated trace"),
        ("zb.json", executed_trace(prof, build_plan(prof, "zb-h1", 4, 8)), "rank 0 ran"),
        ("junk.json", b"\x00\xff", "junk.json"),
    ):  # fmt: skip
        at.file_uploader(key="exec_trace").set_value((name, bad, "application/json")).run()
        ok(at)
        assert len(at.error) == 1 and needle in at.error[0].value, errors(at)
        assert "\n" not in at.error[0].value


# ---- 6. SVG downloads ------------------------------------------------------------------------
def test_charts_download_as_svg_or_png() -> None:
    at = start("plan")
    for c in at.get("plotly_chart"):
        assert json.loads(c.proto.config)["toImageButtonOptions"]["format"] == "svg"
    at.sidebar.segmented_control(key="_w_img_format").set_value("png").run()
    ok(at)
    cfg = json.loads(charts(at)["plan_gantt"].proto.config)
    assert cfg["toImageButtonOptions"] == {
        "format": "png", "filename": "octopipe-timeline", "scale": 2
    }  # fmt: skip
    assert at.query_params["img"] == "png"


# ---- 7. rough edges --------------------------------------------------------------------------
def test_shared_url_keeps_the_partition() -> None:
    at = start("plan", schedule="zbv", partition="balanced")
    assert at.subheader[0].value.startswith("zbv/balanced")
    assert at.query_params["partition"] == "balanced"
    at.selectbox(key="_w_partition").set_value("uniform").run()
    ok(at)
    assert at.query_params["partition"] == "uniform"
    bad = start("plan", partition="lumpy")
    assert any("partition" in w.value for w in bad.warning)


def test_a_hand_edited_plan_travels_in_the_link() -> None:
    at = start("plan")
    ver = at.session_state["_edit_key"]
    at.session_state[f"stages_{ver}"] = {
        "edited_rows": {1: {"first layer": 8}}, "added_rows": [], "deleted_rows": []
    }  # fmt: skip
    at.run()
    ok(at)
    shown = at.session_state["_plan_js_shown"]
    shared = dict(at.query_params)
    assert "plan" in shared and len(shared["plan"]) < 1500
    again = start("plan", **shared)
    assert again.session_state["_plan_js_shown"] == shown
    assert "from a shared link" in again.subheader[0].value
    broken = start("plan", **{**shared, "plan": shared["plan"][:-30]})
    assert any("URL parameter plan" in w.value for w in broken.warning)
    assert broken.subheader[0].value.startswith("1f1b/uniform")  # the peer plan instead


def test_a_tuned_plan_opens_in_the_plan_page_for_sharing() -> None:
    at = start("tune", devices="4", microbatches="8")
    js = with_tuned_plan(at)
    at.button(key="tuned_to_plan").click().run()
    ok(at)
    assert at.session_state["_plan_js_shown"] == js
    assert "from the Tune page" in at.subheader[0].value
    assert "plan" in at.query_params


def test_a_plan_file_opens_with_its_profile() -> None:
    at = start("plan")
    llama = load_sample("llama-3-8b")
    plan = build_plan(llama, "zb-h1", 4, 8)
    body = exporting.plan_file_json(plan, llama).encode()
    at.file_uploader(key="plan_upload_0").set_value(("shared.json", body, "application/json"))
    at.run()
    ok(at)
    assert not at.error, errors(at)
    assert at.session_state["profile"].name == llama.name
    shown = json.loads(at.session_state["_plan_js_shown"])
    assert shown["schedule"] == plan.to_dict()["schedule"]
    assert at.sidebar.number_input(key="_w_devices").value == 4
    assert "from file shared.json" in at.subheader[0].value
    bad = dict(json.loads(body), partition=[[0, 1]])
    key = f"plan_upload_{at.session_state['plan_upload_ver']}"
    at.file_uploader(key=key).set_value(("bad.json", json.dumps(bad).encode(), "x")).run()
    ok(at)
    assert any("bad.json" in e and "\n" not in e for e in errors(at))


def test_overview_compares_with_a_plan_that_fits() -> None:
    at = start(None, sample="jamba-v0.1", devices="16", microbatches="64", memory_gib="50")
    head = at.subheader[0].value
    assert "1f1b/balanced" in head and "faster than 1F1B" not in head
    assert any("1F1B (uniform) does not fit the 50 GiB cap" in i.value for i in at.info)
    assert at.table[0].value.index[0] == "1f1b/balanced"  # the reference row first
    none_fit = start(None, memory_gib="20")
    assert "neither fits" in none_fit.subheader[0].value or "does not fit" in (
        none_fit.subheader[0].value
    )
    assert any("No peer schedule fits the 20 GiB cap" in w.value for w in none_fit.warning)


def test_numbers_and_names_are_never_cut_off() -> None:
    at = start("plan", memory_gib="50")
    peak = next(m for m in at.metric if m.label == "peak memory (GiB)")
    assert peak.value.replace(".", "").isdigit()  # the number alone
    assert any("Over the memory cap" in m.value and "50 GiB" in m.value for m in at.markdown)
    go(at, "compare")
    table = at.table[0].value  # a static table: full plan names and headers
    assert "1f1b/uniform" in list(table.index)
    assert "Δ step time (%)" in table.columns
    assert table.loc["1f1b/uniform", "Δ step time (%)"] == "±0"


def test_invalid_stage_edit_is_reverted_and_reported_once() -> None:
    at = start("plan")
    ver = at.session_state["_edit_key"]
    at.session_state[f"stages_{ver}"] = {
        "edited_rows": {2: {"first layer": 3}}, "added_rows": [], "deleted_rows": []
    }  # fmt: skip
    at.run()
    ok(at)
    assert len(at.error) == 1 and "stage 1" in at.error[0].value
    assert at.session_state["_edit_key"] != ver  # a fresh grid: the bad value is gone
    assert json.loads(at.session_state["_plan_js_shown"])["name"] == "1f1b/uniform"
    at.toggle(key="plan_memory").set_value(True).run()  # any later rerun: no stale error
    ok(at)
    assert not at.error


def test_a_device_left_without_stages_shows_as_idle() -> None:
    at = start("plan", devices="4", microbatches="8")
    ver = at.session_state["_edit_key"]
    at.session_state[f"stages_{ver}"] = {
        "edited_rows": {3: {"device": 2}}, "added_rows": [], "deleted_rows": []
    }  # fmt: skip
    at.run()
    ok(at)
    lay = spec(at, "plan_gantt")["layout"]
    assert lay["yaxis"]["ticktext"] == ["d0", "d1", "d2", "d3"]
    assert any("idle: no stages" in a.get("text", "") for a in lay["annotations"])


def test_a_zero_delta_is_neutral_not_red() -> None:
    at = start("plan")
    ver = at.session_state["_edit_key"]
    # move the boundary between the last two stages: d0 keeps the highest peak
    at.session_state[f"stages_{ver}"] = {
        "edited_rows": {7: {"first layer": 46}}, "added_rows": [], "deleted_rows": []
    }  # fmt: skip
    at.run()
    ok(at)
    peak = next(m for m in at.metric if m.label == "peak memory (GiB)")
    assert peak.delta == "±0"
    assert peak.proto.color == 2  # GRAY
    step = next(m for m in at.metric if m.label == "step time (ms)")
    assert step.delta != "±0" and step.proto.color != 2


def test_profile_page_says_samples_are_analytic_and_shows_gpus() -> None:
    at = start("profile", sample="nemotron-h-56b")
    text = " ".join(c.value for c in at.caption)
    assert "Analytic, not measured" in text and "device.gpus = 8" in text
    assert "measured on" not in text
    assert "8 GPUs per device" in " ".join(c.value for c in at.sidebar.caption)


# ---- 8 (issue 12). hostile uploads and heavy requests ---------------------------------------
def _profile(**change: Any) -> dict[str, Any]:
    d = load_sample("tiny-hybrid").to_dict()
    d.pop("source", None)
    for k, v in change.items():
        if k == "forward_ms":
            first = next(iter(d["layer_types"]))
            d["layer_types"][first]["forward_ms"] = v
        else:
            d[k] = v
    return d


BAD_PROFILES = {
    "int-1e400.json": json.dumps(_profile(forward_ms=0.5)).replace("0.5", "1" + "0" * 400, 1),
    "float-1e308.json": json.dumps(_profile(forward_ms=1e308)),
    "subnormal.json": json.dumps(_profile(forward_ms=5e-324)),
    "surrogate.json": json.dumps(_profile(name="\ud800x")),
    "huge-layers.json": json.dumps(_profile(layers=["mlp"] * 25_000)),
}


@pytest.mark.parametrize("name", list(BAD_PROFILES))
def test_bad_profile_uploads_are_in_page_errors_on_every_page(name: str) -> None:
    at = start("profile")
    body = BAD_PROFILES[name].encode("utf-8", "surrogatepass")
    at.file_uploader(key="upload_0").set_value((name, body, "application/json")).run()
    ok(at)
    assert len(at.error) == 1 and name in at.error[0].value
    assert "\n" not in at.error[0].value and "Traceback" not in at.error[0].value
    assert at.session_state["profile"].name == "nemotron-h-8b"
    for page in ALL_PAGES:
        if page == "profile":
            continue
        go(at, page)
        msgs = [e for e in errors(at) if name in e]
        assert len(msgs) == 1, (page, errors(at))
        assert "\n" not in msgs[0] and "refused" in msgs[0]


@pytest.mark.parametrize("page", ALL_PAGES)
def test_heavy_settings_are_refused_in_the_page_not_frozen(page: str) -> None:
    t0 = time.monotonic()
    at = start(page, sample="nemotron-h-56b", devices="59", microbatches="1000")
    assert time.monotonic() - t0 < 30
    msgs = [m.value for m in (*at.error, *at.warning) if "590,000 ops" in m.value]
    assert msgs and all("\n" not in m and "fix:" in m for m in msgs), page


def _long_profile(n: int) -> bytes:
    d = load_sample("tiny-hybrid").to_dict()
    d.pop("source", None)
    types = list(d["layer_types"])
    d["layers"] = [types[i % len(types)] for i in range(n)]
    d["name"] = f"long-{n}"
    return json.dumps(d).encode()


def test_long_profiles_are_refused_by_plan_pages_not_frozen() -> None:
    at = start("profile")
    at.file_uploader(key="upload_0").set_value(("long.json", _long_profile(5000), "x")).run()
    ok(at)
    assert not at.error and at.session_state["profile"].num_layers == 5000
    layer_chart = spec(at, "layer_chart")
    assert layer_chart["layout"]["meta"]["layers_per_bar"] == 4  # 1,250 bars, not 15,000
    for page in ("plan", "overview", "compare", "tune", "export", "cluster"):
        t0 = time.monotonic()
        go(at, page)
        assert time.monotonic() - t0 < 10, page
        msgs = [m.value for m in (*at.error, *at.warning) if "5,000 layers is over" in m.value]
        assert msgs and all("\n" not in m and "fix:" in m for m in msgs), page


def test_no_tuning_for_profiles_the_tuner_cannot_keep_its_budget_on() -> None:
    at = start("profile")
    at.file_uploader(key="upload_0").set_value(("long.json", _long_profile(300), "x")).run()
    ok(at)
    t0 = time.monotonic()
    go(at, "overview")
    assert time.monotonic() - t0 < 30
    assert at.subheader[0].value.startswith("best peer:")  # no quick tune at 300 layers
    go(at, "tune")
    assert at.button(key="tune_go").disabled
    assert any("300 layers is over the 200" in e for e in errors(at))
