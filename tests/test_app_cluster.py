"""AppTest (headless) tests of the dashboard's cluster pages, plus their pure helpers and charts.

Small budgets keep each case to seconds: the 1x8 sample for rankings (2 s) and scaling (two GPU
counts at 1 s each), the 16x8 sample for layouts.
"""

from __future__ import annotations

import doctest
import json

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from app.components import charts, cluster_charts, cluster_data
from octopipe_core.cluster import example_cluster_dict, load_cluster_sample
from octopipe_core.errors import OctoPipeError
from octopipe_core.layout import deploy
from octopipe_core.profile import load_sample
from octopipe_core.schedules import build_plan
from octopipe_core.simulator import simulate
from tests.dash_helpers import metric, ok, start

C16 = "16x8-h800-ib400"


def labels(at: AppTest) -> list[str]:
    return [m.label for m in at.metric]


def number(at: AppTest, label: str) -> object:
    return next(n for n in at.number_input if n.label == label)


def charts_of(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


# --------------------------------------------------------------------------------------------
# The picker and the layout
def test_flat_network_by_default() -> None:
    at = start("plan")
    assert at.sidebar.selectbox(key="_w_cluster").value == "none"
    assert "GPUs" not in labels(at)
    assert at.session_state["profile"].deployment is None
    assert "cluster" not in at.query_params and "dp" not in at.query_params
    # the timeline has no DP strip and no inter-node transfers
    names = {t.get("name") for t in charts_of(at)[0]["data"]}
    assert "DP gradient reduction" not in names
    assert not any("inter-node" in str(n) for n in names)


def test_picking_a_sample_and_changing_the_layout_change_the_metrics() -> None:
    at = start("plan")
    flat_step = metric(at, "step time (ms)")
    at.sidebar.selectbox(key="_w_cluster").set_value(C16).run()
    ok(at)
    assert metric(at, "GPUs") == 8  # TP1 x PP8 x DP1
    assert metric(at, "grad sync (ms, all devices)") == 0  # no data parallelism yet
    one_replica = metric(at, "step time (ms)")
    assert one_replica != flat_step  # NVLink links, optimizer step: not the flat network
    at.sidebar.number_input(key="_w_dp").set_value(4).run()
    ok(at)
    assert metric(at, "GPUs") == 32
    assert metric(at, "grad sync (ms, all devices)") > 0
    assert metric(at, "inter-node boundaries") > 0  # Megatron's order spreads the pipeline
    peak = metric(at, "peak memory (GiB)")
    at.sidebar.checkbox(key="_w_zero1").check().run()
    ok(at)
    assert metric(at, "peak memory (GiB)") < peak  # optimizer state sharded over DP
    at.sidebar.selectbox(key="_w_order").set_value("tp-pp-dp").run()
    ok(at)
    assert metric(at, "inter-node boundaries") == 0  # each pipeline inside one node
    # the timeline: transfers across nodes and a DP strip per device
    at.sidebar.selectbox(key="_w_order").set_value("tp-dp-pp").run()
    names = {t.get("name") for t in charts_of(at)[0]["data"]}
    assert {"DP gradient reduction", "ZeRO-1 parameter all-gather"} <= names
    assert "send activation (inter-node)" in names


def test_layout_that_does_not_fit_is_an_error_in_the_page() -> None:
    at = start("plan", cluster="1x8-h800", dp="2")  # 8 devices x 2 replicas > 8 GPUs
    assert any("needs 16 GPUs" in e.value and "fix:" in e.value for e in at.error)
    assert "GPUs" not in labels(at)  # simulated on the flat network meanwhile
    at.sidebar.number_input(key="_w_dp").set_value(1).run()
    ok(at)
    assert not at.error and metric(at, "GPUs") == 8


@pytest.mark.parametrize(
    ("name", "body", "needle"),
    [
        ("bad.json", b'{"format": ', "invalid JSON"),
        ("zero.json", json.dumps({**example_cluster_dict(), "nodes": 0}).encode(), "nodes"),
        ("binary.json", b"\xff\xfe\x00", "not UTF-8"),
    ],
)
def test_cluster_upload_bad_file_shows_one_line_error(name: str, body: bytes, needle: str) -> None:
    at = start("cluster")
    at.file_uploader(key="cluster_upload").set_value((name, body, "application/json")).run()
    ok(at)
    assert len(at.error) == 1
    msg = at.error[0].value
    assert needle in msg and name in msg and "\n" not in msg and "Traceback" not in msg
    assert at.session_state["cluster"] == "none"  # nothing changed


def test_cluster_upload_and_editor() -> None:
    at = start("cluster")
    assert any("No cluster" in i.value for i in at.info)
    body = json.dumps(example_cluster_dict()).encode()  # 2 nodes x 8 GPUs
    at.file_uploader(key="cluster_upload").set_value(("mine.json", body, "application/json"))
    at.run()
    ok(at)
    assert not at.error
    assert at.session_state["cluster"] == "custom"
    assert at.session_state["cluster_custom"].name == "example-2x8"
    assert at.session_state["_w_cluster"] == "custom"
    assert "custom: example-2x8" in at.sidebar.selectbox(key="_w_cluster").options
    assert any("example-2x8" in m.value for m in at.markdown)
    at.sidebar.number_input(key="_w_dp").set_value(2).run()
    ok(at)
    assert metric(at, "GPUs") == 16 and metric(at, "inter-node boundaries") == 1
    step = metric(at, "step time (ms)")
    # a slower inter-node link slows the boundary transfer that crosses nodes
    number(at, "inter-node bandwidth (GB/s per GPU)").set_value(0.5)
    at.button(key="ce_apply").click().run()
    ok(at)
    assert at.session_state["cluster_custom"].name == "example-2x8-edited"
    assert at.session_state["cluster_custom"].inter_node.bandwidth_gbytes_per_s == 0.5
    assert metric(at, "step time (ms)") > step
    # one node is too small for 8 devices x 2 replicas: the page says so
    number(at, "nodes").set_value(1)
    at.button(key="ce_apply").click().run()
    ok(at)
    assert any("needs 16 GPUs" in e.value for e in at.error)
    # a bad value in the editor is refused with the field named
    number(at, "GPUs per node").set_value(2000)
    at.button(key="ce_apply").click().run()
    ok(at)
    assert any("gpus_per_node" in e.value for e in at.error)
    assert at.session_state["cluster_custom"].gpus_per_node == 8


# --------------------------------------------------------------------------------------------
# Layouts: ranking and scaling
def test_layouts_page_without_a_cluster_says_how() -> None:
    at = start("layouts")
    assert any("pick a cluster" in i.value for i in at.info)
    assert not at.get("plotly_chart")


def test_rank_layouts_table_chart_and_open_best() -> None:
    at = start("layouts", cluster="1x8-h800")
    at.slider(key="rank_budget").set_value(2)
    at.button(key="rank_go").click().run()
    ok(at)
    assert not at.error
    assert at.progress[0].value == 100
    table = at.dataframe[0].value
    assert len(table) >= 2
    fits = table[table["fits"]]
    assert len(fits) >= 1 and fits["tokens/GPU/s"].min() > 0
    assert table["fits"].iloc[0]  # fitting layouts first
    over = table[~table["fits"]]
    assert (over["why (if it does not fit)"].str.len() > 0).all()  # each says why
    assert set(table["layout"].str.extract(r"TP(\d+)")[0]) == {"1"}  # TP is the profile's
    bars = charts_of(at)[0]
    assert bars["layout"]["yaxis"]["title"]["text"] == "tokens/GPU/s"
    assert sum(len(t["x"]) for t in bars["data"]) == len(table)
    best = at.session_state["cluster_rank"]["best"]
    at.button(key="rank_open").click().run()
    ok(at)
    # the Plan page shows the best plan, on its layout, at the ranked step time
    assert "from the layout ranking" in at.subheader[0].value
    lay = best["layout"]
    assert at.session_state["devices"] == lay["pp"] and at.session_state["dp"] == lay["dp"]
    assert metric(at, "GPUs") == lay["tp"] * lay["pp"] * lay["dp"]
    assert metric(at, "step time (ms)") == pytest.approx(best["step_time_ms"], abs=0.06)
    assert at.query_params["dp"] == str(lay["dp"])


def test_scaling_chart() -> None:
    at = start("layouts", cluster="1x8-h800")
    at.segmented_control(key="layouts_view").set_value("Scaling").run()
    ok(at)
    at.multiselect(key="scale_gpus_8").set_value([8, 16])
    at.button(key="scale_go").click().run()
    ok(at)
    assert not at.error
    fig = charts_of(at)[0]
    assert [t["name"] for t in fig["data"]] == ["1F1B (uniform)", "best peer", "OctoPipe tuned"]
    assert list(fig["data"][2]["x"]) == [8, 16]
    assert all(y > 0 for y in fig["data"][2]["y"])
    table = at.dataframe[0].value
    assert list(table["GPUs"]) == [8, 16]
    assert (table["tuned tokens/GPU/s"] >= table["1F1B tokens/GPU/s"] * 0.999).all()
    at.radio(key="scale_kind").set_value("weak").run()
    at.button(key="scale_go").click().run()
    ok(at)
    assert "weak scaling" in charts_of(at)[0]["layout"]["title"]["text"]


# --------------------------------------------------------------------------------------------
# Shareable URLs
def test_url_round_trip_restores_cluster_and_layout() -> None:
    q = {"cluster": C16, "dp": "4", "zero1": "1", "order": "tp-pp-dp", "devices": "8"}
    at = start("plan", **q)
    assert at.sidebar.selectbox(key="_w_cluster").value == C16
    assert at.sidebar.number_input(key="_w_dp").value == 4
    assert at.sidebar.checkbox(key="_w_zero1").value is True
    assert at.sidebar.selectbox(key="_w_order").value == "tp-pp-dp"
    shared = dict(at.query_params)
    assert {k: shared[k] for k in q} == q
    step, gpus = metric(at, "step time (ms)"), metric(at, "GPUs")
    # the written URL, opened fresh, shows the same view
    again = start("plan", **shared)
    assert metric(again, "step time (ms)") == step and metric(again, "GPUs") == gpus == 32
    assert dict(again.query_params) == shared
    # the flat network writes no cluster parameters
    again.sidebar.selectbox(key="_w_cluster").set_value("none").run()
    assert "cluster" not in again.query_params and "GPUs" not in labels(again)


def test_bad_cluster_url_params_warn() -> None:
    at = start("plan", cluster="mars", dp="0", zero1="maybe", order="pp-first")
    assert len(at.warning) == 4
    assert at.session_state["cluster"] == "none" and at.session_state["dp"] == 1


# --------------------------------------------------------------------------------------------
# Other pages on a cluster
def test_compare_sweep_and_export_on_a_cluster() -> None:
    at = start("compare", cluster=C16, dp="2")
    ok(at)
    at.segmented_control(key="compare_view").set_value("Sweep").run()
    at.radio(key="sweep_axis").set_value("devices").run()
    ok(at)
    sweep = at.dataframe[0].value
    assert {1, 2, 4, 8} <= set(sweep["devices"])  # the layout follows PP = devices
    at.switch_page("views/export.py")
    at.run()
    ok(at)
    assert "Download plan (JSON, profile embedded)" in [b.label for b in at.download_button]


def test_tune_on_a_cluster_keeps_its_plan_per_layout() -> None:
    at = start("tune", cluster=C16, dp="4", devices="4", microbatches="8")
    assert any("16x8-h800-ib400" in c.value for c in at.caption)
    at.slider(key="tune_budget").set_value(1)
    at.button(key="tune_go").click().run()
    ok(at)
    assert not at.error and at.session_state["tuned"]["plan"]
    assert metric(at, "GPUs") == 16
    # the tuned plan belongs to that layout: another DP degree asks for a new run
    at.sidebar.number_input(key="_w_dp").set_value(2).run()
    ok(at)
    assert any("No tuned plan" in i.value for i in at.info)


# --------------------------------------------------------------------------------------------
# Pure helpers and charts
def _cluster_timeline(devices: int = 8, mbs: int = 16) -> pd.DataFrame:
    prof = deploy(load_sample("nemotron-h-8b"), load_cluster_sample(C16), devices, 4, zero1=True)
    return simulate(prof, build_plan(prof, "1f1b", devices, mbs)).timeline()


def test_gantt_draws_inter_node_transfers_and_dp_lane() -> None:
    tl = _cluster_timeline()
    fig = charts.gantt_figure(tl)
    by_name = {t.name: t for t in fig.data}
    cross = by_name["send activation (inter-node)"]
    assert cross.marker.color != by_name["send activation"].marker.color
    n_cross = int(((tl["kind"] == "send_F") & tl["layers"].str.endswith("(inter-node)")).sum())
    assert len(cross.x) == n_cross > 0
    dp = by_name["DP gradient reduction"]
    n_dp = int((tl["kind"] == "grad_sync").sum())
    assert len(dp.x) == n_dp == 8
    # the DP strip sits below the comm strip, below the compute lane, inside the device's row
    dev = tl[tl["kind"] == "grad_sync"]["device"].to_numpy()
    offsets = sorted({round(float(y - d), 3) for y, d in zip(dp.y, dev, strict=True)})
    lanes = charts.DP_LANES
    assert offsets == [lanes.dp_offset]
    assert -lanes.compute_shift < lanes.comm_offset < lanes.dp_offset < 0.5
    assert "optimizer step" in by_name


def test_gantt_raster_keeps_dp_bars() -> None:
    tl = _cluster_timeline(16, 64)
    fig = charts.gantt_figure(tl, max_bars=100)
    types = [t.type for t in fig.data]
    assert types[:2] == ["heatmap", "heatmap"]
    names = {t.name for t in fig.data if t.type == "bar"}
    assert {"DP gradient reduction", "optimizer step", "send activation (inter-node)"} <= names
    comm = fig.data[1]
    assert len(comm.z) == 3 * 16  # comm strip, blank DP band, clear gap per device


def test_flat_gantt_is_unchanged() -> None:
    prof = load_sample("nemotron-h-8b")
    tl = simulate(prof, build_plan(prof, "1f1b", 8, 16)).timeline()
    fig = charts.gantt_figure(tl)
    assert {t.name for t in fig.data} == {
        "F (forward)", "BW (fused backward)", "send activation", "send gradient"
    }  # fmt: skip
    f = next(t for t in fig.data if t.name == "F (forward)")
    assert f.width == charts.COMPUTE_WIDTH
    raster = charts.gantt_figure(tl, max_bars=10)
    assert len(raster.data[1].z) == 2 * 8


def test_edited_cluster_validates() -> None:
    base = load_cluster_sample("1x8-h800")
    c = cluster_data.edited_cluster(base, {"nodes": 4, "intra_lat": 2.0})
    assert c.total_gpus == 32 and c.intra_node.latency_us == 2.0
    assert cluster_data.edited_cluster(c, {}).name == c.name  # no "-edited-edited"
    with pytest.raises(OctoPipeError, match=r"inter_node\.bandwidth_gbytes_per_s"):
        cluster_data.edited_cluster(base, {"inter_bw": 0.0})


def test_redeploy_and_placement() -> None:
    prof = deploy(load_sample("tiny-hybrid"), load_cluster_sample(C16), 4, 8, order="tp-pp-dp")
    again = cluster_data.redeploy(prof, 2)
    assert again.deployment.layout.pp == 2 and again.deployment.layout.dp == 8
    assert again.deployment.layout.order == "tp-pp-dp"
    frame = cluster_data.placement_frame(prof.deployment, max_replicas=2)
    assert list(frame["replica 0"]) == [f"node 0 · GPU {g}" for g in range(4)]
    assert frame["replica 1"].iloc[0] == "node 0 · GPU 4"
    with pytest.raises(OctoPipeError, match="needs"):
        cluster_data.redeploy(prof, 32)  # 32 x 8 = 256 GPUs > 128
    # the cache key ignores the links a deployment memoises as it is used
    key = cluster_data.profile_cache_key(prof)
    prof.deployment.p2p_link(0, 1)
    assert cluster_data.profile_cache_key(prof) == key


def test_rank_and_scaling_figures() -> None:
    rows = [
        {"layout": "TP1 x PP2 x DP4", "order": "tp-dp-pp", "microbatches": 8, "schedule": "s",
         "step_time_ms": 5.0, "tokens_per_gpu_per_s": 10.0, "peak_memory_gib": 1.0,
         "fits_memory": True, "why": ""},
        {"layout": "TP1 x PP1 x DP8", "order": "tp-dp-pp", "microbatches": 4, "schedule": "s",
         "step_time_ms": 4.0, "tokens_per_gpu_per_s": 12.0, "peak_memory_gib": 99.0,
         "fits_memory": False, "why": "over the cap"},
        {"layout": "TP1 x PP8 x DP1", "order": "tp-dp-pp", "microbatches": 4, "schedule": "",
         "step_time_ms": None, "tokens_per_gpu_per_s": 0.0, "peak_memory_gib": 0.0,
         "fits_memory": False, "why": "no peer schedule"},
    ]  # fmt: skip
    fig = cluster_charts.rank_figure(rows)
    assert [t.name for t in fig.data] == ["fits memory", "over the cap"]
    assert list(fig.data[1].y) == [12.0]
    assert len(cluster_data.rank_frame(rows)) == 3  # the table keeps every row
    assert cluster_data.gpu_choices(4, 32) == [4, 8, 16, 32]


@pytest.mark.parametrize(
    "page", ["overview", "plan", "tune", "compare", "export", "cluster", "layouts"]
)
def test_layout_too_large_for_the_cluster_on_every_page(page: str) -> None:
    """64 devices on one 8-GPU node: every page says so in the page, none shows a traceback."""
    at = start(page, cluster="1x8-h800", devices="64", microbatches="8")
    assert any("needs 64 GPUs" in e.value for e in at.error)


@pytest.mark.parametrize("module", [cluster_data, cluster_charts])
def test_docstring_examples_of_the_cluster_helpers(module: object) -> None:
    assert doctest.testmod(module).failed == 0  # type: ignore[arg-type]
