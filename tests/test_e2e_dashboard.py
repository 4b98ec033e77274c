"""Real-browser tests: the dashboard served by Streamlit, driven in headless Debian Chromium.

Skipped when ``chromium`` is not on PATH. Screenshots land in ``test-artifacts/`` (gitignored).
"""

from __future__ import annotations

import os
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


@pytest.fixture
def page(browser: object) -> Iterator[object]:
    ctx = browser.new_context(viewport={"width": 1500, "height": 2000}, accept_downloads=True)
    pg = ctx.new_page()
    pg.set_default_timeout(LOAD_TIMEOUT_MS)
    yield pg
    ctx.close()


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
    charts_drawn(page, 2)
    assert page.get_by_test_id("stPlotlyChart").count() == 2
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
    metrics = page.get_by_test_id("stMetricLabel").all_inner_texts()
    assert {"GPUs", "exposed tail (ms)", "inter-node boundaries"} <= set(metrics)
    # the timeline's legend names the inter-node transfers and the DP stream
    legend = page.locator(".legendtext").all_text_contents()
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
