"""Spark's Structured Streaming UI tab and Spark's metrics system show lockgate's
queries. A driver process (ui_driver.py) runs them on a SparkSession with its UI, the
streaming metrics and the Prometheus servlet on; the tab is loaded in a real browser
(Debian's chromium, headless, through Playwright) and the servlet's text is parsed with
prometheus_client's parser.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-proxy-server",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def driver():
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYSPARK_PYTHON=sys.executable)
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "ui_driver.py"), str(_free_port())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    line = proc.stdout.readline()  # the driver prints once its queries have run
    if not line:
        proc.wait()
        pytest.fail(f"ui_driver.py ended without reporting (exit {proc.returncode}):\n{proc.stderr.read()[-4000:]}")
    info = json.loads(line)
    # the UI listens on every interface; reach it on loopback (the host name Spark
    # reports may resolve to an address the browser cannot reach from here)
    info["url"] = "http://127.0.0.1:" + info["url"].rsplit(":", 1)[1]
    yield info
    proc.stdin.write("stop\n")
    proc.stdin.flush()
    proc.wait()
    assert proc.returncode == 0, proc.stderr.read()[-4000:]


def _get(url: str) -> str:
    with urllib.request.urlopen(url) as response:
        return response.read().decode("utf-8")


def _browser_available() -> bool:
    if shutil.which(CHROMIUM) is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium")
        pytest.skip(f"{CHROMIUM} not installed (Debian: apt-get install -y chromium)")
    try:
        import playwright  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip("playwright is not installed (pip install -e '.[test]')")
    return True


def test_structured_streaming_tab_in_a_browser(driver, tmp_path):
    _browser_available()
    from playwright.sync_api import sync_playwright

    url = driver["url"]
    active, finished, native = driver["active"], driver["finished"], driver["native"]
    shot = tmp_path / "structured-streaming-statistics.png"
    with sync_playwright() as p:
        # a profile of its own (--user-data-dir) and Debian's chromium, never a
        # browser Playwright downloads
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_FLAGS,
        )
        try:
            page = context.new_page()
            page.set_default_timeout(300_000)  # a loaded machine serves the UI slowly
            page.goto(f"{url}/StreamingQuery/")
            active_table = page.locator("#active-table")
            completed_table = page.locator("#completed-table")
            # the active lockgate query's row: its name, id and run id link, status
            row = active_table.locator("tr", has_text=active["name"])
            assert row.count() == 1
            assert active["id"] in row.inner_text()
            assert row.locator(f"a[href*='{active['runId']}']").count() == 1
            # the finished one among the completed queries; the native one beside them
            assert completed_table.locator("tr", has_text=finished["name"]).count() == 1
            assert active_table.locator("tr", has_text=native["name"]).count() == 1

            page.goto(f"{url}/StreamingQuery/statistics/?id={active['runId']}")
            text = page.inner_text("body")
            assert active["name"] in text and active["id"] in text
            # the charts are drawn by the page's scripts into SVG
            for chart in ("#input-rate-timeline", "#batch-duration-timeline",
                          "#watermark-gap-timeline", "#aggregated-num-total-state-rows-timeline"):
                page.wait_for_selector(f"{chart} svg path", state="attached")
            page.screenshot(path=str(shot), full_page=True)
        finally:
            context.close()
    assert shot.stat().st_size > 10_000
    print(f"screenshot of the Structured Streaming statistics page: {shot}")


def _prometheus(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    samples = {}
    for family in text_string_to_metric_families(_get(f"{url}/metrics/prometheus")):
        for sample in family.samples:
            samples[sample.name] = sample.value
    return samples


GAUGES = ("inputRate_total", "processingRate_total", "latency", "eventTime_watermark",
          "states_rowsTotal", "states_usedBytes")


def _gauges(samples: dict[str, float], query_name: str) -> dict[str, float]:
    marker = f"_driver_spark_streaming_{query_name}_"
    out = {}
    for name, value in samples.items():
        if marker in name and name.endswith("_Value"):
            out[name.split(marker, 1)[1][: -len("_Value")]] = value
    return out


def test_streaming_metrics_in_the_prometheus_servlet(driver):
    samples = _prometheus(driver["url"])
    mine = _gauges(samples, driver["active"]["name"])
    native = _gauges(samples, driver["native"]["name"])
    # Spark's names, as a native query of the same session reports them
    assert set(native) == set(GAUGES)
    assert set(mine) == set(native)
    progress = driver["progress"]
    watermark = datetime.strptime(progress["eventTime"]["watermark"], "%Y-%m-%dT%H:%M:%S.%f%z")
    assert mine == {
        "inputRate_total": progress["inputRowsPerSecond"],
        "processingRate_total": progress["processedRowsPerSecond"],
        "latency": progress["durationMs"]["triggerExecution"],
        "eventTime_watermark": (watermark - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds() * 1000,
        "states_rowsTotal": sum(op["numRowsTotal"] for op in progress["stateOperators"]),
        "states_usedBytes": sum(op["memoryUsedBytes"] for op in progress["stateOperators"]),
    }
    assert mine["eventTime_watermark"] > 0 and mine["states_rowsTotal"] > 0
    # a stopped query's source is removed, as Spark removes its MetricsReporter
    assert _gauges(samples, driver["finished"]["name"]) == {}
