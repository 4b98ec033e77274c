"""Real-browser tests: the dashboard served by Streamlit, driven in headless Debian Chromium.

Skipped when ``chromium`` is not on PATH. Screenshots land in ``test-artifacts/`` (gitignored).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = shutil.which("chromium")
LOAD_TIMEOUT_MS = 90_000

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium not installed"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    port = free_port()
    ARTIFACTS.mkdir(exist_ok=True)
    log = open(ARTIFACTS / "e2e-server.log", "w")  # noqa: SIM115
    cmd = [
        sys.executable, "-m", "streamlit", "run", "app/streamlit_app.py",
        "--server.headless=true", "--server.address=127.0.0.1", f"--server.port={port}",
        "--browser.gatherUsageStats=false", "--server.fileWatcherType=none",
        "--client.toolbarMode=viewer",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"streamlit server did not start; see {log.name}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        b = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox", "--headless", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run",
            ],
        )  # fmt: skip
        yield b
        b.close()


def open_page(browser: object, height: int, **context: object) -> tuple[object, object]:
    """A new browser context (its page 1500 px wide, motion reduced: Chromium draws Streamlit's
    transitions in software here) and its page; the caller closes the context."""
    ctx = browser.new_context(
        viewport={"width": 1500, "height": height}, reduced_motion="reduce", **context
    )
    pg = ctx.new_page()
    pg.set_default_timeout(LOAD_TIMEOUT_MS)
    return ctx, pg


@pytest.fixture(scope="module")
def context(browser: object) -> Iterator[object]:
    """One browser context for the module's pages: its HTTP cache keeps the app's scripts
    between tests (a new context per test fetched and compiled them again each time)."""
    ctx, pg = open_page(browser, 2000, accept_downloads=True)
    pg.close()
    yield ctx
    ctx.close()


@pytest.fixture
def page(context: object) -> Iterator[object]:
    pg = context.new_page()
    pg.set_default_timeout(LOAD_TIMEOUT_MS)
    yield pg
    pg.close()


def wait_idle(page: object, settle_ms: int = 400) -> None:
    """Wait until the script has finished its (re)run and the page has painted."""
    page.wait_for_timeout(settle_ms)
    page.wait_for_selector("[data-testid='stApp'][data-test-script-state='notRunning']")
    page.wait_for_timeout(200)


def charts_drawn(page: object, n: int) -> None:
    page.wait_for_function(
        "n => document.querySelectorAll(\"[data-testid='stPlotlyChart'] .main-svg\").length >= n",
        arg=n,
    )


def legend_shows(page: object, *names: str) -> list[str]:
    """Wait until every chart legend entry in ``names`` is drawn (a chart's traces can arrive
    a moment after its first SVG); return all legend texts."""
    for name in names:
        page.locator(".legendtext", has_text=name).first.wait_for()
    return page.locator(".legendtext").all_text_contents()


def no_exception(page: object) -> None:
    assert page.get_by_test_id("stException").count() == 0


def nav(page: object, title: str) -> None:
    page.get_by_test_id("stSidebarNav").get_by_text(title, exact=True).click()
    wait_idle(page)


def shot(page: object, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"e2e-{name}.png"))


def test_landing_page_shows_the_point(server: str, page: object) -> None:
    page.goto(server)
    wait_idle(page)
    page.get_by_text("faster than 1F1B").wait_for()
    charts_drawn(page, 4)
    # timelines, where the time goes, peak memory per device, memory curves
    assert page.get_by_test_id("stPlotlyChart").count() == 4
    # one lane per device in the Gantt, the cap drawn on the memory chart
    assert page.locator(".main-svg").first.is_visible()
    assert page.get_by_text("cap 80 GiB").count() >= 1
    no_exception(page)
    shot(page, "overview")
    # hover a block of the last device's lane in the first (1F1B) panel
    box = page.locator(".draglayer .xy .nsewdrag").first.bounding_box()
    lane = (7 - 0.08 + 0.5) / 8
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * lane)
    tip = page.locator(".hoverlayer .hovertext").first
    tip.wait_for()
    text = tip.text_content()
    assert "stage 7" in text and "micro-batch" in text and "layers" in text
    # the hover gives start–end and the duration, not the end time twice
    lines = tip.locator("tspan.line").all_text_contents()
    m = next((re.fullmatch(r"([\d.]+)–([\d.]+) ms \(([\d.]+) ms\)", x) for x in lines
              if x.endswith("ms)")), None)  # fmt: skip
    assert m, lines
    start_ms, end_ms, dur_ms = (float(x) for x in m.groups())
    assert dur_ms == pytest.approx(end_ms - start_ms, abs=0.02) and dur_ms < start_ms
    page.locator("[data-testid='stPlotlyChart']").first.screenshot(
        path=str(ARTIFACTS / "e2e-overview-hover.png")
    )


def test_main_flow_upload_plan_tune_compare_export(server: str, page: object) -> None:
    bad = ARTIFACTS / "bad-profile.json"
    bad.write_text('{"format": "octopipe.profile/v1", "name": ')
    page.goto(f"{server}/profile")
    wait_idle(page)
    page.get_by_test_id("stFileUploaderDropzoneInput").set_input_files(str(bad))
    wait_idle(page)
    err = page.get_by_test_id("stAlertContentError")
    err.wait_for()
    assert "invalid JSON" in err.inner_text()
    no_exception(page)
    shot(page, "profile-bad-upload")

    nav(page, "Plan")
    page.get_by_text("1f1b/uniform").first.wait_for()
    charts_drawn(page, 1)
    no_exception(page)
    shot(page, "plan")

    nav(page, "Tune")
    # the shortest budget (1 s, from the keyboard): the flow is under test here, not the tuner
    budget = page.get_by_test_id("stSlider").filter(has_text="time budget (s)")
    budget.get_by_role("slider").press("Home")
    wait_idle(page)
    assert budget.get_by_test_id("stSliderThumbValue").inner_text() == "1"
    page.get_by_role("button", name="Run tuner").click()
    page.get_by_text("Tuned plan: ").wait_for()
    wait_idle(page)
    charts_drawn(page, 2)
    no_exception(page)
    shot(page, "tune")

    nav(page, "Compare")
    charts_drawn(page, 2)
    assert page.get_by_text("tuned: step").count() >= 1
    no_exception(page)
    shot(page, "compare")

    nav(page, "Export")
    button = page.get_by_test_id("stDownloadButton").filter(has_text="runnable job")
    button.wait_for()
    with page.expect_download() as dl:
        button.get_by_role("button").click()
    target = ARTIFACTS / dl.value.suggested_filename
    dl.value.save_as(target)
    assert target.suffix == ".zip"
    with zipfile.ZipFile(target) as zf:
        names = {Path(n).name for n in zf.namelist()}
    assert {"launch.sh", "executor_config.json", "schedule.csv", "plan.json"} <= names
    no_exception(page)
    shot(page, "export")


def test_stop_keeps_best_plan_found(server: str, page: object) -> None:
    page.goto(f"{server}/tune?devices=16&microbatches=64")
    wait_idle(page)
    page.get_by_role("button", name="Run tuner").click()
    page.get_by_text("best step time so far").wait_for()
    page.get_by_role("button", name="Stop (keep best so far)").click()
    page.get_by_text("Tuning stopped early").wait_for()
    wait_idle(page)
    page.get_by_text("Tuned plan: ").wait_for()
    charts_drawn(page, 2)
    no_exception(page)
    shot(page, "tune-stopped")


def test_shared_url_opens_that_view(server: str, page: object) -> None:
    page.goto(f"{server}/plan?sample=nemotron-h-8b&devices=8&microbatches=32&schedule=zbv")
    wait_idle(page)
    page.get_by_text("zbv/uniform").first.wait_for()
    charts_drawn(page, 1)
    assert "schedule=zbv" in page.url
    no_exception(page)


@pytest.mark.skipif(os.environ.get("OCTOPIPE_E2E_LARGE") == "0", reason="large case disabled")
def test_large_plan_draws(server: str, page: object) -> None:
    page.goto(f"{server}/plan?sample=nemotron-h-56b&devices=64&microbatches=256&schedule=1f1b")
    wait_idle(page)
    charts_drawn(page, 1)
    page.get_by_text("1f1b/uniform: step").first.wait_for()
    no_exception(page)
    shot(page, "plan-p64-m256")
    # the raster keeps hover: the middle of the pipeline is busy on every device
    box = page.locator(".draglayer .xy .nsewdrag").first.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.45, box["y"] + box["height"] * 0.5)
    tip = page.locator(".hoverlayer .hovertext").first
    tip.wait_for()
    assert "micro-batch" in tip.text_content() and "layers" in tip.text_content()


def docs_shot(page: object, name: str, **kw: object) -> None:
    """Also save a screenshot for the README when ``OCTOPIPE_DOCS_SCREENSHOTS`` names a folder
    (``OCTOPIPE_DOCS_SCREENSHOTS=docs/screenshots pytest tests/test_e2e_dashboard.py -k
    cluster`` refreshes docs/screenshots/)."""
    folder = os.environ.get("OCTOPIPE_DOCS_SCREENSHOTS")
    if folder:
        target = ROOT / folder
        target.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(target / f"{name}.png"), **kw)


def test_cluster_page_and_ranked_layouts(server: str, page: object) -> None:
    page.goto(f"{server}/cluster?cluster=16x8-h800-ib400&dp=4&zero1=1&devices=8&microbatches=16")
    wait_idle(page)
    page.get_by_text("on TP1 x PP8 x DP4 zero1, 16x8-h800-ib400").wait_for()
    charts_drawn(page, 1)
    # the metric row can still be redrawing after the first chart (a loaded machine caught
    # it without "GPUs" once): wait for each label, then read them all
    labels = page.get_by_test_id("stMetricLabel")
    for name in ("GPUs", "exposed tail (ms)", "inter-node boundaries"):
        labels.get_by_text(name, exact=True).first.wait_for()
    metrics = [t.strip() for t in labels.all_inner_texts()]
    assert {"GPUs", "exposed tail (ms)", "inter-node boundaries"} <= set(metrics)
    # the timeline's legend names the inter-node transfers and the DP stream
    legend = legend_shows(page, "send activation (inter-node)", "DP gradient reduction")
    assert "send activation (inter-node)" in legend and "DP gradient reduction" in legend
    no_exception(page)
    shot(page, "cluster")
    docs_shot(page, "cluster-timeline", full_page=False)

    nav(page, "Layouts")
    page.get_by_role("button", name="Rank layouts").click()
    page.get_by_text("Open the best plan in the Plan page").wait_for()
    wait_idle(page)
    page.get_by_text("layouts of 16 GPUs on 16x8-h800-ib400").wait_for()
    assert page.get_by_test_id("stDataFrame").first.is_visible()
    charts_drawn(page, 1)
    assert page.get_by_text("throughput per layout").count() >= 1
    no_exception(page)
    shot(page, "layouts")
    docs_shot(page, "cluster", full_page=False)

    page.get_by_role("button", name="Open the best plan in the Plan page").click()
    page.get_by_text("from the layout ranking").wait_for()
    wait_idle(page)
    assert "dp=" in page.url and "cluster=16x8-h800-ib400" in page.url
    charts_drawn(page, 1)
    no_exception(page)


def docs_element(locator: object, name: str) -> None:
    """Also save an element's screenshot for the README (see ``docs_shot``)."""
    folder = os.environ.get("OCTOPIPE_DOCS_SCREENSHOTS")
    if folder:
        (ROOT / folder).mkdir(parents=True, exist_ok=True)
        locator.screenshot(path=str(ROOT / folder / f"{name}.png"))


def chart(page: object, n: int) -> object:
    return page.get_by_test_id("stPlotlyChart").nth(n)


def test_views_a_performance_engineer_expects(server: str, page: object) -> None:
    """Where the time goes, the critical path, a V's chunks, SVG download, the plan diff by
    layers, sweeps over the cap and a run's trace over the simulated timeline; the shared URL
    keeps the partition."""
    page.goto(f"{server}/plan?devices=8&microbatches=16&schedule=zbv&partition=balanced&critical=1")
    wait_idle(page)
    page.get_by_text("zbv/balanced").first.wait_for()
    charts_drawn(page, 3)
    assert "partition=balanced" in page.url and "critical=1" in page.url
    legend = legend_shows(page, "critical path", "2nd chunk", "over the cap")
    assert "critical path" in legend
    assert any("2nd chunk" in t for t in legend)
    assert {"busy (compute)", "waiting on transfers", "over the cap"} <= set(legend)
    page.get_by_text("Where the time goes").wait_for()
    assert page.get_by_text("Over the memory cap").count() == 1
    no_exception(page)
    shot(page, "views-plan")
    docs_element(chart(page, 0), "critical-path")
    where = page.get_by_test_id("stHorizontalBlock").filter(has_text="Where the time goes")
    docs_element(where.last, "where-the-time-goes")
    # the camera button saves the chart as SVG, drawn in the browser
    chart(page, 0).hover()
    with page.expect_download() as dl:
        chart(page, 0).locator(".modebar-btn[data-title='Download plot']").click()
    target = ARTIFACTS / dl.value.suggested_filename
    dl.value.save_as(target)
    assert target.name == "octopipe-timeline.svg"
    assert target.read_text()[:200].lstrip().startswith("<svg")
    # metric values and table cells are never cut off
    for value in page.get_by_test_id("stMetricValue").all():
        assert value.evaluate("e => e.scrollWidth <= e.clientWidth + 1"), value.inner_text()

    page.goto(
        f"{server}/compare?devices=8&microbatches=16&plans=1f1b/uniform,zbv/balanced&view=diff"
    )
    wait_idle(page)
    page.get_by_text("run on another device").first.wait_for()
    charts_drawn(page, 1)
    no_exception(page)
    shot(page, "views-diff")
    docs_shot(page, "plan-diff", full_page=False)

    page.goto(f"{server}/compare?devices=8&microbatches=16&memory_gib=64&view=sweep")
    wait_idle(page)
    page.get_by_text("do not fit the 64 GiB memory cap").wait_for()
    charts_drawn(page, 1)
    assert "does not fit the memory cap" in legend_shows(page, "does not fit the memory cap")
    no_exception(page)
    docs_element(chart(page, 0), "sweep-over-cap")

    page.goto(f"{server}/compare?devices=4&microbatches=8&view=executed")
    wait_idle(page)
    from octopipe_core.profile import load_sample
    from octopipe_core.schedules import build_plan
    from tests.dash_helpers import executed_trace

    prof = load_sample("nemotron-h-8b")
    trace = ARTIFACTS / "trace_executed.json"
    trace.write_bytes(executed_trace(prof, build_plan(prof, "1f1b", 4, 8)))
    page.get_by_test_id("stSelectbox").filter(has_text="plan that was run").click()
    page.get_by_role("option", name="1f1b/uniform", exact=True).click()
    wait_idle(page)
    page.get_by_test_id("stFileUploaderDropzoneInput").set_input_files(str(trace))
    wait_idle(page)
    charts_drawn(page, 1)
    legend = legend_shows(page, "simulated F (forward)", "executed F (forward)")
    assert "simulated F (forward)" in legend and "executed F (forward)" in legend
    no_exception(page)
    shot(page, "views-executed")
    docs_element(chart(page, 0), "simulated-vs-executed")


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_compare_reads_the_trace_of_a_real_run(server: str, page: object, tmp_path: Path) -> None:
    """The trace ``octopipe run`` wrote for a 2-replica job, uploaded on the Compare page's
    "Simulated vs executed" view: the overlay, the replica pick and the predicted-vs-measured
    table, no error."""
    from tests.dash_helpers import TINY_RUN, real_run

    _, job = real_run(tmp_path, dp=2)
    sample, schedule, devices, mbs = TINY_RUN
    page.goto(
        f"{server}/compare?sample={sample}&devices={devices}&microbatches={mbs}&view=executed"
    )
    wait_idle(page)
    page.get_by_test_id("stSelectbox").filter(has_text="plan that was run").click()
    page.get_by_role("option", name=f"{schedule}/uniform", exact=True).click()
    wait_idle(page)
    trace = job / "out" / "trace_executed.json"
    page.get_by_test_id("stFileUploaderDropzoneInput").set_input_files(str(trace))
    wait_idle(page)
    charts_drawn(page, 1)
    page.get_by_text("Predicted (simulated) vs measured (executed)").wait_for()
    page.get_by_test_id("stSelectbox").filter(has_text="replica").wait_for()
    assert page.get_by_test_id("stDataFrame").first.is_visible()
    assert page.get_by_test_id("stAlertContentError").count() == 0
    legend = legend_shows(page, "executed F (forward)")
    assert "executed F (forward)" in legend
    no_exception(page)
    shot(page, "views-executed-real-run")


def test_dark_system_theme_and_the_menu_toggle_redraw_app_and_charts(
    server: str, browser: object
) -> None:
    """On a dark system the page and its charts open dark; the menu's theme switch (System /
    Light / Dark) is the toggle: Light redraws the page and every chart light, Dark brings
    both back (one page load for both checks)."""
    ctx, pg = open_page(browser, 1400, color_scheme="dark")
    style = "e => getComputedStyle(e).backgroundColor"
    dark = ("rgb(23, 22, 20)", "rgb(23, 22, 20)")

    def backgrounds() -> tuple[str, str]:
        app_bg = pg.get_by_test_id("stApp").evaluate(style)
        chart_bg = pg.locator("[data-testid='stPlotlyChart'] .main-svg").first.evaluate(style)
        return app_bg, chart_bg

    def pick(theme: str) -> None:
        """Pick ``theme`` in the menu; wait until the first chart is redrawn in it."""
        pg.get_by_test_id("stMainMenu").click()
        pg.get_by_test_id(f"stMainMenuItem-theme-{theme}").click()
        pg.keyboard.press("Escape")
        wait_idle(pg)
        pg.wait_for_function(
            '([c, dark]) => (getComputedStyle(document.querySelector("[data-testid='
            "'stPlotlyChart'] .main-svg\")).backgroundColor === c) === dark",
            arg=[dark[1], theme == "Dark"],
        )

    try:
        pg.goto(f"{server}/plan?devices=4&microbatches=8&schedule=zbv")
        wait_idle(pg)
        charts_drawn(pg, 3)
        assert backgrounds() == dark
        no_exception(pg)
        pg.screenshot(path=str(ARTIFACTS / "e2e-dark.png"))
        docs_shot(pg, "dark", full_page=False)
        pick("Light")
        light = backgrounds()
        assert light[0] == light[1] != dark[0]
        pick("Dark")
        assert backgrounds() == dark
        no_exception(pg)
    finally:
        ctx.close()
