"""The Dagster UI in a real headless Chromium (Debian's chromium + chromium-driver, driven by Selenium),
against the webserver of the end-to-end stack (dagster_e2e_util). Screenshots go to tests/artifacts/."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from dagster_e2e_util import MAIN_LOCATION, SLOW_LOCATION, TRANSLATOR, UI_STREAM

from dagster_defs.sink_health import HEALTH_INTERVAL_SECONDS

ARTIFACTS = Path(__file__).parent / "artifacts"
CHROMIUM, CHROMEDRIVER = "chromium", "chromedriver"
PAGE_WAIT = 90  # seconds for a page to show the expected text (the machine is busy running firings)
HEALTH_WAIT = 600  # seconds for a sink's health to change (a busy machine runs batches slowly)


def _browser_paths() -> tuple[str | None, str | None]:
    return shutil.which(CHROMIUM), shutil.which(CHROMEDRIVER)


def ensure_chromium() -> tuple[str, str]:
    """Debian's chromium and chromium-driver, installed with apt-get when missing and we are root."""
    browser, driver = _browser_paths()
    if browser and driver:
        return browser, driver
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip(
            "chromium/chromium-driver missing and cannot be installed here (needs root and apt-get): "
            "apt-get install chromium chromium-driver"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", "chromium", "chromium-driver"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:  # a stale package list: refresh once and retry
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, text=True, timeout=300)
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    browser, driver = _browser_paths()
    if not (browser and driver):
        pytest.skip(
            f"could not install chromium and chromium-driver with apt-get (exit {out.returncode}): "
            f"{(out.stderr or out.stdout).strip()[-500:]}"
        )
    return browser, driver


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium is not installed: pip install selenium (in the test extras)"
    )
    from selenium.webdriver.chrome.service import Service

    chromium, chromedriver = ensure_chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1600,1000",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        options.add_argument(flag)
    # An explicit driver path: Selenium Manager (which would download drivers) is never consulted.
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    driver.set_page_load_timeout(120)
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()


def skip_dialogs(driver, *, wait: float = 0) -> None:
    """A fresh profile gets Dagster's "Join the Dagster community" dialog once: press its Skip."""
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + wait
    while True:
        buttons = [b for b in driver.find_elements(By.XPATH, "//button[normalize-space()='Skip']") if b.is_displayed()]
        for button in buttons:
            button.click()
        if buttons or time.monotonic() >= deadline:
            return
        time.sleep(0.5)


def open_page(driver, url: str, *texts: str, shot: str) -> str:
    """Load ``url`` and wait (bounded) until the page's visible text contains every one of ``texts``;
    save a screenshot either way and return the visible text."""
    driver.get(url)
    deadline = time.monotonic() + PAGE_WAIT
    text = ""
    while time.monotonic() < deadline:
        skip_dialogs(driver)
        text = driver.execute_script("return document.body ? document.body.innerText : ''") or ""
        if all(t in text for t in texts):
            break
        time.sleep(1)
    time.sleep(1.5)  # let the page's remaining requests render before the screenshot
    skip_dialogs(driver)
    driver.save_screenshot(str(ARTIFACTS / f"{shot}.png"))
    text = driver.execute_script("return document.body.innerText") or ""
    missing = [t for t in texts if t not in text]
    assert not missing, f"{url}: {missing} not visible; page text starts with:\n{text[:1500]}"
    return text


def open_page_settled(driver, url: str, *texts: str, shot: str, within: float = HEALTH_WAIT) -> str:
    """``open_page``, loaded again until ``texts`` show or ``within`` seconds passed: for a state a batch
    run in progress hides for a while (a check's latest execution shows "In Progress" until its run
    ends, and on a busy machine a batch can run longer than one page's wait)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return open_page(driver, url, *texts, shot=shot)
        except AssertionError:
            if time.monotonic() >= deadline:
                raise


def click_and_wait(driver, label: str, *texts: str, shot: str) -> str:
    """Click the visible element whose text is ``label``, then wait (bounded) for ``texts`` and save a
    screenshot; returns the visible text."""
    from selenium.webdriver.common.by import By

    (target,) = [e for e in driver.find_elements(By.XPATH, f"//*[normalize-space()='{label}']") if e.is_displayed()][
        -1:
    ]
    target.click()
    deadline = time.monotonic() + PAGE_WAIT
    text = ""
    while time.monotonic() < deadline:
        text = driver.execute_script("return document.body.innerText") or ""
        if all(t in text for t in texts):
            break
        time.sleep(1)
    driver.save_screenshot(str(ARTIFACTS / f"{shot}.png"))
    missing = [t for t in texts if t not in text]
    assert not missing, f"after clicking {label!r}: {missing} not visible; page text starts with:\n{text[:1500]}"
    return text


def status_color(driver, asset: str) -> tuple[int, int, int] | None:
    """The RGB color of an asset's status text ("Materialized") in the catalog's list: red when a
    check of its latest materialization failed with severity ERROR, green otherwise."""
    # From the element naming the asset up to the first ancestor holding a status: its row.
    script = """
      const leaves = [...document.querySelectorAll('body *')].filter(
        e => e.children.length === 0 && (e.textContent || '').trim() === arguments[0]);
      for (const leaf of leaves) {
        for (let row = leaf; row; row = row.parentElement) {
          const span = [...row.querySelectorAll('span')].find(s => s.textContent.trim() === 'Materialized');
          if (span) return getComputedStyle(span).color;
        }
      }
      return null;"""
    color = driver.execute_script(script, asset)
    return tuple(int(v) for v in color[color.index("(") + 1 : color.index(")")].split(",")[:3]) if color else None


def _cq(stack, monkeypatch, *args: str) -> None:
    """``cq <args> --dagster <webserver>`` as an operator runs it for the slow location."""
    from cq_engine.cli.main import main

    settings = stack.slow_settings
    for var, value in {
        "CQ_SQL_DIR": settings.sql_dir,
        "CQ_WAREHOUSE": settings.warehouse,
        "CQ_HOME": settings.home,
        "CQ_TRANSLATOR": TRANSLATOR,
    }.items():
        monkeypatch.setenv(var, value)
    assert main([*args, "--dagster", f"127.0.0.1:{stack.web_port}"]) == 0


def test_ui_shows_the_job_the_sensor_and_a_successful_run(dagster_stack, browser):
    stack = dagster_stack
    stack.fix_flaky_source()  # flaky's failures would fail the batches fast shares with it
    stack.wait_until(
        "a successful batch with fast", lambda: [r for r in stack.firing_runs("fast") if r["status"] == "SUCCESS"], 240
    )
    run = [r for r in stack.firing_runs("fast") if r["status"] == "SUCCESS"][-1]  # the newest
    last = run["firings"]["fast"][-1].isoformat()
    base = stack.url
    browser.get(base)
    skip_dialogs(browser, wait=15)  # shown once, a moment after the first page loads

    # One shared job per location (no job per definition: one definition's run selects its sink).
    jobs = open_page(browser, f"{base}/overview/jobs", MAIN_LOCATION, "cq_firings_job", SLOW_LOCATION, shot="1_jobs")
    assert "fast_job" not in jobs and "fast_recalculate" not in jobs, jobs[:1500]
    open_page(
        browser,
        f"{base}/locations/{MAIN_LOCATION}/jobs/cq_firings_job",
        "cq_firings_job",
        "Job in",
        "fast_out",
        "solo_out",
        shot="2_job_cq_firings_job",
    )
    open_page(
        browser,
        f"{base}/automation",
        "cq_firings",
        "fast_ticks",
        "slow_blocked_switch",
        "slow_discard_switch",
        shot="3_automation",
    )
    open_page(
        browser,
        f"{base}/locations/{MAIN_LOCATION}/sensors/cq_firings",
        "cq_firings",
        "Sensor in",
        "cq_firings_job",
        "Running",
        shot="4_sensor_cq_firings",
    )
    runs_page = open_page(
        browser,
        f"{base}/runs?q[]=job:cq_firings_job&q[]=status:SUCCESS",
        "cq_firings_job",
        "Success",
        shot="5_runs_cq_firings_success",
    )
    # New batches keep succeeding while the page loads: any successful batch with fast will do.
    succeeded = [r["runId"][:8] for r in stack.firing_runs("fast") if r["status"] == "SUCCESS"]
    assert any(run_id in runs_page for run_id in succeeded), runs_page[:1500]
    open_page(
        browser,
        f"{base}/runs/{run['runId']}",
        run["runId"][:8],
        "Success",
        "cq_firings_job",
        "Launched by",
        "cq_firings",
        "RUN_SUCCESS",
        f"fast: firing {last} committed",
        shot="6_run_cq_firings",
    )
    # A definition on its own: its sink's page, with Materialize (its latest firing; the launchpad for
    # a firing time or a recalculation) and its materializations.
    open_page(browser, f"{base}/assets/fast_out", "fast_out", "Materialize", shot="7_asset_fast_out")


def test_ui_shows_a_sinks_row_count_schema_and_latest_check_result(dagster_stack, browser):
    """A continuous query's and a stream's sink pages, and a check's tab: the table's row count, its
    columns, the check's latest result (evaluated for the latest materialization, so never "Not
    evaluated") and the freshness; the materializations carry the metadata behind them."""
    stack, base = dagster_stack, dagster_stack.url
    stack.fix_flaky_source()
    for sink in ("fast_out", f"{UI_STREAM}_out"):
        # A run evaluates its sinks' checks when it starts, so a check may pass before the first
        # materialization (this module run alone, on a fresh stack): wait for both.
        stack.wait_until(
            f"{sink}'s check passing and a materialization",
            lambda s=sink: stack.health(s)["check"] == "SUCCEEDED" and stack.materializations(s),
            HEALTH_WAIT,
        )
        meta = stack.materializations(sink)[-1]["metadata"]
        assert {"dagster/row_count", "dagster/column_schema", "cq/rows_written", "dagster/uri"} <= set(meta), meta
    browser.get(base)
    skip_dialogs(browser, wait=15)
    for sink, column, shot in (
        ("fast_out", "device", "11_cq_sink"),
        (f"{UI_STREAM}_out", "_twstart", "12_stream_sink"),
    ):
        text = open_page(
            browser,
            f"{base}/assets/{sink}",
            sink,
            "Latest materialization",
            "Latest check results",
            "Row count",
            "Columns",
            column,
            shot=shot,
        )
        assert "```" not in text, text[:1500]  # the description renders as markdown
        checks = open_page_settled(
            browser, f"{base}/assets/{sink}?view=checks", "cq_completeness", "Passed", shot=f"{shot}_checks"
        )
        assert "Not evaluated" not in checks, checks[:1500]


def test_ui_and_graphql_show_a_healthy_a_failing_and_a_stopped_sink(dagster_stack, browser, monkeypatch):
    """Freshness policies (evaluated by the daemon), the cq_completeness check and the table
    metadata: fast is healthy, flaky fails (its source lost a column), slow_discard is stopped. Last
    in the module: it leaves flaky retrying a catch-up the tests before it would wait for."""
    stack, base = dagster_stack, dagster_stack.url
    stack.wait_until("fast_out's first materialization", lambda: stack.materializations("fast_out"), HEALTH_WAIT)
    _cq(stack, monkeypatch, "stop", "slow_discard")
    try:
        stack.break_flaky_source()
        # A batch reports a definition's check once the definition is done in it (here: failed).
        # Failed for its failed firings: on a loaded machine the feed can be late, and the check fails
        # first for the empty firings that left behind.
        stack.wait_until(
            "flaky's completeness check failing for its failed firings",
            lambda: (h := stack.health("flaky_out"))["check"] == "FAILED" and " failed" in h["description"],
            HEALTH_WAIT,
        )
        failing = stack.health("flaky_out")
        assert failing["severity"] == "ERROR" and "failed" in failing["description"], failing
        browser.get(base)
        skip_dialogs(browser, wait=15)  # shown once, a moment after the first page loads
        open_page(browser, f"{base}/assets/flaky_out?view=checks", "cq_completeness", shot="8_flaky_out_checks")
        # The latest execution may be the next batch's, still running: the history shows the failure.
        click_and_wait(browser, "Execution history", "Failed", shot="8b_flaky_out_check_history")
        stack.fix_flaky_source()

        # The catalog shows the sink like any table: its row count and column schema.
        mat = stack.materializations("fast_out")[-1]["metadata"]
        assert {"dagster/row_count", "dagster/column_schema", "dagster/table_name", "dagster/uri"} <= set(mat)
        open_page(browser, f"{base}/assets/fast_out", "fast_out", "device", shot="9_fast_out_catalog")

        # Stopped: no more materializations, so its freshness policy (1 minute here) fails.
        stack.wait_until(
            "discard_out turning stale", lambda: stack.health("discard_out")["freshness"] == "DEGRADED", HEALTH_WAIT
        )
        healthy = stack.health("fast_out")
        assert (healthy["freshness"], healthy["check"]) == ("HEALTHY", "SUCCEEDED"), healthy
        open_page(
            browser, f"{base}/assets/discard_out", "discard_out", "Freshness", "Failed", shot="10_discard_out_stale"
        )
        # In the catalog's list: cq_health fails the stopped sink's check, which Dagster OSS shows by
        # turning its status red (its asset health column is a Dagster+ feature).
        stack.wait_until(
            "discard_out's check failing as stopped",
            lambda: (h := stack.health("discard_out"))["check"] == "FAILED" and "Stopped" in (h["description"] or ""),
            HEALTH_WAIT,
        )
        # The list reds a failed check of the *latest* materialization: a batch already under way when
        # the switch went off can materialize once more, and cq_health reports again on its next tick.
        deadline = time.monotonic() + 4 * HEALTH_INTERVAL_SECONDS
        while True:
            open_page(browser, f"{base}/assets", "discard_out", "fast_out", "Materialized", shot="13_catalog")
            red, green, _ = status_color(browser, "discard_out") or (0, 0, 0)
            if red > green + 60 or time.monotonic() > deadline:
                break
            time.sleep(5)
        assert red > green + 60, (red, green)  # Dagster's red, not its green
        open_page(
            browser,
            f"{base}/assets/discard_out?view=checks",
            "cq_completeness",
            "Stopped",
            shot="14_discard_out_checks",
        )
    finally:
        _cq(stack, monkeypatch, "start", "slow_discard")
