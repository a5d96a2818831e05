"""The schedules in the database and a job's progress and logs, in headless
Chromium: the Crontab page's two tables; a schedule added from its form (a
bad zone first: the form comes back naming it), then paused; a job's page
with its progress bar and its kept logs (a line of markup shown as text,
never run), the bar moved by the page's own refresh, a log the reader
closed left closed. Screenshots: docs/images/dashboard-schedules.png and
dashboard-job-progress.png are these pages (written there when
GRAPHILE_WORKER_SCREENSHOTS names a directory; else to the test's own)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from dashboard_helpers import (
    SECRET,
    chromium,
    click,
    console_errors,
    serve_app,
    wait_for,
    wait_for_text,
)
from dbhelpers import rows
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from worker_cli import make_sync_worker_utils
from worker_cli.dashboard import create_app

pytestmark = [pytest.mark.db, pytest.mark.slow]

SCHEDULES = "graphile_worker._private_py_schedules"
PROGRESS = "graphile_worker._private_py_job_progress"
LOGS = "graphile_worker._private_py_job_logs"
CRONTAB = """\
0 9 * * * morning_digest
30 4 * * 1 send_weekly_email ?fill=2d&max=10
"""


def shots_dir(tmp_path: Path) -> Path:
    """Where the screenshots go: GRAPHILE_WORKER_SCREENSHOTS (docs/images, to
    update the documentation's), else the test's own directory."""
    return Path(os.environ.get("GRAPHILE_WORKER_SCREENSHOTS") or tmp_path)


def shoot(browser: WebDriver, path: Path) -> None:
    browser.save_screenshot(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver


@pytest.fixture
def schedules_db(db: str) -> str:
    with make_sync_worker_utils(db) as utils:
        utils.add_schedule(
            "tokyo_report",
            "30 2 * * *",
            "nightly_report",
            {"kind": "daily"},
            tz="Asia/Tokyo",
            queue_name="reports",
            priority=3,
            fill="2d",
        )
        utils.add_schedule("invoices", "0 6 1 * *", "send_invoices", tz="Europe/Paris")
        utils.add_schedule("hourly_sync", "15 * * * *", "sync_accounts")
        utils.add_schedule("held", "0 12 * * 1", "weekly_cleanup", paused=True)
    # Its last :15, its job added 0.42 s after it.
    last = "date_trunc('hour', now() - interval '15 minutes') + interval '15 minutes'"
    rows(
        db,
        f"update {SCHEDULES} set last_execution = {last}, "
        f"last_run_at = {last} + interval '0.42 seconds' where identifier = 'hourly_sync'",
    )
    rows(
        db,
        "insert into graphile_worker._private_known_crontabs values "
        "('morning_digest', now() - interval '9 days', date_trunc('day', now()) "
        "- interval '15 hours')",
    )
    return db


def test_schedules_added_and_paused_in_a_browser(
    schedules_db: str, browser: WebDriver, tmp_path: Path
) -> None:
    # Refreshing itself, as by default, but not during the test (its content
    # replaced between two of Selenium's calls).
    app = create_app(
        schedules_db,
        csrf_secret=SECRET,
        crontab=CRONTAB,
        cron_timezone="America/New_York",
        refresh=600,
    )
    browser.set_window_size(1400, 1500)
    try:
        with serve_app(app) as url:
            browser.get(url + "/crontab")
            table = wait_for(browser, "#schedules-table")
            ids = [
                row.get_attribute("data-schedule")
                for row in table.find_elements(By.CSS_SELECTOR, "tbody tr")
            ]
            assert ids == ["held", "hourly_sync", "invoices", "tokyo_report"]
            assert len(browser.find_elements(By.CSS_SELECTOR, "#cron-items tbody tr")) == 2
            tokyo = browser.find_element(By.CSS_SELECTOR, "tr[data-schedule='tokyo_report']")
            assert len(tokyo.find_elements(By.CSS_SELECTOR, ".schedule-next li")) == 3

            click(browser, "#schedule-add")
            fields = {
                "identifier": "weekly_digest",
                "pattern": "0 8 * * 1",
                "task": "send_digest",
                "tz": "Mars/Olympus",
                "fill": "1d",
            }
            for name, text in fields.items():
                browser.find_element(By.NAME, name).send_keys(text)
            browser.find_element(By.NAME, "payload").send_keys('{"list": "weekly"}')
            click(browser, "#schedule-save")
            error = wait_for(browser, "#form-error")
            assert error.text.startswith("time zone: unknown time zone 'Mars/Olympus'")
            zone = browser.find_element(By.NAME, "tz")
            assert zone.get_attribute("aria-invalid") == "true"
            assert browser.find_element(By.NAME, "pattern").get_attribute("value") == "0 8 * * 1"
            zone.clear()
            zone.send_keys("Europe/Paris")
            click(browser, "#schedule-save")
            notice = wait_for(browser, "#notice.notice-done")
            assert notice.text.startswith("Added schedule weekly_digest")
            assert browser.current_url == url + "/crontab"
            row = "tr[data-schedule='weekly_digest']"
            assert browser.find_element(By.CSS_SELECTOR, f"{row} .schedule-zone").text == (
                "Europe/Paris"
            )

            click(browser, "tr[data-schedule='invoices'] .schedule-pause")
            assert wait_for(browser, "#notice").text.startswith("Paused schedule invoices")
            state = browser.find_element(By.CSS_SELECTOR, "tr[data-schedule='invoices'] .badge")
            assert state.text == "paused"
            # The form refused once: its 400 is the browser's one "error".
            assert [e for e in console_errors(browser) if "status of 400" not in e] == []
            shoot(browser, shots_dir(tmp_path) / "dashboard-schedules.png")
    finally:
        browser.set_window_size(1400, 1000)


def test_a_jobs_progress_and_logs_in_a_browser(db: str, browser: WebDriver, tmp_path: Path) -> None:
    with make_sync_worker_utils(db) as utils:
        job_id = utils.add_job("import_customers", {"file": "customers-2026-12.csv"}).id
    rows(
        db,
        f"insert into {PROGRESS} (job_id, done, total, message) "
        "values (%s, 3120, 12000, 'importing rows of customers-2026-12.csv')",
        (job_id,),
    )
    # Its third attempt is running; the first two failed, and their lines
    # were kept (a failed attempt's, by default).
    started = datetime.now(UTC)

    def stamp(seconds: float) -> str:
        """A log line's time, ``seconds`` from now."""
        return f"{started + timedelta(seconds=seconds):%Y-%m-%dT%H:%M:%S.%f}"[:-3] + "Z"

    first = "\n".join(
        [
            stamp(-180) + " INFO opened customers-2026-12.csv (12,000 rows)",
            stamp(-176) + " WARNING row 1204: <script>alert('x')</script> in name",
            stamp(-171) + " ERROR the database closed the connection",
            "Traceback (most recent call last):",
            '  File "tasks/import_customers.py", line 41, in run',
            "psycopg.OperationalError: server closed the connection unexpectedly",
        ]
    )
    second = "\n".join(
        [
            stamp(-110) + " INFO opened customers-2026-12.csv (12,000 rows)",
            stamp(-107) + " INFO resuming after row 2,999",
            stamp(-100) + " WARNING row 3,118: duplicate e-mail, kept the newest",
            stamp(-89) + " ERROR timed out waiting for the CRM (30 s)",
        ]
    )
    rows(
        db,
        f"insert into {LOGS} (job_id, attempt, outcome, logged_at, lines) values "
        "(%(id)s, 1, 'failed', now() - interval '170 seconds', %(first)s), "
        "(%(id)s, 2, 'failed', now() - interval '88 seconds', %(second)s)",
        {"id": job_id, "first": first, "second": second},
    )
    rows(
        db,
        "insert into graphile_worker._private_py_job_errors "
        "(job_id, task_identifier, attempt, failed_at, error, retried, pool_id) values "
        "(%(id)s, 'import_customers', 1, now() - interval '170 seconds', "
        "'OperationalError: server closed the connection unexpectedly', true, 'pool-7f3a'), "
        "(%(id)s, 'import_customers', 2, now() - interval '88 seconds', "
        "'TimeoutError: the CRM did not answer within 30 s', true, 'pool-7f3a')",
        {"id": job_id},
    )
    rows(
        db,
        "update graphile_worker._private_jobs set attempts = 3, locked_at = now(), "
        "locked_by = 'pool-7f3a', last_error = 'TimeoutError: the CRM did not answer within 30 s' "
        "where id = %s",
        (job_id,),
    )
    browser.set_window_size(1280, 1900)
    try:
        with serve_app(create_app(db, csrf_secret=SECRET, refresh=600)) as url:
            browser.get(url + f"/jobs/{job_id}")
            bar = wait_for(browser, "#job-progress-bar")
            assert float(bar.get_attribute("value") or 0) == pytest.approx(0.26)
            assert browser.find_element(By.ID, "job-progress-figures").text == (
                "26% · 3,120 of 12,000"
            )
            logs = browser.find_elements(By.CSS_SELECTOR, "details.job-log")
            assert [log.get_attribute("data-attempt") for log in logs] == ["2", "1"]
            assert [log.get_attribute("open") is not None for log in logs] == [True, False]
            logs[1].find_element(By.TAG_NAME, "summary").click()
            lines = browser.find_element(By.CSS_SELECTOR, "details.job-log[data-attempt='1'] pre")
            assert "row 1204: <script>alert('x')</script> in name" in lines.text  # text
            with pytest.raises(NoAlertPresentException):
                browser.switch_to.alert.accept()
            colour = browser.execute_script(
                "return getComputedStyle(arguments[0].querySelector('.log-error')).color", lines
            )
            assert colour == "rgb(185, 28, 28)"
            assert console_errors(browser) == []
            shoot(browser, shots_dir(tmp_path) / "dashboard-job-progress.png")

        # The page's own refresh (every second here) moves the bar; the log the
        # reader closed stays closed. Read and clicked by scripts: the content
        # may be replaced between two of Selenium's calls.
        with serve_app(create_app(db, csrf_secret=SECRET, refresh=1)) as url:
            browser.get(url + f"/jobs/{job_id}")
            wait_for(browser, "#job-progress-bar")
            browser.execute_script(
                "document.querySelector(\"details.job-log[data-attempt='2'] summary\").click()"
            )
            rows(
                db,
                f"update {PROGRESS} set done = 9000, updated_at = now() where job_id = %s",
                (job_id,),
            )
            wait_for_text(browser, "#job-progress-percent", "75%")
            opened = browser.execute_script(
                "return Array.from(document.querySelectorAll('details.job-log'), d => d.open)"
            )
            assert opened == [False, False]
            moved = browser.find_element(By.ID, "job-progress-bar").get_attribute("value")
            assert float(moved or 0) == pytest.approx(0.75)
    finally:
        browser.set_window_size(1400, 1000)
