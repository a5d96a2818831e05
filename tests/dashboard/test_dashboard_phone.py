"""The dashboard on a phone (headless Chromium, 420 px wide): no page scrolls
sideways. The navigation takes a row of its own and stays inside the screen;
a table wider than the screen scrolls inside its panel."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from dashboard_helpers import chromium, click, serve_app, wait_for
from dbhelpers import list_history_for_expiry, rows, value
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from worker_cli import Workflow, make_sync_worker_utils
from worker_cli.dashboard import create_app

pytestmark = [pytest.mark.db, pytest.mark.slow]

WIDTH = 420
LONG_POOL = "pool-" + "4f0c9d2e8a7b6c5d" * 4
LONG_ERROR = "ConnectionError:" + "x" * 300


@pytest.fixture(scope="module")
def phone() -> Iterator[WebDriver]:
    with chromium() as driver:
        driver.set_window_size(WIDTH, 900)
        yield driver


def fill(db: str) -> int:
    """Jobs, a named queue held by a pool with a long name, a long error, a
    finished job and a cron item: the widest of each page. The locked job's id."""
    rows(db, "select graphile_worker.add_job('send_email', job_key => 'welcome-mail-42')")
    rows(db, "select graphile_worker.add_job('billing/charge', queue_name => 'billing')")
    failed = int(value(db, "select id from graphile_worker.add_job('resize_image')"))
    rows(
        db,
        "update graphile_worker._private_jobs set attempts = 25, last_error = %s where id = %s",
        (LONG_ERROR, failed),
    )
    rows(
        db,
        "update graphile_worker._private_jobs set locked_at = now(), locked_by = %s, "
        "attempts = 1 where job_queue_id is not null",
        (LONG_POOL,),
    )
    rows(
        db,
        "update graphile_worker._private_job_queues set locked_at = now(), locked_by = %s",
        (LONG_POOL,),
    )
    finished = datetime.now(UTC) - timedelta(minutes=1)
    rows(
        db,
        "insert into graphile_worker._private_py_job_history (job_id, state, task_identifier, "
        "priority, attempts, max_attempts, revision, created_at, run_at, finished_at, "
        "expires_at, result) values (100001, 'succeeded', 'resize_image', 0, 1, 25, 0, "
        "%(at)s, %(at)s, %(at)s, %(at)s + interval '1 day', '{\"width\": 640}')",
        {"at": finished},
    )
    list_history_for_expiry(db)
    rows(
        db,
        "insert into graphile_worker._private_known_crontabs values "
        "('nightly-report', now() - interval '2 days', now() - interval '3 hours')",
    )
    # Pauses: a long reason, a long task name, a held queue (the panel's table).
    rows(
        db,
        "select graphile_worker.py_pause('task', %s, now() + interval '2 hours', %s)",
        ("reports/" + "quarterly_revenue_by_region_" * 3, "Deploy: " + "x" * 300),
    )
    rows(db, "select graphile_worker.py_pause('queue', 'billing', null, 'card provider down')")
    # Limits: a long task name, partitioned by a long field, in use (the panel's table).
    long_task = "reports/" + "quarterly_revenue_by_region_" * 3
    rows(
        db,
        "select graphile_worker.py_set_limit('task', %s, 3, 50, interval '10 minutes', %s)",
        (long_task, "customer_" + "account_identifier_" * 5),
    )
    rows(db, "select graphile_worker.py_set_limit('task', 'send_email', 10000, 10000, '1 day')")
    return failed


def add_workflow(db: str) -> int:
    """A workflow with a long name, long refs and eight steps at one depth
    (a graph wider than the screen); its id."""
    wf = Workflow("nightly " + "import_of_every_shop_" * 4)
    root = wf.add("fetch_feed", ref="fetch-" + "x" * 100)
    for n in range(8):
        wf.add("parse", {"n": n}, ref=f"parse-part-{n}-" + "y" * 60, after=[root])
    with make_sync_worker_utils(connection_string=db) as utils:
        return utils.add_workflow(wf).id


def overflow(phone: WebDriver) -> dict[str, int]:
    """The page's width, the viewport's, and the right edge of the navigation."""
    result: dict[str, int] = phone.execute_script(  # type: ignore[no-untyped-call]
        "const nav = document.querySelector('.nav').getBoundingClientRect();"
        "return {scroll: document.documentElement.scrollWidth,"
        " client: document.documentElement.clientWidth,"
        " inner: window.innerWidth, nav: Math.ceil(nav.right)};"
    )
    return result


def test_no_page_scrolls_sideways_on_a_phone(db: str, phone: WebDriver) -> None:
    failed = fill(db)
    workflow = add_workflow(db)
    pages = [
        "/",
        "/jobs",
        "/finished",
        f"/jobs/{failed}",
        "/jobs/100001",
        f"/jobs/{failed}/reschedule",
        "/pools",
        "/crontab",
        "/workflows",
        f"/workflows/{workflow}",
        f"/workflows/{workflow}/cancel",
        "/nosuch",
    ]
    with serve_app(create_app(db, refresh=0)) as url:
        for path in pages:
            phone.get(url + path)
            wait_for(phone, "#content")
            sizes = overflow(phone)
            assert sizes["inner"] == WIDTH, sizes
            # Nothing wider than the viewport: no sideways scrolling of the page.
            assert sizes["scroll"] <= sizes["client"] <= sizes["inner"], (path, sizes)
            assert sizes["nav"] <= sizes["client"], (path, sizes)
        # The overview with its pause form open (it stacks its fields).
        phone.get(url + "/")
        wait_for(phone, "#pause-summary").click()
        assert phone.find_element(By.ID, "pause-form").is_displayed()
        sizes = overflow(phone)
        assert sizes["scroll"] <= sizes["client"] <= sizes["inner"], ("/ (pause form)", sizes)
        for field in phone.find_elements(By.CSS_SELECTOR, "#pause-form input, #pause-form select"):
            assert field.rect["x"] + field.rect["width"] <= WIDTH, field.get_attribute("id")
        # And with the limit form open, filled in from a limit's Change button.
        phone.get(url + "/")
        wait_for(phone, "#limits-table .limit-change").click()
        assert phone.find_element(By.ID, "limit-form").is_displayed()
        sizes = overflow(phone)
        assert sizes["scroll"] <= sizes["client"] <= sizes["inner"], ("/ (limit form)", sizes)
        for field in phone.find_elements(By.CSS_SELECTOR, "#limit-form input, #limit-form select"):
            assert field.rect["x"] + field.rect["width"] <= WIDTH, field.get_attribute("id")
        # Its banner names the long task: it wraps.
        click(phone, "#limit-button")
        assert "Limited task reports/" in wait_for(phone, "#notice").text
        sizes = overflow(phone)
        assert sizes["scroll"] <= sizes["client"] <= sizes["inner"], ("/ (limit banner)", sizes)
        # Every link of the navigation is on the screen (none past its edge).
        for link in phone.find_elements(By.CSS_SELECTOR, ".nav a"):
            assert link.is_displayed()
            assert link.rect["x"] + link.rect["width"] <= WIDTH, link.text
