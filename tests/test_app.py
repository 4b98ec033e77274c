"""AppTest (headless, no browser) tests of every dashboard page and of the main flow."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from octopipe_core.profile import load_sample, profile_to_csv

APP = str(Path(__file__).resolve().parent.parent / "app" / "streamlit_app.py")
TIMEOUT = 60


def start(page: str | None = None, **query: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    if page:
        at.switch_page(f"views/{page}.py")
        at.run()
        assert not at.exception, [e.value for e in at.exception]
    return at


def charts(at: AppTest) -> list:
    return list(at.get("plotly_chart"))


def metric(at: AppTest, label: str) -> float:
    m = next(m for m in at.metric if m.label == label)
    return float(m.value.split()[0].replace(",", ""))


def uploader(at: AppTest) -> object:
    return at.file_uploader(key=f"upload_{at.session_state['upload_ver']}")


def edit_rows(at: AppTest, key: str, rows: dict[int, dict[str, object]]) -> None:
    """Edit cells of the ``st.data_editor`` with ``key``, as a user would (applied on run)."""
    at.session_state[key] = {"edited_rows": rows, "added_rows": [], "deleted_rows": []}


def ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


# --------------------------------------------------------------------------------------------
def test_overview_shows_1f1b_against_a_better_plan() -> None:
    at = start()
    assert at.title[0].value == "OctoPipe"
    head = at.subheader[0].value
    assert "faster than 1F1B" in head
    from app.components import state, tuning

    if tuning.load_tuner()[0] is not None:
        assert head.startswith(state.AUTO_TUNED)
    # timelines, where the time goes, peak memory per device, memory curves
    assert [c.key for c in charts(at)] == [
        "gantt", "overview_every_block_where_time", "overview_every_block_where_peak", "memory"
    ]  # fmt: skip
    gantt = json.loads(charts(at)[0].proto.spec)
    titles = [a["text"] for a in gantt["layout"]["annotations"]]
    assert titles[0].startswith("1F1B") and len(titles) == 2
    assert not at.error


def test_profile_page_sample_switch_and_tables() -> None:
    at = start("profile")
    assert at.selectbox(key="_w_sample").value == "nemotron-h-8b"
    assert len(charts(at)) == 1
    at.selectbox(key="_w_sample").set_value("llama-3-8b").run()
    ok(at)
    assert at.session_state["profile"].name.lower().startswith("llama")
    assert "llama" in at.subheader[0].value.lower()
    assert [b.label for b in at.download_button] == [
        "Download profile (JSON)",
        "Download profile (CSV)",
    ]


@pytest.mark.parametrize(
    ("name", "body", "needle"),
    [
        ("bad.json", b'{"format": 1', "invalid JSON"),
        ("wrong.json", b'{"format": "octopipe.profile/v1", "name": "x"}', "tokens_per_microbatch"),
        ("bad.csv", b"layer,type,forward_ms\n0,mlp,abc\n", "bad.csv"),
        ("binary.json", b"\xff\xfe\x00garbage", "not UTF-8"),
    ],
)
def test_profile_upload_bad_file_shows_one_line_error(name: str, body: bytes, needle: str) -> None:
    at = start("profile")
    uploader(at).set_value((name, body, "application/octet-stream")).run()
    ok(at)
    assert len(at.error) == 1
    msg = at.error[0].value
    assert needle in msg and "\n" not in msg and "Traceback" not in msg
    assert at.session_state["profile"].name == "nemotron-h-8b"  # the old profile stays


def test_profile_upload_good_csv_and_edit_costs() -> None:
    at = start("profile")
    csv = profile_to_csv(load_sample("tiny-hybrid")).encode()
    uploader(at).set_value(("mine.csv", csv, "text/csv")).run()
    ok(at)
    assert not at.error
    assert at.session_state["profile_origin"] == "upload"
    prof = at.session_state["profile"]
    ver = at.session_state["profile_version"]
    before = prof.layer_types[1].forward_ms
    edit_rows(at, f"types_{ver}", {1: {"forward_ms": before * 2}})
    at.run()
    ok(at)
    assert not at.error
    assert at.session_state["profile_origin"] == "edited"
    assert at.session_state["profile"].layer_types[1].forward_ms == pytest.approx(before * 2)
    # back to the sample: the uploader is emptied, the upload is not applied again
    at.button[0].click().run()
    ok(at)
    assert at.session_state["profile_origin"] == "sample"
    assert uploader(at).value is None
    # an invalid edit (stash larger than the activation) is refused with a one-line error
    ver = at.session_state["profile_version"]
    edit_rows(at, f"types_{ver}", {1: {"w_stash_mib": 1e9}})
    at.run()
    ok(at)
    assert len(at.error) == 1 and "w_stash_mib" in at.error[0].value


def test_an_edit_keeps_the_backward_workspace_of_an_uploaded_profile() -> None:
    d = load_sample("tiny-hybrid").to_dict()
    name = d["layers"][-1]
    d["layer_types"][name]["workspace_mib"] = 640.0  # measured by octopipe profile
    at = start("profile")
    uploader(at).set_value(("measured.json", json.dumps(d).encode(), "application/json")).run()
    ok(at)
    assert not at.error and at.session_state["profile"].type_map()[name].workspace_mib == 640.0
    ver = at.session_state["profile_version"]
    edit_rows(at, f"types_{ver}", {0: {"forward_ms": 1.5}})
    at.run()
    ok(at)
    prof = at.session_state["profile"]
    assert at.session_state["profile_origin"] == "edited"
    assert prof.layer_types[0].forward_ms == 1.5 and prof.type_map()[name].workspace_mib == 640.0


def test_plan_page_simulates_1f1b_and_switches_schedule() -> None:
    at = start("plan")
    assert at.subheader[0].value.startswith("1f1b/uniform")
    step_1f1b = metric(at, "step time (ms)")
    assert len(charts(at)) >= 1
    at.selectbox(key="_w_schedule").set_value("zbv").run()
    ok(at)
    assert at.subheader[0].value.startswith("zbv/uniform")
    assert metric(at, "step time (ms)") < step_1f1b
    assert at.query_params["schedule"] == "zbv"
    assert at.query_params["sample"] == "nemotron-h-8b"


def test_plan_page_reads_query_params() -> None:
    at = start(
        sample="llama-3-8b", devices="4", microbatches="8", schedule="zb-h1", memory_gib="60"
    )
    at.switch_page("views/plan.py")
    at.run()
    ok(at)
    assert at.session_state["profile"].name.lower().startswith("llama")
    assert at.sidebar.number_input(key="_w_devices").value == 4
    assert at.sidebar.number_input(key="_w_microbatches").value == 8
    assert at.subheader[0].value.startswith("zb-h1/uniform")
    plan = json.loads(at.session_state["_plan_js_shown"])
    assert plan["num_devices"] == 4 and plan["num_microbatches"] == 8


def test_bad_query_params_warn_and_fall_back() -> None:
    at = start(devices="lots", schedule="nope")
    assert len(at.warning) == 2
    assert at.session_state["devices"] == 8 and at.session_state["schedule"] == "1f1b"


def test_plan_hand_edits_boundaries_devices_and_order() -> None:
    at = start("plan")
    ver = at.session_state["_edit_key"]
    # move the boundary between stages 0 and 1 one layer later
    edit_rows(at, f"stages_{ver}", {1: {"first layer": 8}})
    at.run()
    ok(at)
    assert not at.error
    plan = json.loads(at.session_state["_plan_js_shown"])
    assert plan["partition"][0] == [0, 8] and plan["name"].endswith("+edits")
    assert "hand-edited" in at.subheader[0].value
    # a bad boundary is refused with a message, the plan stays
    ver = at.session_state["_edit_key"]
    edit_rows(at, f"stages_{ver}", {2: {"first layer": 3}})
    at.run()
    ok(at)
    assert len(at.error) == 1 and "stage 1" in at.error[0].value
    # reorder: swap two actions on d0 into an order that contradicts the data dependencies
    ver = at.session_state["_edit_key"]
    area = at.text_area(key=f"order_{ver}_all devices")
    lines = area.value.splitlines()
    acts = lines[0].split()
    bad = [acts[0], acts[-1], *acts[1:-1]]
    at.text_area(key=f"order_{ver}_all devices").input("\n".join([" ".join(bad), *lines[1:]]))
    at.run()
    ok(at)
    assert any("contradict the data dependencies" in e.value for e in at.error)
    # a valid reorder: d0 runs the forward of micro-batch 1 before that of micro-batch 0
    ver = at.session_state["_edit_key"]
    before = json.loads(at.session_state["_plan_js_shown"])["schedule"][0].split()
    swapped = [acts[0], acts[2], acts[1], *acts[3:]]
    at.text_area(key=f"order_{ver}_all devices").input("\n".join([" ".join(swapped), *lines[1:]]))
    at.run()
    ok(at)
    assert not at.error
    after = json.loads(at.session_state["_plan_js_shown"])["schedule"][0].split()
    assert after[:2] == before[:2][::-1]


def test_plan_move_stage_to_other_device() -> None:
    at = start("plan", devices="4", microbatches="8")
    ver = at.session_state["_edit_key"]
    edit_rows(at, f"stages_{ver}", {3: {"device": 2}})
    at.run()
    ok(at)
    assert not at.error
    plan = json.loads(at.session_state["_plan_js_shown"])
    assert plan["placement"] == [0, 1, 2, 2]
    assert plan["schedule"][3] == ""


def test_tune_page_runs_the_tuner_and_keeps_the_plan() -> None:
    at = start("tune")
    at.slider(key="tune_budget").set_value(2)
    at.button(key="tune_go").click().run()
    ok(at)
    assert not at.error, [e.value for e in at.error]
    assert at.session_state["tuned"]["plan"]
    assert at.progress[0].value == 100
    assert "done" in at.progress[0].proto.text
    assert len(charts(at)) == 4  # timelines, where the time goes, peak memory, curves
    assert any(b.label == "Download tuned plan (JSON)" for b in at.download_button)


def test_tune_page_degrades_without_tuner(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "octopipe_core.tuner", None)
    at = start("tune")
    assert any("unavailable" in w.value for w in at.warning)
    assert at.button(key="tune_go").disabled


def test_stopped_tuner_keeps_best_plan_found() -> None:
    at = start("tune")
    # what a run interrupted by "Stop" leaves behind
    key = (at.session_state["profile_version"], 8, 32)
    from app.components import analysis
    from octopipe_core.schedules import build_plan

    plan = build_plan(at.session_state["profile"], "zbv", 8, 32)
    at.session_state["tune_running"] = True
    at.session_state["tune_partial"] = {"key": key, "plan": analysis.plan_json(plan)}
    at.run()
    ok(at)
    assert any("stopped early" in w.value for w in at.warning)
    assert at.session_state["tuned"]["plan"] == analysis.plan_json(plan)


def test_compare_views_timelines_sweep_diff() -> None:
    at = start("compare")
    picked = at.multiselect[0].value
    assert picked[0] == "1f1b/uniform" and len(picked) == 2
    from app.components import state, tuning

    if tuning.load_tuner()[0] is not None:  # 1F1B against a quick tuner run by default
        assert picked[1] == state.AUTO_TUNED
    assert len(at.table) == 1 and len(charts(at)) == 4
    at.segmented_control(key="compare_view").set_value("Sweep").run()
    ok(at)
    assert len(charts(at)) == 1 and len(at.dataframe) == 1
    at.radio(key="sweep_axis").set_value("devices").run()
    ok(at)
    at.segmented_control(key="compare_view").set_value("Plan diff").run()
    ok(at)
    assert len(at.dataframe) >= 2  # layer moves and per-device changes (+ the stage view)
    assert any("layer range" in m.value or "same device" in m.value for m in at.markdown)
    assert any("stages changed" in m.value for m in at.markdown)


def test_compare_reads_schedule_from_url() -> None:
    at = start(schedule="zb-h2", microbatches="16")
    at.switch_page("views/compare.py")
    at.run()
    ok(at)
    assert at.multiselect[0].value == ["1f1b/uniform", "plan page: zb-h2/uniform"]
    assert at.query_params["schedule"] == "zb-h2"


def test_export_page_offers_job_csv_trace_and_plan() -> None:
    at = start("export")
    labels = [b.label for b in at.download_button]
    assert "Download plan (JSON, profile embedded)" in labels
    assert "Download runnable job (zip)" in labels
    assert "Download PyTorch schedule (CSV)" in labels
    assert "Download Chrome trace (JSON)" in labels
    assert any("launch.sh" in c.value for c in at.code)


def test_export_degrades_without_exporter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "octopipe_core.executor.export", None)
    at = start("export")
    assert [b.label for b in at.download_button] == ["Download plan (JSON, profile embedded)"]
    assert any("Only the plan JSON" in w.value for w in at.warning)


def test_main_flow_sample_plan_tune_compare_export() -> None:
    """Load a sample, simulate 1F1B, tune, compare, export, then upload a bad file."""
    at = start("profile")
    at.selectbox(key="_w_sample").set_value("nemotron-h-8b").run()
    at.switch_page("views/plan.py")
    at.run()
    ok(at)
    assert at.subheader[0].value.startswith("1f1b/uniform")
    at.switch_page("views/tune.py")
    at.run()
    at.slider(key="tune_budget").set_value(2)
    at.button(key="tune_go").click().run()
    ok(at)
    assert at.session_state["tuned"]
    at.switch_page("views/compare.py")
    at.run()
    ok(at)
    assert at.multiselect[0].value == ["1f1b/uniform", "tuned"]
    at.switch_page("views/overview.py")
    at.run()
    ok(at)
    assert "tuned is" in at.subheader[0].value
    at.switch_page("views/export.py")
    at.run()
    ok(at)
    assert at.selectbox(key="export_pick").value == "tuned"
    assert "Download runnable job (zip)" in [b.label for b in at.download_button]
    at.switch_page("views/profile.py")
    at.run()
    uploader(at).set_value(("oops.json", b"[1, 2]", "application/json")).run()
    ok(at)
    assert len(at.error) == 1 and "oops.json" in at.error[0].value


@pytest.mark.parametrize("page", ["overview", "plan", "tune", "compare", "export"])
@pytest.mark.parametrize(
    "query",
    [{"devices": "64"}, {"schedule": "dualpipev", "microbatches": "4"}, {"memory_gib": "10"}],
    ids=["more-devices-than-layers", "dualpipev-too-few-microbatches", "tiny-memory-cap"],
)
def test_impossible_settings_show_messages_not_tracebacks(page: str, query: dict) -> None:
    at = start(None, **query)
    if page != "overview":
        at.switch_page(f"views/{page}.py")
        at.run()
    if page == "tune":
        at.slider(key="tune_budget").set_value(1)
        at.button(key="tune_go").click().run()
    ok(at)
    if query.get("devices") == "64":
        assert at.error and "fix:" in at.error[0].value


def test_plan_page_raster_toggle_and_memory_chart() -> None:
    at = start("plan", devices="16", microbatches="64")
    spec = json.loads(charts(at)[0].proto.spec)
    assert {t["type"] for t in spec["data"]} >= {"heatmap"}  # > 3,000 blocks: a raster
    assert any("screen resolution" in c.value for c in at.caption)
    at.checkbox(key="plan_every_block").check().run()
    ok(at)
    spec = json.loads(charts(at)[0].proto.spec)
    assert {t["type"] for t in spec["data"]} == {"bar"}
    assert len(charts(at)) == 3  # timeline, where the time goes, peak memory
    at.toggle(key="plan_memory").set_value(True).run()
    ok(at)
    assert len(charts(at)) == 4
    mem = json.loads(charts(at)[-1].proto.spec)
    assert mem["layout"]["yaxis"]["title"]["text"] == "memory (GiB)"


def test_hand_edit_survives_memory_cap_change_not_schedule_change() -> None:
    at = start("plan")
    ver = at.session_state["_edit_key"]
    edit_rows(at, f"stages_{ver}", {1: {"first layer": 8}})
    at.run()
    assert json.loads(at.session_state["_plan_js_shown"])["name"].endswith("+edits")
    at.sidebar.number_input(key="_w_memory_gib").set_value(64.0).run()
    ok(at)
    assert json.loads(at.session_state["_plan_js_shown"])["name"].endswith("+edits")
    at.selectbox(key="_w_schedule").set_value("gpipe").run()
    ok(at)
    assert json.loads(at.session_state["_plan_js_shown"])["name"] == "gpipe/uniform"
    assert any("hand-edited plan is kept" in i.value for i in at.info)
    at.selectbox(key="_w_schedule").set_value("1f1b").run()  # back: the edit is restored
    ok(at)
    assert json.loads(at.session_state["_plan_js_shown"])["name"].endswith("+edits")
