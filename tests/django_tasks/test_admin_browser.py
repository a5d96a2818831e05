"""The queue's admin pages in headless Chromium, as a staff user sees them:
logged in through Django's login form, the jobs list (its states, its
filters), an action that leaves a running job alone and says so, the
confirmation page of another, a job's page whose payload holds a script
(shown, never run), the finished job's page, and a schedule's removal (asked
first). Screenshots of each page go
to the test's directory (GRAPHILE_WORKER_SCREENSHOTS names another)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import psycopg
import pytest
from dashboard_helpers import chromium, click, console_errors, wait_for, wait_for_text
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from worker_cli import make_sync_worker_utils

pytestmark = [pytest.mark.db, pytest.mark.slow]

JOBS = "graphile_worker._private_jobs"


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def served(queue: str) -> Iterator[str]:
    """The test project (its admin, its static files) served from a thread
    of this process, on a port the system picks; its base URL."""
    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.core.wsgi import get_wsgi_application

    server = make_server(
        "127.0.0.1", 0, StaticFilesHandler(get_wsgi_application()), handler_class=_Quiet
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()


def shots(tmp_path: Path) -> Path:
    return Path(os.environ.get("GRAPHILE_WORKER_SCREENSHOTS") or tmp_path)


def shoot(browser: WebDriver, path: Path) -> None:
    browser.save_screenshot(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def no_alert(browser: WebDriver) -> None:
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 (the alert a script would open)


def test_the_admin_in_chromium(queue: str, served: str, tmp_path: Path) -> None:
    from django.contrib.auth.models import User

    User.objects.create_superuser("ops", "ops@example.com", "a-password")
    with make_sync_worker_utils(queue) as utils:
        waiting = utils.add_job(
            "send_email", {"to": "a@example.com", "html": "<script>alert('x')</script>"}
        ).id
        failed = utils.add_job("charge_card", {"order": 17}, queue_name="payments").id
        running = utils.add_job("charge_card", {"order": 18}, queue_name="payments").id
        utils.add_job("resize_image", {"image": 4}, max_attempts=3)
        utils.add_schedule("nightly", "0 3 * * *", "report")
    with psycopg.connect(queue, autocommit=True) as conn:
        conn.execute(
            f"update {JOBS} set attempts = max_attempts, last_error = "
            "'CardDeclined: <b>insufficient funds</b>' where id = %s",
            [failed],
        )
        conn.execute(
            f"update {JOBS} set locked_at = now(), locked_by = 'worker-7' where id = %s",
            [running],
        )
    out = shots(tmp_path)
    with chromium() as browser:
        browser.get(f"{served}/admin/login/?next=/admin/graphile_worker/job/")
        wait_for(browser, "#id_username").send_keys("ops")
        browser.find_element(By.CSS_SELECTOR, "#id_password").send_keys("a-password")
        click(browser, "input[type=submit]")
        wait_for(browser, "#result_list")
        states = [
            cell.text for cell in browser.find_elements(By.CSS_SELECTOR, ".field-state_shown")
        ]
        assert states == ["waiting", "running", "failed", "waiting"]
        assert "4 jobs" in browser.find_element(By.CSS_SELECTOR, "#graphile-worker-count").text
        shoot(browser, out / "django-admin-jobs.png")

        # Retry the failed job and the running one: the running one is left alone.
        for job_id in (failed, running):
            browser.find_element(By.CSS_SELECTOR, f"input.action-select[value='{job_id}']").click()
        Select(browser.find_element(By.CSS_SELECTOR, "select[name=action]")).select_by_value(
            "retry_jobs"
        )
        click(browser, "button[name=index]")
        said = wait_for(browser, ".messagelist").text
        assert f"Retried 1 job: {failed}" in said
        assert f"Skipped 1 job locked by a worker (left alone): {running}" in said
        shoot(browser, out / "django-admin-retried.png")

        # A filter, in the state words.
        click(browser, "#changelist-filter a[href*='state=running']")
        wait_for_text(browser, "#changelist-filter li.selected", "running")
        assert [c.text for c in browser.find_elements(By.CSS_SELECTOR, ".field-id")] == [
            str(running)
        ]
        shoot(browser, out / "django-admin-jobs-running.png")

        # A job's own page: its payload's script is text, never run.
        browser.get(f"{served}/admin/graphile_worker/job/{waiting}/change/")
        payload = wait_for(browser, "pre.graphile-worker-json").text
        assert "<script>alert('x')</script>" in payload
        no_alert(browser)
        shoot(browser, out / "django-admin-job.png")
        browser.get(f"{served}/admin/graphile_worker/job/{failed}/change/")
        error = wait_for(browser, "pre.graphile-worker-error").text
        assert error == "CardDeclined: <b>insufficient funds</b>"
        shoot(browser, out / "django-admin-job-failed.png")

        # Cancel asks first (its page), then the job is in the history.
        browser.get(f"{served}/admin/graphile_worker/job/")
        wait_for(browser, "#result_list")
        browser.find_element(By.CSS_SELECTOR, f"input.action-select[value='{waiting}']").click()
        Select(browser.find_element(By.CSS_SELECTOR, "select[name=action]")).select_by_value(
            "cancel_jobs"
        )
        click(browser, "button[name=index]")
        wait_for(browser, "#graphile-worker-confirm #id_reason").send_keys("duplicate <order>")
        shoot(browser, out / "django-admin-confirm-cancel.png")
        click(browser, "#graphile-worker-confirm input[type=submit]")
        assert f"Cancelled 1 job: {waiting}" in wait_for(browser, ".messagelist").text
        browser.get(f"{served}/admin/graphile_worker/finishedjob/{waiting}/change/")
        assert (
            wait_for(browser, ".fieldBox.field-cancel_reason .readonly").text == "duplicate <order>"
        )
        no_alert(browser)
        shoot(browser, out / "django-admin-finished-job.png")
        assert console_errors(browser) == []

        browser.get(f"{served}/admin/graphile_worker/schedule/")
        wait_for(browser, "#result_list")
        shoot(browser, out / "django-admin-schedules.png")

        # Removing a schedule asks first, naming it.
        browser.find_element(By.CSS_SELECTOR, "input.action-select[value='nightly']").click()
        Select(browser.find_element(By.CSS_SELECTOR, "select[name=action]")).select_by_value(
            "remove_schedules"
        )
        click(browser, "button[name=index]")
        asked = wait_for(browser, "#graphile-worker-confirm").text
        assert "Remove 1 schedule?" in asked and "nightly: report, 0 3 * * *" in asked
        shoot(browser, out / "django-admin-confirm-remove-schedule.png")
        click(browser, "#graphile-worker-confirm input[type=submit]")
        assert "Removed 1 schedule: nightly" in wait_for(browser, ".messagelist").text
        assert console_errors(browser) == []
    for name in (
        "django-admin-jobs.png",
        "django-admin-retried.png",
        "django-admin-jobs-running.png",
        "django-admin-confirm-cancel.png",
        "django-admin-job.png",
        "django-admin-job-failed.png",
        "django-admin-finished-job.png",
        "django-admin-schedules.png",
        "django-admin-confirm-remove-schedule.png",
    ):
        assert (out / name).stat().st_size > 10_000
