"""The overview's throughput chart: jobs completed, failed for good,
cancelled and added per minute (or per 5 or 20 minutes) over the last hours,
and the longest wait, from the history of finished jobs and the live jobs;
per task; bounded reads; drawn as an inline SVG under the dashboard's CSP
(checked in Chromium, which reports a violation as a console error)."""

from __future__ import annotations

import html
import math
import re
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest
from dashboard_helpers import chromium, click, console_errors, http, wait_for
from dbhelpers import list_history_for_expiry, rows, value
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from worker_cli.dashboard import throughput
from worker_cli.sql import compose
from worker_cli.sql import dashboard as dashboard_sql

pytestmark = pytest.mark.db

HISTORY = "graphile_worker._private_py_job_history"


def db_now(db: str) -> datetime:
    found = value(db, "select now()")
    assert isinstance(found, datetime)
    return found


def record(
    db: str,
    job_id: int,
    finished_at: datetime,
    *,
    task: str = "hello",
    state: str = "succeeded",
    wait: float | None = None,
    created_at: datetime | None = None,
) -> None:
    """A history row: due a minute before it finished (or ``wait`` seconds
    before it started, started a second before it finished)."""
    started = finished_at - timedelta(seconds=1) if state != "cancelled" else None
    run_at = (started or finished_at) - timedelta(seconds=wait or 0)
    values = {
        "job_id": job_id,
        "state": state,
        "task_identifier": task,
        "created_at": created_at or run_at,
        "run_at": run_at,
        "started_at": started,
        "finished_at": finished_at,
        "expires_at": finished_at + timedelta(days=1),
    }
    rows(
        db,
        f"insert into {HISTORY} (job_id, state, task_identifier, priority, attempts, "
        "max_attempts, revision, created_at, run_at, started_at, finished_at, expires_at) "
        "values (%(job_id)s, %(state)s, %(task_identifier)s, 0, 1, 25, 0, %(created_at)s, "
        "%(run_at)s, %(started_at)s, %(finished_at)s, %(expires_at)s)",
        values,
    )


def live_job(db: str, task: str, created_at: datetime, *, failed_at: datetime | None = None) -> int:
    """A live job added at ``created_at``; failed for good at ``failed_at``."""
    job_id = int(value(db, "select id from graphile_worker.add_job(%s)", (task,)))
    rows(
        db,
        "update graphile_worker._private_jobs set created_at = %s where id = %s",
        (created_at, job_id),
    )
    if failed_at is not None:
        rows(
            db,
            "update graphile_worker._private_jobs set attempts = max_attempts, "
            "last_error = 'boom', updated_at = %s where id = %s",
            (failed_at, job_id),
        )
    return job_id


def attempt_error(db: str, job_id: int, task: str, failed_at: datetime, *, retried: bool) -> None:
    """A failed attempt's error (migrations/py/000018.sql), as the failure
    statement writes it: retried or the job's last."""
    rows(
        db,
        "insert into graphile_worker._private_py_job_errors "
        "(job_id, task_identifier, attempt, failed_at, error, retried) "
        "values (%s, %s, 1, %s, 'boom', %s)",
        (job_id, task, failed_at, retried),
    )


def buckets(body: str) -> dict[str, dict[str, Any]]:
    """The chart's buckets: start (ISO, UTC) -> its figures."""
    found = {}
    for attrs in re.findall(r'<g class="bucket" ([^>]*)>', body):
        fields = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', attrs))
        start = fields.pop("start")
        found[start] = {
            name: (float(text) if name == "max-wait" and text else int(text) if text else None)
            for name, text in fields.items()
        }
    return found


def total(body: str, kind: str) -> str:
    found = re.search(rf'id="total-{kind}">([^<]*)<', body)
    assert found is not None, body[-2000:]
    return html.unescape(found.group(1))


def start_of(moment: datetime, step: int) -> str:
    """The ISO start of the bucket of ``moment`` (``step`` seconds each)."""
    epoch = math.floor(moment.timestamp() / step) * step
    return datetime.fromtimestamp(epoch, moment.tzinfo).isoformat()


def expected(events: list[tuple[datetime, str]], step: int) -> dict[str, Counter[str]]:
    counts: dict[str, Counter[str]] = {}
    for moment, kind in events:
        counts.setdefault(start_of(moment, step), Counter())[kind] += 1
    return counts


def fill(db: str) -> tuple[datetime, list[tuple[datetime, str]]]:
    """Known history rows and live jobs around now; the events the chart of
    the last hour must count (task hello and task other)."""
    now = db_now(db)
    ten, twenty, thirty, forty = (now - timedelta(minutes=m) for m in (10, 20, 30, 40))
    for n, wait in enumerate((2.0, 5.0, 30.0)):
        record(db, 1_000_001 + n, ten, wait=wait, created_at=forty)
    record(db, 1_000_004, ten, task="other", wait=90.0, created_at=forty)
    record(db, 1_000_005, twenty, state="failed", created_at=forty)
    record(db, 1_000_006, twenty, state="failed", created_at=forty)
    record(db, 1_000_007, twenty, state="cancelled", created_at=forty)
    # outside the last hour, inside the last 6 hours
    record(db, 1_000_008, now - timedelta(hours=2), created_at=now - timedelta(hours=3))
    list_history_for_expiry(db)
    live_job(db, "hello", thirty, failed_at=thirty + timedelta(seconds=5))
    live_job(db, "hello", thirty)
    live_job(db, "other", now - timedelta(hours=5))  # added outside the last hour
    attempt_error(db, 1_000_009, "hello", twenty, retried=True)
    attempt_error(db, 1_000_009, "hello", ten, retried=True)
    attempt_error(db, 1_000_009, "hello", ten, retried=False)  # its last: failed for good
    attempt_error(db, 1_000_010, "other", ten, retried=True)
    events = [(ten, "completed")] * 3 + [(twenty, "failed")] * 2 + [(twenty, "cancelled")]
    events += [(forty, "added")] * 6 + [(thirty, "added")] * 2
    events += [(thirty + timedelta(seconds=5), "failed")]
    events += [(twenty, "retried"), (ten, "retried")]
    return now, events


def assert_chart(body: str, events: list[tuple[datetime, str]], step: int, count: int) -> None:
    shown = buckets(body)
    assert len(shown) == count
    wanted = expected(events, step)
    for start, figures in shown.items():
        want = wanted.get(start, Counter())
        kinds = ("completed", "failed", "cancelled", "added", "retried")
        got = {kind: figures[kind] for kind in kinds}
        assert got == {kind: want[kind] for kind in got}, (start, got, want)
    assert set(wanted) <= set(shown)


def test_the_chart_counts_the_history_and_the_live_jobs_per_minute(db: str, url: str) -> None:
    _, events = fill(db)
    page = http(url + "/?hours=1&task=hello")
    assert page.status == 200, page.body[-800:]
    assert_chart(page.body, events, 60, 60)
    assert total(page.body, "completed") == "3"
    assert total(page.body, "failed") == "3"  # 2 archived in the history, 1 still a row
    assert total(page.body, "cancelled") == "1"
    assert total(page.body, "added") == "8"
    assert total(page.body, "retried") == "2"  # the final attempt is a failure for good
    assert total(page.body, "wait") == "30s"
    [ten] = [b for start, b in buckets(page.body).items() if b["completed"]]
    assert ten["max-wait"] == 30.0
    assert 'id="history-empty"' not in page.body and 'id="chart-partial"' not in page.body
    assert "<script" not in page.body.split("</head>")[1]


def test_every_task_and_one_task(db: str, url: str) -> None:
    fill(db)
    every = http(url + "/?hours=1").body
    assert total(every, "completed") == "4"
    assert total(every, "added") == "9"
    assert total(every, "wait") == "1m 30s"
    other = http(url + "/?hours=1&task=other").body
    assert total(other, "completed") == "1"
    assert total(other, "failed") == "0"
    assert total(other, "added") == "1"
    assert total(other, "retried") == "1"
    assert '<option value="other" selected>other</option>' in other


def test_six_hours_by_five_minutes_reach_further(db: str, url: str) -> None:
    now, events = fill(db)
    page = http(url + "/?task=hello").body  # 6 hours is the default
    events += [(now - timedelta(hours=2), "completed"), (now - timedelta(hours=3), "added")]
    assert_chart(page, events, 300, 72)
    assert total(page, "completed") == "4"
    assert total(page, "added") == "9"
    day = http(url + "/?hours=24&task=other").body
    assert len(buckets(day)) == 72
    assert total(day, "added") == "2"  # the live job added 5 hours ago


def test_the_range_fits_fresh_activity(db: str, url: str) -> None:
    """Activity of the last minutes only: the default 6 h chart shows the
    last hour by minute (it put everything into its rightmost 5-minute bars),
    and says so; what 24 h holds within 6 h is shown by 5 minutes."""
    now = db_now(db)
    record(db, 1_000_001, now - timedelta(minutes=3), created_at=now - timedelta(minutes=4))
    record(db, 1_000_002, now - timedelta(minutes=12), created_at=now - timedelta(minutes=13))
    events = [(now - timedelta(minutes=m), "completed") for m in (3, 12)]
    events += [(now - timedelta(minutes=m), "added") for m in (4, 13)]
    page = http(url + "/").body
    assert_chart(page, events, 60, 60)
    assert "last 1 h" in page and 'id="chart-fitted"' in page
    assert "(nothing earlier in the last 6 h)" in page
    assert '<option value="6" selected>6 h</option>' in page  # the choice stays
    assert total(page, "completed") == "2"
    record(db, 1_000_003, now - timedelta(hours=3), created_at=now - timedelta(hours=3))
    events += [(now - timedelta(hours=3), "completed"), (now - timedelta(hours=3), "added")]
    day = http(url + "/?hours=24").body
    assert_chart(day, events, 300, 72)
    assert "(nothing earlier in the last 24 h)" in day
    six = http(url + "/?hours=6").body
    assert_chart(six, events, 300, 72)
    assert 'id="chart-fitted"' not in six
    list_history_for_expiry(db)


def test_an_empty_history_is_said_and_a_bad_choice_refused(url: str) -> None:
    page = http(url + "/")
    assert page.status == 200
    assert 'id="history-empty"' in page.body
    assert total(page.body, "completed") == "0"
    bad = http(url + "/?hours=5&task=%00")
    assert bad.status == 400
    assert "hours '5' is not one of 1, 6, 24; showing 6" in html.unescape(bad.body)
    assert "contains a NUL character" in html.unescape(bad.body)
    assert len(buckets(bad.body)) == 72


def test_the_reads_are_capped_and_the_partial_part_is_said(
    db: str, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a cap of 3 rows a table, only the 3 newest history rows (by id)
    and the 3 newest live jobs are counted, and the chart says from when its
    figures are complete."""
    now = db_now(db)
    for n in range(6):
        record(
            db,
            2_000_001 + n,
            now - timedelta(minutes=30 - n),
            created_at=now - timedelta(minutes=50 - n),
        )
    list_history_for_expiry(db)
    monkeypatch.setattr(throughput, "CHART_READ", 3)
    page = http(url + "/?hours=1").body
    assert total(page, "completed") == "3"
    assert total(page, "added") == "3"
    assert 'id="chart-partial"' in page
    assert 'class="chart-partial"' in page  # the shaded part of the chart
    monkeypatch.setattr(throughput, "CHART_READ", 50_000)
    page = http(url + "/?hours=1").body
    assert total(page, "completed") == "6"
    assert 'id="chart-partial"' not in page


def test_the_chart_reads_the_newest_rows_by_primary_key(db: str) -> None:
    """The plan reads both tables through their primary keys (no sequential
    scan of the history or of the jobs)."""
    import json

    import psycopg

    fill(db)
    params = {"read": 50_000, "task": None, "start": db_now(db), "end": db_now(db), "step": 60}
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("set enable_seqscan = off")
        plan = conn.execute(
            psycopg.sql.SQL("explain (format json) ")
            + compose(dashboard_sql.CHART_BUCKETS, "graphile_worker"),
            params,
        ).fetchone()
    assert plan is not None
    text = json.dumps(plan[0])
    assert '"Index Name": "_private_py_job_history_pkey"' in text
    assert '"Index Name": "jobs_pkey1"' in text
    assert '"Index Name": "_private_py_job_errors_pkey"' in text
    assert '"Scan Direction": "Backward"' in text


@pytest.mark.slow
def test_the_chart_in_a_browser(db: str, url: str) -> None:
    """Chromium draws the chart with no CSP violation, a bucket's tooltip says
    its figures, and the task filter narrows it."""
    fill(db)
    with chromium() as browser:
        browser.get(url + "/?hours=1")
        chart = wait_for(browser, "#throughput-chart")
        assert chart.size["width"] > 500 and chart.size["height"] > 80
        bars = browser.find_elements(By.CSS_SELECTOR, "#throughput-chart rect.bar-completed")
        assert len(bars) == 1 and bars[0].size["height"] > 10
        fill_colour = browser.execute_script("return getComputedStyle(arguments[0]).fill;", bars[0])
        assert fill_colour == "rgb(22, 163, 74)"  # from the stylesheet: no inline style
        assert len(browser.find_elements(By.CSS_SELECTOR, "#throughput-chart rect.bar-failed")) == 2
        titles = [
            element.get_attribute("textContent")
            for element in browser.find_elements(
                By.CSS_SELECTOR, "#throughput-chart g.bucket title"
            )
        ]
        assert any(
            "4 completed, 0 failed for good, 0 cancelled, 2 attempts retried, 0 added" in t
            for t in titles
        )
        retried = browser.find_element(By.CSS_SELECTOR, "#throughput-chart polyline.line-retried")
        stroke = browser.execute_script("return getComputedStyle(arguments[0]).stroke;", retried)
        assert stroke == "rgb(234, 88, 12)"
        assert browser.find_element(By.ID, "total-completed").text == "4"
        Select(browser.find_element(By.ID, "chart-task")).select_by_visible_text("other")
        click(browser, "#chart-submit")
        assert "task=other" in browser.current_url
        assert browser.find_element(By.ID, "total-completed").text == "1"
        assert browser.find_element(By.ID, "total-added").text == "1"
        assert console_errors(browser) == []


def test_a_job_due_since_minus_infinity_has_no_wait(db: str, url: str) -> None:
    """add_job accepts run_at => '-infinity': such a job, finished, counts as
    completed, with no wait (PostgreSQL 15 refuses to subtract an infinite
    timestamp; 17 and later make it an infinite interval)."""
    now = db_now(db)
    record(db, 3_000_001, now - timedelta(minutes=5), wait=12.0)
    rows(
        db,
        f"insert into {HISTORY} (job_id, state, task_identifier, priority, attempts, "
        "max_attempts, revision, created_at, run_at, started_at, finished_at, expires_at) "
        "values (3000002, 'succeeded', 'hello', 0, 1, 25, 0, %(at)s, '-infinity', %(at)s, "
        "%(at)s, %(at)s + interval '1 day')",
        {"at": now - timedelta(minutes=5)},
    )
    list_history_for_expiry(db)
    page = http(url + "/?hours=1")
    assert page.status == 200, page.body[-800:]
    assert total(page.body, "completed") == "2"
    assert total(page.body, "wait") == "12s"
