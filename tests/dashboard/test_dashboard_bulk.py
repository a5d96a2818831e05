"""The Jobs page's bulk actions: retry, reschedule, permanently fail or
delete every job matching the list's filter, confirmed with the count (and
the locked jobs that will be skipped), done in batches of 1,000 ids, each a
transaction of its own; refused in --read-only and without a filter."""

from __future__ import annotations

import html
import re
from datetime import datetime, timedelta
from urllib.parse import urlencode

import pytest
from dashboard_helpers import (
    COOKIE,
    SECRET,
    TOKEN,
    Reply,
    chromium,
    click,
    console_errors,
    follow,
    http,
    serve_app,
    wait_for,
)
from dbhelpers import rows, value
from selenium.webdriver.common.by import By

from worker_cli.dashboard import create_app

pytestmark = pytest.mark.db

JOBS = "graphile_worker._private_jobs"


def add_jobs(db: str, task: str, count: int, **columns: object) -> list[int]:
    """``count`` jobs of ``task`` (in one add_jobs call), then ``columns`` set."""
    ids = [
        int(row["id"])
        for row in rows(
            db,
            "select id from graphile_worker.add_jobs(array(select (%s, '{}'::json, null, null, "
            "null, null, null, null)::graphile_worker.job_spec from generate_series(1, %s)))",
            (task, count),
        )
    ]
    if columns:
        names = ", ".join(f"{name} = %({name})s" for name in columns)
        rows(db, f"update {JOBS} set {names} where id = any(%(ids)s)", {**columns, "ids": ids})
    return ids


def fail_for_good(db: str, ids: list[int], error: str = "boom") -> None:
    rows(
        db,
        f"update {JOBS} set attempts = max_attempts, last_error = %s where id = any(%s)",
        (error, ids),
    )


def lock(db: str, ids: list[int]) -> None:
    rows(
        db,
        f"update {JOBS} set locked_at = now(), locked_by = 'pool-x' where id = any(%s)",
        (ids,),
    )


def post(url: str, fields: dict[str, str]) -> Reply:
    body = urlencode({"csrf_token": TOKEN, **fields}).encode()
    return http(url, data=body, headers={"Cookie": COOKIE})


def confirmation(body: str) -> dict[str, int]:
    found = re.search(
        r'id="bulk-confirm" data-count="(\d+)" data-held="(\d+)" data-upto="(\d+)"', body
    )
    assert found is not None, body[-1500:]
    return dict(zip(("count", "held", "upto"), map(int, found.groups()), strict=True))


def notice(page: Reply) -> tuple[str, str]:
    found = re.search(r'id="notice" data-outcome="(\w+)">(.*?)</div>', page.body, re.S)
    assert found is not None, page.body[-1500:]
    return found.group(1), html.unescape(re.sub(r"<[^>]+>", "", found.group(2)))


def test_retry_all_2500_in_batches_skipping_the_locked(db: str, url: str) -> None:
    charge = add_jobs(db, "charge_card", 2500)
    fail_for_good(db, charge)
    lock(db, charge[:3])
    other = add_jobs(db, "send_email", 5)
    fail_for_good(db, other)
    page = http(url + "/bulk/retry?task=charge_card")
    assert page.status == 200
    shown = confirmation(page.body)
    assert shown == {"count": 2500, "held": 3, "upto": charge[-1]}
    text = html.unescape(re.sub(r"<[^>]+>", "", page.body))
    assert "2,500 jobs match (task charge_card)." in text
    assert "3 of them are locked by a worker" in text
    assert "Done in 3 batches of at most 1,000 jobs" in text
    assert 'id="confirm-button">Retry 2,500 jobs</button>' in page.body
    # a job added after the confirmation is not touched
    late = add_jobs(db, "charge_card", 1)
    fail_for_good(db, late)
    reply = post(url + "/bulk/retry", {"task": "charge_card", "upto": str(shown["upto"])})
    assert reply.status == 303
    assert reply.headers["location"] == "/jobs?task=charge_card"
    assert notice(follow(url, reply, COOKIE)) == (
        "done",
        "Retried 2,497 jobs (task charge_card); skipped 3 jobs locked by a worker.",
    )
    retried = rows(
        db,
        f"select count(*) as jobs, count(distinct xmin::text) as transactions from {JOBS} "
        "where id = any(%s) and attempts = 0",
        (charge[3:],),
    )[0]
    assert retried == {"jobs": 2497, "transactions": 3}  # 1,000 + 1,000 + 497
    assert (
        value(
            db, f"select count(*) from {JOBS} where id = any(%s) and attempts = 25", (charge[:3],)
        )
        == 3
    )
    assert value(db, f"select attempts from {JOBS} where id = %s", (late[0],)) == 25
    assert (
        value(db, f"select count(*) from {JOBS} where id = any(%s) and attempts = 25", (other,))
        == 5
    )


def test_reschedule_fail_and_delete_by_queue_and_state(db: str, url: str) -> None:
    mail = add_jobs(db, "mail", 4)
    fail_for_good(db, mail[:2], "SMTP 550")
    rows(db, f"update {JOBS} set run_at = now() + interval '1 hour' where id = %s", (mail[3],))
    # reschedule the scheduled one: run in 10 minutes
    page = http(url + "/bulk/reschedule?" + urlencode({"task": "mail", "state": "scheduled"}))
    assert confirmation(page.body)["count"] == 1
    before = value(db, "select now()")
    assert isinstance(before, datetime)
    reply = post(
        url + "/bulk/reschedule",
        {"task": "mail", "state": "scheduled", "minutes": "10", "upto": str(mail[-1])},
    )
    assert notice(follow(url, reply, COOKIE))[1] == (
        "Rescheduled 1 job (task mail, state scheduled)."
    )
    run_at = value(db, f"select run_at from {JOBS} where id = %s", (mail[3],))
    assert timedelta(minutes=9) < run_at - before < timedelta(minutes=11)
    # fail the waiting ones: the last error is kept; the failed ones are left
    reply = post(url + "/bulk/fail", {"task": "mail", "reason": "stop", "upto": str(mail[-1])})
    assert notice(follow(url, reply, COOKIE))[1] == (
        "Permanently failed 2 jobs (task mail); left 2 jobs as they were (already failed for good)."
    )
    errors = rows(db, f"select id, last_error from {JOBS} where id = any(%s) order by id", (mail,))
    assert [row["last_error"] for row in errors] == ["SMTP 550", "SMTP 550", "stop", "stop"]
    # delete the permanently failed ones
    page = http(url + "/bulk/delete?state=failed&task=mail")
    assert confirmation(page.body)["count"] == 4
    reply = post(url + "/bulk/delete", {"task": "mail", "state": "failed", "upto": str(mail[-1])})
    assert reply.headers["location"] == "/jobs?task=mail&state=failed"
    assert notice(follow(url, reply, COOKIE))[1] == ("Deleted 4 jobs (task mail, state failed).")
    assert value(db, f"select count(*) from {JOBS}") == 0


def test_no_match_no_filter_bad_filter_and_forged_posts_are_refused(db: str, url: str) -> None:
    jobs = add_jobs(db, "hello", 3)
    none = http(url + "/bulk/retry?task=nobody")
    assert confirmation(none.body)["count"] == 0 and 'id="confirm-button"' not in none.body
    reply = post(url + "/bulk/delete", {"task": "nobody", "upto": str(jobs[-1])})
    assert notice(follow(url, reply, COOKIE)) == (
        "refused",
        "Refused: No job matches (task nobody): nothing was changed.",
    )
    for page in (http(url + "/bulk/delete"), post(url + "/bulk/delete", {"upto": str(jobs[-1])})):
        assert page.status == 400
        assert "refusing to act on every job" in page.body
    bad = post(url + "/bulk/delete", {"state": "everything", "upto": str(jobs[-1])})
    assert bad.status == 400 and "unknown state" in html.unescape(bad.body)
    forged = http(
        url + "/bulk/delete",
        data=urlencode({"csrf_token": "x", "task": "hello", "upto": str(jobs[-1])}).encode(),
        headers={"Cookie": COOKIE},
    )
    assert forged.status == 403
    assert http(url + "/bulk/explode?task=hello").status == 404
    assert value(db, f"select count(*) from {JOBS}") == 3


def test_read_only_shows_no_bulk_buttons_and_refuses(db: str) -> None:
    add_jobs(db, "hello", 2)
    with serve_app(create_app(db, csrf_secret=SECRET, read_only=True, refresh=0)) as url:
        assert 'id="bulk-actions"' not in http(url + "/jobs?task=hello").body
        assert http(url + "/bulk/delete?task=hello").status == 403
        reply = post(url + "/bulk/delete", {"task": "hello", "upto": "999999"})
        assert reply.status == 403
    assert value(db, f"select count(*) from {JOBS}") == 2


def test_the_buttons_show_only_with_a_filter(db: str, url: str) -> None:
    add_jobs(db, "hello", 1)
    assert 'id="bulk-actions"' not in http(url + "/jobs").body
    page = http(url + "/jobs?task=hello&state=waiting").body
    assert 'href="/bulk/retry?task=hello&amp;state=waiting"' in page
    for action in ("reschedule", "fail", "delete"):
        assert f'id="bulk-{action}" href="/bulk/{action}?task=hello&amp;state=waiting"' in page


@pytest.mark.slow
def test_bulk_retry_in_a_browser(db: str, url: str) -> None:
    ids = add_jobs(db, "charge_card", 12)
    fail_for_good(db, ids)
    lock(db, ids[:1])
    add_jobs(db, "other", 2)
    with chromium() as browser:
        browser.get(url + "/jobs?task=charge_card")
        wait_for(browser, "#bulk-actions")
        click(browser, "#bulk-retry")
        assert browser.find_element(By.ID, "bulk-count").text == "12 jobs match (task charge_card)."
        assert "1 of them is locked" in browser.find_element(By.ID, "bulk-held").text
        assert browser.find_element(By.ID, "confirm-button").text == "Retry 12 jobs"
        click(browser, "#confirm-button")
        assert browser.current_url.endswith("/jobs?task=charge_card")
        assert browser.find_element(By.ID, "notice").text == (
            "Retried 11 jobs (task charge_card); skipped 1 job locked by a worker."
        )
        assert console_errors(browser) == []
    assert value(db, f"select count(*) from {JOBS} where attempts = 0") == 13  # 11 + the 2 others
