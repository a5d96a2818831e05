"""The dashboard in a real browser (headless Chromium): every page loads and
links where it says, values from the database show as text, and each action,
confirmed, changes the database as the admin functions do."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dashboard_helpers import (
    chromium,
    click,
    console_errors,
    http,
    serve_app,
    serve_cli,
    wait_for,
    wait_for_text,
)
from dbhelpers import cli_path, rows, value
from fault_helpers import wait_until
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from worker_cli import Helpers, WorkerUtils, Workflow, make_sync_worker_utils, run_once
from worker_cli.dashboard import create_app

pytestmark = [pytest.mark.db, pytest.mark.slow]

HTML_PAYLOAD = '{"html": "<script>window.pwned = 1</script><b id=\\"bold\\">bold</b>"}'
HTML_ERROR = '<img src=x id=evil onerror="window.pwned = 2"> went wrong'
STEPS = "graphile_worker._private_py_workflow_steps"
WORKFLOWS = "graphile_worker._private_py_workflows"


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver


def add_job(db: str, task: str, payload: str = "{}", **options: Any) -> int:
    """add_job with named arguments (queue_name, run_at, max_attempts, ...)."""
    names = "".join(f", {name} => %({name})s" for name in options)
    return int(
        value(
            db,
            f"select id from graphile_worker.add_job(%(task)s, %(payload)s::json{names})",
            {"task": task, "payload": payload, **options},
        )
    )


def update_job(db: str, job_id: int, assignments: str, *params: Any) -> None:
    rows(
        db,
        f"update graphile_worker._private_jobs set {assignments} where id = %s",
        (*params, job_id),
    )


def job_row(db: str, job_id: int) -> dict[str, Any] | None:
    found = rows(db, "select * from graphile_worker._private_jobs where id = %s", (job_id,))
    return found[0] if found else None


def row_ids(browser: WebDriver, table: str = "#jobs-table") -> list[int]:
    return [
        int(row.get_attribute("data-job") or 0)
        for row in browser.find_elements(By.CSS_SELECTOR, f"{table} tbody tr")
    ]


def test_pages_links_and_values_shown_as_text(db: str, browser: WebDriver) -> None:
    waiting = add_job(db, "hello", HTML_PAYLOAD)
    add_job(db, "mail", queue_name="q1", run_at="2099-01-01T00:00:00Z")
    failed = add_job(db, "hello")
    update_job(db, failed, "attempts = 25, last_error = %s", HTML_ERROR)
    locked = add_job(db, "mail", queue_name="q1")
    update_job(db, locked, "locked_at = now(), locked_by = 'pool-gone', attempts = 1")
    rows(
        db,
        "insert into graphile_worker._private_known_crontabs values "
        "('nightly', now() - interval '2 days', now() - interval '3 hours'), "
        "('<i>new</i>', now(), null)",
    )
    with serve_cli(db) as url:
        browser.get(url + "/")
        states = ("waiting", "scheduled", "retrying", "paused", "running", "failed")
        cards = {state: wait_for(browser, f"#count-{state}").text for state in ("total", *states)}
        assert cards == {
            "total": "4",
            "waiting": "1",
            "scheduled": "1",
            "retrying": "0",
            "paused": "0",
            "running": "1",
            "failed": "1",
        }
        # The state cards partition the jobs: one word for each, none counted twice.
        assert sum(int(cards[state]) for state in states) == int(cards["total"])
        assert f"#{waiting}" in browser.find_element(By.ID, "oldest-waiting").text
        # The error is text: no <img> was made of it, and no script ran.
        assert HTML_ERROR in browser.find_element(By.ID, "failures-table").text
        assert browser.find_elements(By.ID, "evil") == []
        assert "q1" in browser.find_element(By.ID, "queues-table").text

        click(browser, "#nav-jobs")
        assert browser.current_url == url + "/jobs"
        assert row_ids(browser) == [locked, failed, 2, waiting]

        browser.get(url + "/")
        click(browser, "#tasks-table a.task")  # hello: the first task by name
        assert browser.current_url == url + "/jobs?task=hello"
        assert row_ids(browser) == [failed, waiting]

        Select(browser.find_element(By.ID, "filter-task")).select_by_value("")
        Select(browser.find_element(By.ID, "filter-state")).select_by_value("running")
        click(browser, "#filter-submit")
        assert row_ids(browser) == [locked]
        assert "pool-gone" not in browser.find_element(By.ID, "jobs-table").text  # not a column

        browser.get(url + "/jobs")
        click(browser, f"#jobs-table a[href$='/jobs/{waiting}']")
        payload = wait_for(browser, "#job-payload")
        assert (
            '"html": "<script>window.pwned = 1</script><b id=\\"bold\\">bold</b>"' in payload.text
        )
        assert browser.find_elements(By.ID, "bold") == []
        assert browser.execute_script("return window.pwned") is None  # type: ignore[no-untyped-call]
        click(browser, "#job-task")
        assert browser.current_url == url + "/jobs?task=hello"

        browser.get(f"{url}/jobs/{failed}")
        assert HTML_ERROR in wait_for(browser, "#job-last-error").text
        assert browser.find_elements(By.ID, "evil") == []

        click(browser, "#nav-pools")
        assert "pool-gone" in wait_for(browser, "#dead-pools").text
        click(browser, "#nav-crontab")
        crontab = [
            [cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
            for row in wait_for(browser, "#crontab-table").find_elements(
                By.CSS_SELECTOR, "tbody tr"
            )
        ]
        assert [(row[0], row[2] == "never", row[3]) for row in crontab] == [
            ("<i>new</i>", True, ""),
            ("nightly", False, "3h 00m"),
        ]
        click(browser, "#nav-overview")
        wait_for(browser, "#state-cards")
        assert browser.execute_script("return window.pwned") is None  # type: ignore[no-untyped-call]
        assert console_errors(browser) == []


def confirm(browser: WebDriver, url: str, job_id: int, action: str) -> None:
    """Open the job's page, click the action, and land on its confirmation."""
    browser.get(f"{url}/jobs/{job_id}")
    click(browser, f"#action-{action}")
    wait_for(browser, "#confirm-form")


def test_the_jobs_key_column_shows_the_key(db: str, browser: WebDriver) -> None:
    """The Jobs list's key column shows the keys (an ellipsis past 160 px),
    not the chart legend's 10-px swatch (the two rules shared the class
    ``key``); the legend keeps its swatches."""
    key = "order-2026-11-29-customer-12345-and-more-to-overflow"
    add_job(db, "hello", job_key=key)
    add_job(db, "hello", job_key="k7")
    with serve_app(create_app(db, refresh=0)) as url:
        browser.get(url + "/jobs")
        wait_for(browser, "#jobs-table")
        cells = browser.find_elements(By.CSS_SELECTOR, "#jobs-table tbody td.key")
        widths = [cell.size["width"] for cell in cells]
        long_cell = next(cell for cell in cells if cell.get_attribute("textContent") == key)
        style = browser.execute_script(
            "const s = getComputedStyle(arguments[0]);"
            "return [s.display, s.maxWidth, s.textOverflow, arguments[0].clientWidth];",
            long_cell,
        )
        # A table cell (the swatch's rule made it a 10-px inline block: a
        # 30-px column with its padding), cut with an ellipsis past its width.
        assert style[:3] == ["table-cell", "160px", "ellipsis"], style
        assert min(widths) >= 150, widths
        assert console_errors(browser) == []
        browser.get(url + "/")
        swatch = wait_for(browser, "#throughput-totals .swatch-completed")
        assert (swatch.size["width"], swatch.size["height"]) == (10, 10)


def test_each_action_confirmed_changes_the_database(db: str, browser: WebDriver) -> None:
    failed = add_job(db, "hello", max_attempts=3)
    update_job(db, failed, "attempts = 3, last_error = 'boom'")
    later = add_job(db, "hello", run_at="2099-01-01T00:00:00Z")
    doomed = add_job(db, "hello", run_at="2099-01-01T00:00:00Z")
    gone = add_job(db, "hello", run_at="2099-01-01T00:00:00Z")
    running = add_job(db, "hello")
    update_job(db, running, "locked_at = now(), locked_by = 'pool-busy', attempts = 1")
    with serve_cli(db) as url:
        # Run now: due now; a job without attempts left gets one more.
        confirm(browser, url, failed, "run-now")
        click(browser, "#confirm-button")
        assert "will run now" in wait_for(browser, "#notice").text
        job = job_row(db, failed)
        assert job is not None and job["max_attempts"] == 4 and job["attempts"] == 3
        assert value(
            db, "select run_at <= now() from graphile_worker._private_jobs where id = %s", (failed,)
        )

        # Reschedule: the run_at (UTC) and priority given.
        confirm(browser, url, later, "reschedule")
        field = browser.find_element(By.ID, "reschedule-run-at")
        browser.execute_script("arguments[0].value = '2030-01-02T03:04:05'", field)  # type: ignore[no-untyped-call]
        browser.find_element(By.ID, "reschedule-priority").send_keys("5")
        click(browser, "#confirm-button")
        assert "rescheduled" in wait_for(browser, "#notice").text
        job = job_row(db, later)
        assert job is not None and job["priority"] == 5
        assert job["run_at"].isoformat() == "2030-01-02T03:04:05+00:00"

        # Permanently fail, with a reason (shown as text afterwards).
        confirm(browser, url, doomed, "fail")
        reason = browser.find_element(By.ID, "fail-reason")
        reason.clear()
        reason.send_keys("not needed <b>any more</b>")
        click(browser, "#confirm-button")
        assert "permanently failed" in wait_for(browser, "#notice").text
        job = job_row(db, doomed)
        assert job is not None and job["attempts"] == job["max_attempts"]
        assert job["last_error"] == "not needed <b>any more</b>"
        assert "<b>any more</b>" in browser.find_element(By.ID, "job-last-error").text

        # Delete (complete): the row is gone; back on the list.
        confirm(browser, url, gone, "delete")
        click(browser, "#confirm-button")
        done = wait_for(browser, "#notice.notice-done")
        assert "deleted" in done.text
        done_colour = done.value_of_css_property("background-color")
        assert browser.current_url == url + "/jobs"  # no notice in the URL
        assert job_row(db, gone) is None

        # A locked job is left alone, as complete_jobs leaves it.
        confirm(browser, url, running, "delete")
        click(browser, "#confirm-button")
        refused = wait_for(browser, "#notice")
        assert "locked" in refused.text and refused.text.startswith("Refused:")
        assert refused.get_attribute("class") == "notice notice-refused"
        assert refused.value_of_css_property("background-color") != done_colour
        assert job_row(db, running) is not None

        # Cancel changes nothing.
        confirm(browser, url, later, "delete")
        click(browser, "#cancel")
        assert browser.current_url == f"{url}/jobs/{later}"
        assert job_row(db, later) is not None
        assert console_errors(browser) == []


def test_unlocking_a_dead_pools_jobs_but_not_a_live_ones(db: str, browser: WebDriver) -> None:
    dead = add_job(db, "hello", queue_name="serial")
    update_job(db, dead, "locked_at = now(), locked_by = 'pool-dead', attempts = 1")
    rows(
        db,
        "update graphile_worker._private_job_queues set locked_at = now(), locked_by = 'pool-dead'",
    )
    live = add_job(db, "hello")
    update_job(db, live, "locked_at = now(), locked_by = 'pool-live', attempts = 1")
    rows(
        db,
        "insert into graphile_worker._private_py_heartbeats (pool_id, timeout) "
        "values ('pool-live', interval '1 hour')",
    )
    with serve_cli(db) as url:
        browser.get(url + "/pools")
        row = wait_for(browser, "#dead-pools tr[data-pool='pool-dead']")
        assert "1" in row.text  # one job, one queue
        assert "pool-live" in browser.find_element(By.ID, "live-pools").text
        click(browser, "#dead-pools tr[data-pool='pool-dead'] a.button")
        click(browser, "#confirm-button")
        assert "Released" in wait_for(browser, "#notice").text
        job = job_row(db, dead)
        assert job is not None and job["locked_by"] is None
        assert (
            value(
                db,
                "select count(*) from graphile_worker._private_job_queues "
                "where locked_by is not null",
            )
            == 0
        )

        browser.get(url + "/pools/unlock?pool=pool-live")
        wait_for(browser, "#confirm-form")
        click(browser, "#confirm-button")
        assert "live heartbeat" in wait_for(browser, "#notice").text
        job = job_row(db, live)
        assert job is not None and job["locked_by"] == "pool-live"


def test_keyset_pages_and_searching_past_the_window(db: str, browser: WebDriver) -> None:
    rare = add_job(db, "rare")
    rows(
        db,
        "select graphile_worker.add_jobs(array(select ('bulk', '{}', null, null, null, null, "
        "null, null)::graphile_worker.job_spec from generate_series(1, 10100)))",
    )
    newest = int(value(db, "select max(id) from graphile_worker._private_jobs"))
    with serve_cli(db) as url:
        browser.get(url + "/jobs")
        wait_for(browser, "#jobs-table")
        assert row_ids(browser) == list(range(newest, newest - 50, -1))
        click(browser, "#older-page")
        assert row_ids(browser) == list(range(newest - 50, newest - 100, -1))
        click(browser, "#newest-page")
        assert row_ids(browser)[0] == newest

        # A rare task: the newest 10,000 jobs hold none of it; searching on finds it.
        browser.get(url + "/jobs?task=rare")
        wait_for(browser, "#no-jobs")
        assert "10,000 jobs searched" in browser.find_element(By.ID, "no-jobs").text
        click(browser, "#older-page")
        assert row_ids(browser) == [rare]
        assert browser.find_elements(By.ID, "older-page") == []


def test_worker_pools_from_heartbeats(db: str, browser: WebDriver, tmp_path: Path) -> None:
    """A live pool reports its counters; an older version's row reports none;
    a pool without a heartbeat that holds a job shows among the others."""
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "hello.py").write_text("async def task(payload, helpers):\n    pass\n")
    for _ in range(3):
        add_job(db, "hello")
    rows(
        db,
        "insert into graphile_worker._private_py_heartbeats (pool_id, timeout, hostname, pid) "
        "values ('pool-older', interval '1 hour', 'old-host', 42)",
    )
    node = add_job(db, "node_task")
    update_job(db, node, "locked_at = now(), locked_by = 'worker-node', attempts = 1")
    worker = subprocess.Popen(
        [
            cli_path(),
            "-c",
            db,
            "--tasks",
            str(tmp_path / "tasks"),
            "-j",
            "2",
            "--heartbeat-interval",
            "0.2",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(
            lambda: (
                value(db, "select max(jobs_done) from graphile_worker._private_py_heartbeats") == 3
            ),
            30,
            "the worker's heartbeat reporting 3 jobs done",
        )
        pool_id = value(
            db, "select pool_id from graphile_worker._private_py_heartbeats where jobs_done = 3"
        )
        with serve_cli(db) as url:
            browser.get(url + "/pools")
            live = wait_for(browser, f"#live-pools tr[data-pool='{pool_id}']")
            cells = [cell.text for cell in live.find_elements(By.TAG_NAME, "td")]
            assert cells[3] == "hello" and cells[4] == "2" and cells[5] == "3", cells
            older = browser.find_element(By.CSS_SELECTOR, "#live-pools tr[data-pool='pool-older']")
            assert "not reported" in older.text and "old-host" in older.text
            other = browser.find_element(By.CSS_SELECTOR, "#dead-pools tr[data-pool='worker-node']")
            assert "none" in other.text
    finally:
        worker.terminate()
        worker.wait(30)


def test_read_only_hides_and_refuses_the_actions(db: str, browser: WebDriver) -> None:
    job_id = add_job(db, "hello")
    dead = add_job(db, "hello")
    update_job(db, dead, "locked_at = now(), locked_by = 'pool-dead', attempts = 1")
    with serve_cli(db, "--read-only") as url:
        browser.get(f"{url}/jobs/{job_id}")
        wait_for(browser, "#read-only")
        wait_for(browser, "#job-details")
        assert browser.find_elements(By.ID, "job-actions") == []
        browser.get(url + "/pools")
        wait_for(browser, "#dead-pools")
        assert browser.find_elements(By.CSS_SELECTOR, "#dead-pools a.button") == []
        browser.get(f"{url}/jobs/{job_id}/delete")
        assert "read-only" in wait_for_text(browser, "#error-reason", "read-only").text
    assert job_row(db, job_id) is not None


def readme_fastapi_example() -> str:
    """The dashboard guide's example of mounting it in a FastAPI app."""
    page = Path(__file__).resolve().parents[2] / "docs" / "guides" / "dashboard.md"
    readme = page.read_text(encoding="utf-8")
    [example] = [
        block
        for block in re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
        if "app.mount(" in block
    ]
    return str(example)


def test_mounted_under_a_prefix_behind_the_apps_own_auth(
    db: str, browser: WebDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dashboard guide's FastAPI example, as written: the app's own check in front,
    links, stylesheet and actions under the prefix, and the page refreshing
    itself."""
    job_id = add_job(db, "hello")
    monkeypatch.setenv("DATABASE_URL", db)
    namespace: dict[str, Any] = {}
    exec(compile(readme_fastapi_example(), "docs/guides/dashboard.md", "exec"), namespace)
    with serve_app(namespace["app"]) as url:
        base = url + "/admin/queue"
        assert http(base + "/").status == 403  # the application's own check
        browser.get(base + "/")
        browser.add_cookie({"name": "session", "value": "staff"})
        assert "403" in " ".join(console_errors(browser))  # read (and cleared) here
        browser.get(base + "/")
        assert wait_for(browser, "#count-total").text == "1"
        topbar = browser.find_element(By.CSS_SELECTOR, ".topbar")
        assert topbar.value_of_css_property("background-color") == "rgba(17, 24, 39, 1)"

        add_job(db, "hello")  # shows up without a reload
        wait_for_text(browser, "#count-total", "2")
        browser.find_element(By.ID, "refresh-toggle").click()
        wait_for_text(browser, "#refresh-toggle", "off")

        click(browser, "#nav-jobs")
        assert browser.current_url == base + "/jobs"
        click(browser, f"#jobs-table a[href='/admin/queue/jobs/{job_id}']")
        assert browser.current_url == f"{base}/jobs/{job_id}"
        click(browser, "#action-delete")
        click(browser, "#confirm-button")
        assert "deleted" in wait_for(browser, "#notice").text
        assert browser.current_url == base + "/jobs"
        assert job_row(db, job_id) is None
        # Refreshed in place, the page keeps the notice it was shown once.
        browser.find_element(By.ID, "refresh-toggle").click()
        wait_for_text(browser, "#refresh-toggle", "on")
        later = add_job(db, "hello")
        wait_for(browser, f"#jobs-table tr[data-job='{later}']")
        assert "deleted" in browser.find_element(By.ID, "notice").text
        assert http(base + "/healthz", headers={"Cookie": "session=staff"}).body == "ok\n"
        assert console_errors(browser) == []


def test_the_finished_view_and_cancelling(db: str, browser: WebDriver, tmp_path: Path) -> None:
    """A real worker: its finished jobs in the Finished view, filtered, each
    linking to its page with its result; a running job cancelled from its
    page stops and is recorded as cancelled; a scheduled one is cancelled at
    once."""
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "resize.py").write_text(
        "async def task(payload, helpers):\n    return {'width': payload['width'] // 2}\n"
    )
    (tmp_path / "tasks" / "slow.py").write_text(
        "import asyncio\n\n\nasync def task(payload, helpers):\n    await asyncio.sleep(3600)\n"
    )
    resized = [add_job(db, "resize", '{"width": 640}'), add_job(db, "resize", '{"width": 90}')]
    slow = add_job(db, "slow")
    later = add_job(db, "resize", '{"width": 1}', run_at="2099-01-01T00:00:00Z")
    worker = subprocess.Popen(
        [cli_path(), "-c", db, "--tasks", str(tmp_path / "tasks"), "-j", "3"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(
            lambda: (
                value(db, "select count(*) from graphile_worker._private_py_job_history") == 2
                and value(db, "select state from graphile_worker.py_job_status(%s)", (slow,))
                == "running"
            ),
            30,
            "two jobs finished and the slow one running",
        )
        with serve_cli(db) as url:
            browser.get(url + "/")
            click(browser, "#nav-finished")
            newest_first = [
                row["job_id"]
                for row in rows(
                    db,
                    "select job_id from graphile_worker._private_py_job_history "
                    "order by finished_at desc, job_id desc",
                )
            ]
            assert sorted(newest_first) == resized
            assert row_ids(browser, "#finished-table") == newest_first
            Select(browser.find_element(By.ID, "filter-state")).select_by_value("cancelled")
            click(browser, "#filter-submit")
            assert "state=cancelled" in browser.current_url
            assert "No finished job matches" in wait_for(browser, "#no-finished").text
            Select(browser.find_element(By.ID, "filter-state")).select_by_value("succeeded")
            click(browser, "#filter-submit")
            click(browser, f"#finished-table a[href$='/jobs/{resized[0]}']")
            assert '"width": 320' in wait_for(browser, "#job-result").text
            assert wait_for(browser, "#job-state").text == "succeeded"

            # The running job: asked to stop; its worker stops it.
            browser.get(f"{url}/jobs/{slow}")
            assert wait_for(browser, "#job-state").text == "running"
            click(browser, "#action-cancel")
            assert "asked to stop it" in wait_for(browser, "#cancel-explained").text
            browser.find_element(By.ID, "cancel-reason").send_keys("too <b>slow</b>")
            click(browser, "#confirm-button")
            assert "its worker was asked to stop it" in wait_for(browser, "#notice").text
            wait_until(
                lambda: (
                    value(db, "select state from graphile_worker.py_job_status(%s)", (slow,))
                    == "cancelled"
                ),
                30,
                "the slow job recorded as cancelled",
            )
            browser.get(f"{url}/jobs/{slow}")
            assert wait_for(browser, "#job-state").text == "cancelled"
            assert "too <b>slow</b>" in browser.find_element(By.ID, "job-cancelled").text

            # The scheduled job: cancelled at once, never run.
            browser.get(f"{url}/jobs/{later}")
            click(browser, "#action-cancel")
            click(browser, "#confirm-button")
            assert "was cancelled" in wait_for(browser, "#notice").text
            assert browser.current_url == f"{url}/jobs/{later}"
            assert wait_for(browser, "#job-state").text == "cancelled"
            assert job_row(db, later) is None

            browser.get(url + "/finished?state=cancelled")
            wait_for(browser, "#finished-table")
            assert row_ids(browser, "#finished-table") == [later, slow]
            assert console_errors(browser) == []
    finally:
        worker.terminate()
        worker.wait(30)


def pause_rows(db: str) -> list[tuple[str, str, bool]]:
    return [
        (row["kind"], row["name"], row["hold_queue_lock"])
        for row in rows(
            db,
            "select kind, name, hold_queue_lock from graphile_worker._private_py_pauses "
            "order by kind, name",
        )
    ]


def test_the_pauses_panel_pauses_and_resumes(db: str, browser: WebDriver) -> None:
    """The overview's form pauses a queue (the panel lists it, the queues table
    flags it), refuses bad input in the red banner naming the field, and
    Resume ends the pause."""
    add_job(db, "send_email", queue_name="mail")
    add_job(db, "charge")
    with serve_cli(db) as url:
        browser.get(url + "/")
        assert "Nothing is paused" in wait_for(browser, "#no-pauses").text
        assert not browser.find_element(By.ID, "pause-form").is_displayed()
        browser.find_element(By.ID, "pause-summary").click()
        Select(browser.find_element(By.ID, "pause-kind")).select_by_value("queue")
        browser.find_element(By.ID, "pause-name").send_keys("mail")
        browser.find_element(By.ID, "pause-for").send_keys("2h")
        browser.find_element(By.ID, "pause-reason").send_keys("deploy <b>v2</b>")
        browser.find_element(By.ID, "pause-hold").click()
        click(browser, "#pause-button")
        done = wait_for(browser, "#notice.notice-done")
        assert done.text.startswith("Paused queue mail")
        assert browser.current_url == url + "/"
        assert pause_rows(db) == [("queue", "mail", True)]
        row = wait_for(browser, "#pauses-table tr[data-pause='queue:mail']")
        assert "deploy <b>v2</b>" in row.text and "held off" in row.text
        assert "in 1h 59m" in row.text or "in 2h 00m" in row.text, row.text
        queues = browser.find_element(By.ID, "queues-table").text
        assert "paused" in queues and "held for its pause" in queues
        assert "paused" not in browser.find_element(By.ID, "tasks-table").text

        # Bad input: refused in the red banner, one line naming the field.
        browser.find_element(By.ID, "pause-summary").click()
        Select(browser.find_element(By.ID, "pause-kind")).select_by_value("task")
        browser.find_element(By.ID, "pause-name").send_keys("charge")
        browser.find_element(By.ID, "pause-for").send_keys("soon")
        click(browser, "#pause-button")
        refused = wait_for(browser, "#notice")
        assert refused.get_attribute("class") == "notice notice-refused"
        assert refused.text == (
            "Refused: For: 'soon' is not a length such as 90s, 10m, 2h or 1d. Nothing was changed."
        )
        assert pause_rows(db) == [("queue", "mail", True)]

        # Every task, until a time (UTC).
        browser.find_element(By.ID, "pause-summary").click()
        Select(browser.find_element(By.ID, "pause-kind")).select_by_value("task")
        browser.find_element(By.ID, "pause-name").send_keys("*")
        field = browser.find_element(By.ID, "pause-until")
        browser.execute_script("arguments[0].value = '2099-01-02T03:04:05'", field)  # type: ignore[no-untyped-call]
        click(browser, "#pause-button")
        assert wait_for(browser, "#notice").text.startswith("Paused every task")
        assert "every task" in wait_for(browser, "#pauses-table tr[data-pause='task:*']").text
        assert browser.find_element(By.ID, "tasks-table").text.count("paused") == 2

        click(browser, "#pauses-table tr[data-pause='queue:mail'] button")
        assert wait_for(browser, "#notice").text.startswith("Resumed queue mail")
        assert pause_rows(db) == [("task", "*", False)]
        assert browser.find_elements(By.CSS_SELECTOR, "tr[data-pause='queue:mail']") == []
        click(browser, "#pauses-table tr[data-pause='task:*'] button")
        assert wait_for(browser, "#notice").text.startswith("Resumed every task")
        wait_for(browser, "#no-pauses")
        assert pause_rows(db) == []
        assert console_errors(browser) == []


def test_a_refresh_keeps_the_pause_form_open_and_what_is_typed(db: str, browser: WebDriver) -> None:
    """The page refreshes itself, but not over a form being filled in: an open
    pause form stays open, and once a field holds something the page waits.
    (The content is replaced every 0.3 s: each step is one script, never
    an element found by one call and used by the next.)"""

    def script(code: str) -> Any:
        return browser.execute_script(code)  # type: ignore[no-untyped-call]

    with serve_app(create_app(db, refresh=0.3)) as url:
        browser.get(url + "/")
        wait_for(browser, "#refresh-toggle")
        script("document.getElementById('pause-details').open = true")
        rows(db, "select graphile_worker.py_pause('task', 'first')")
        wait_for(browser, "#pauses-table tr[data-pause='task:first']")  # refreshed
        assert script("return document.getElementById('pause-details').open") is True

        # Typed, and no field has the focus: the page waits.
        script("document.getElementById('pause-name').value = 'mail'")
        assert script("return document.activeElement === document.body")
        rows(db, "select graphile_worker.py_pause('task', 'second')")
        time.sleep(1.5)  # five refresh intervals
        assert browser.find_elements(By.CSS_SELECTOR, "tr[data-pause='task:second']") == []
        assert script("return document.getElementById('pause-name').value") == "mail"

        script("document.getElementById('pause-name').value = ''")
        wait_for(browser, "#pauses-table tr[data-pause='task:second']")
        assert console_errors(browser) == []


def test_read_only_shows_the_pauses_without_the_form(db: str, browser: WebDriver) -> None:
    rows(db, "select graphile_worker.py_pause('queue', 'mail', reason => 'deploy')")
    with serve_cli(db, "--read-only") as url:
        browser.get(url + "/")
        assert "deploy" in wait_for(browser, "#pauses-table tr[data-pause='queue:mail']").text
        assert browser.find_elements(By.ID, "pause-form") == []
        assert browser.find_elements(By.CSS_SELECTOR, "#pauses-table button") == []


def limit_rows(db: str) -> list[tuple[Any, ...]]:
    return [
        (row["kind"], row["name"], row["max_running"], row["max_starts"], row["partition_by"])
        for row in rows(
            db,
            "select kind, name, max_running, max_starts, partition_by "
            "from graphile_worker._private_py_limits order by kind, name",
        )
    ]


def test_the_limits_panel_sets_changes_and_removes(db: str, browser: WebDriver) -> None:
    """The overview's form limits a task (the panel lists it, the tasks table
    flags it), the panel shows the slots and starts in use once jobs are
    locked, bad input is refused in the red banner naming the field, a
    row's Change fills the form, and Remove ends the limit."""
    for _ in range(5):
        add_job(db, "charge")
    with serve_cli(db) as url:
        # Away from the last test's page first (refreshing from its server, gone),
        # and its console errors dropped.
        browser.get("about:blank")
        console_errors(browser)
        browser.get(url + "/")
        assert "Nothing is limited" in wait_for(browser, "#no-limits").text
        assert not browser.find_element(By.ID, "limit-form").is_displayed()
        browser.find_element(By.ID, "limit-summary").click()
        Select(browser.find_element(By.ID, "limit-kind")).select_by_value("task")
        browser.find_element(By.ID, "limit-name").send_keys("charge")
        browser.find_element(By.ID, "limit-max-running").send_keys("3")
        browser.find_element(By.ID, "limit-max-starts").send_keys("50")
        browser.find_element(By.ID, "limit-per").send_keys("1h")
        click(browser, "#limit-button")
        done = wait_for(browser, "#notice.notice-done")
        assert done.text.startswith("Limited task charge: at most 3 running, at most 50 starts")
        assert browser.current_url == url + "/"
        assert limit_rows(db) == [("task", "charge", 3, 50, None)]
        row = wait_for(browser, "#limits-table tr[data-limit='task:charge']")
        assert "0 / 3 running" in row.text and "0 / 50 starts in the last 1h" in row.text
        assert "limited" in browser.find_element(By.ID, "tasks-table").text

        # Three jobs locked as a worker's fetch locks them: the slots are full.
        rows(
            db,
            "select id from graphile_worker.py_fetch_limited_jobs("
            "array(select id from graphile_worker._private_tasks), null, 10, 'p')",
        )
        browser.get(url + "/")
        row = wait_for(browser, "#limits-table tr[data-limit='task:charge']")
        assert "3 / 3 running" in row.text and "3 / 50 starts in the last 1h" in row.text
        assert "full" in row.text

        # Bad input: refused in the red banner, one line naming the field.
        browser.find_element(By.ID, "limit-summary").click()
        browser.find_element(By.ID, "limit-name").send_keys("charge")
        browser.find_element(By.ID, "limit-max-starts").send_keys("5")
        browser.find_element(By.ID, "limit-per").send_keys("soon")
        click(browser, "#limit-button")
        refused = wait_for(browser, "#notice")
        assert refused.get_attribute("class") == "notice notice-refused"
        assert refused.text == (
            "Refused: Per: 'soon' is not a length such as 90s, 10m, 2h or 1d. Nothing was changed."
        )
        assert limit_rows(db) == [("task", "charge", 3, 50, None)]

        # Change: the row's button fills the form with the limit.
        # (One script: the page may refresh its content between two calls;
        # once the form holds the limit, it waits.)
        browser.execute_script(  # type: ignore[no-untyped-call]
            "document.querySelector(\"tr[data-limit='task:charge'] .limit-change\").click()"
        )
        assert browser.find_element(By.ID, "limit-form").is_displayed()
        fields = ["limit-kind", "limit-name", "limit-max-running", "limit-max-starts"]
        fields += ["limit-per", "limit-partition"]
        values = {
            field: browser.find_element(By.ID, field).get_attribute("value") for field in fields
        }
        assert values == {
            "limit-kind": "task",
            "limit-name": "charge",
            "limit-max-running": "3",
            "limit-max-starts": "50",
            "limit-per": "1h",
            "limit-partition": "",
        }
        field = browser.find_element(By.ID, "limit-max-running")
        field.clear()
        field.send_keys("5")
        browser.find_element(By.ID, "limit-partition").send_keys("account_id")
        click(browser, "#limit-button")
        assert wait_for(browser, "#notice").text.startswith(
            "Limited task charge: at most 5 running, at most 50 starts per 1h, per value of "
            "account_id."
        )
        assert limit_rows(db) == [("task", "charge", 5, 50, "account_id")]
        row = wait_for(browser, "#limits-table tr[data-limit='task:charge']")
        assert "per account_id" in row.text, row.text

        click(browser, "#limits-table tr[data-limit='task:charge'] form button")
        assert wait_for(browser, "#notice").text.startswith("Removed the limit of task charge")
        wait_for(browser, "#no-limits")
        assert limit_rows(db) == []
        assert "limited" not in browser.find_element(By.ID, "tasks-table").text
        assert console_errors(browser) == []


def test_read_only_shows_the_limits_without_the_form(db: str, browser: WebDriver) -> None:
    rows(db, "select graphile_worker.py_set_limit('queue', 'mail', 4)")
    with serve_cli(db, "--read-only") as url:
        browser.get(url + "/")
        row = wait_for(browser, "#limits-table tr[data-limit='queue:mail']")
        assert "0 / 4 running" in row.text
        assert browser.find_elements(By.ID, "limit-form") == []
        assert browser.find_elements(By.CSS_SELECTOR, "#limits-table button") == []


def nightly_import() -> Workflow:
    """A workflow of twelve steps over six depths."""
    wf = Workflow("nightly import")
    fetch = wf.add("fetch_feed", ref="fetch")
    parsed = [wf.add("parse", {"part": p}, ref=f"parse-{p}", after=[fetch]) for p in PARTS]
    images = wf.add("resize_images", ref="resize-images", after=[parsed[2]], max_attempts=1)
    validate = wf.add("validate", after=parsed)
    wf.add("cleanup", ref="cleanup-orders", after=[parsed[0]], run_if="failed")
    load = wf.add("load", ref="load-warehouse", after=[validate])
    cdn = wf.add("purge_cdn", ref="purge-cdn", after=[images])
    wf.add("alert", ref="alert-oncall", after=[images], run_if="failed")
    search = wf.add("reindex", ref="rebuild-search-index-for-every-shop", after=[load])
    wf.add("report", after=[search, cdn], run_if="finished")
    return wf


PARTS = ("orders", "customers", "products")

#: The links of the graph that pass through a box other than their parent's
#: and child's: (parent, child, box), each point of each link checked.
LINKS_THROUGH_BOXES = """
const boxes = Array.from(document.querySelectorAll('#workflow-graph g.graph-node'))
  .map(g => [g.dataset.ref, g.querySelector('rect').getBBox()]);
const found = new Set();
for (const link of document.querySelectorAll('#workflow-graph path.graph-edge')) {
  const length = link.getTotalLength();
  for (let at = 0; at <= length; at += 2) {
    const p = link.getPointAtLength(at);
    for (const [ref, b] of boxes) {
      if (ref !== link.dataset.parent && ref !== link.dataset.child
          && p.x > b.x && p.x < b.x + b.width && p.y > b.y && p.y < b.y + b.height) {
        found.add([link.dataset.parent, link.dataset.child, ref].join(' '));
      }
    }
  }
}
return Array.from(found);
"""


async def test_a_workflow_drawn_as_a_graph(
    db: str, utils: WorkerUtils, browser: WebDriver, tmp_path: Path
) -> None:
    """The Workflows page links to a workflow's page, whose graph is drawn
    by depth, each box coloured by its state and big enough for its label,
    none over another, a box with a job linking to it; no script, and a
    screenshot (docs/images/dashboard-workflow.png is one)."""
    added = await utils.add_workflow(nightly_import())

    async def ok(payload: Any, helpers: Helpers) -> None:
        pass

    async def broken(payload: Any, helpers: Helpers) -> None:
        raise OSError("image service unreachable")

    tasks = {"fetch_feed": ok, "parse": ok, "resize_images": broken}
    assert await run_once(db, task_list=tasks, no_handle_signals=True) == 0
    alert = value(db, f"select job_id from {STEPS} where ref = 'alert-oncall'")
    update_job(db, alert, "locked_at = now(), locked_by = 'pool-1', attempts = 1")
    browser.set_window_size(1280, 1250)
    try:
        with serve_app(create_app(db, refresh=0)) as url:
            browser.get(url + "/")
            click(browser, "#nav-workflows")
            click(browser, f"#workflows-table a[href='/workflows/{added.id}']")
            graph = wait_for(browser, "#workflow-graph")
            states = {
                node.get_attribute("data-ref"): node.get_attribute("data-state")
                for node in graph.find_elements(By.CSS_SELECTOR, "g.graph-node")
            }
            assert states == {
                "fetch": "succeeded",
                "parse-orders": "succeeded",
                "parse-customers": "succeeded",
                "parse-products": "succeeded",
                "resize-images": "failed",
                "validate": "waiting",
                "cleanup-orders": "skipped",
                "load-warehouse": "blocked",
                "purge-cdn": "cancelled",
                "alert-oncall": "running",
                "rebuild-search-index-for-every-shop": "blocked",
                "report": "blocked",
            }
            boxes = browser.execute_script(
                "return Array.from(document.querySelectorAll('#workflow-graph g.graph-node'))"
                ".map(g => { const r = g.querySelector('rect').getBBox();"
                " const t = g.querySelector('text.graph-ref');"
                " return [g.dataset.ref, r.x, r.y, r.width, r.height,"
                " t.getComputedTextLength(), getComputedStyle(g.querySelector('rect')).fill]; })"
            )
            for ref, x, y, width, height, text, _ in boxes:
                assert text <= width - 8, (ref, text, width)  # the label fits its box
                for other, x2, y2, *_ in boxes:
                    if other != ref:  # no box over another
                        assert abs(x - x2) >= width or abs(y - y2) >= height, (ref, other)
            fills = {ref: fill for ref, *_, fill in boxes}
            assert fills["resize-images"] == "rgb(254, 226, 226)"  # the failed badge's
            assert fills["fetch"] == "rgb(220, 252, 231)"  # the succeeded badge's
            depth = {ref: y for ref, _, y, *_ in boxes}
            assert depth["fetch"] < depth["parse-orders"] == depth["parse-products"]
            assert depth["parse-products"] < depth["validate"] < depth["load-warehouse"]
            assert depth["load-warehouse"] < depth["rebuild-search-index-for-every-shop"]
            assert depth["rebuild-search-index-for-every-shop"] < depth["report"]
            assert len(browser.find_elements(By.CSS_SELECTOR, "#workflow-graph .graph-edge")) == 14
            # No link runs through a box but its own two (purge-cdn's to report
            # goes round rebuild-search's box, between them).
            assert browser.execute_script(LINKS_THROUGH_BOXES) == []
            assert console_errors(browser) == []
            shot = tmp_path / "dashboard-workflow.png"
            browser.save_screenshot(str(shot))
            assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            click(browser, "g.graph-node[data-ref='alert-oncall'] a")
            assert browser.current_url == f"{url}/jobs/{alert}"
            assert wait_for(browser, "#job-state").text == "running"
    finally:
        browser.set_window_size(1400, 1000)


def test_a_refresh_keeps_a_tall_graph_scrolled(db: str, browser: WebDriver) -> None:
    """A graph taller than its box scrolls inside it, and the page's refresh
    (every 0.3 s here) leaves it where it was scrolled to."""
    wf = Workflow("wide")
    root = wf.add("split")
    for n in range(200):
        wf.add("part", ref=f"part-{n}", after=[root])
    with make_sync_worker_utils(connection_string=db) as sync_utils:
        added = sync_utils.add_workflow(wf)

    def script(code: str) -> Any:
        return browser.execute_script(code)  # type: ignore[no-untyped-call]

    with serve_app(create_app(db, refresh=0.3)) as url:
        browser.get(f"{url}/workflows/{added.id}")
        wait_for(browser, "#workflow-graph")
        box = "document.getElementById('graph-scroll')"
        assert script(f"return {box}.scrollHeight > {box}.clientHeight + 400")
        script(f"{box}.scrollTop = 400")
        rows(db, f"update {WORKFLOWS} set name = 'renamed' where id = %s", (added.id,))
        wait_for_text(browser, "#workflow-name", "renamed")  # refreshed
        assert script(f"return {box}.scrollTop") == 400
        assert console_errors(browser) == []
