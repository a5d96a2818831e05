"""A job's errors on its pages, and the dashboard's "Permanently fail" keeping
the real error: the new last error is ``REASON (was: ERROR)`` (the reason
alone for a job that never failed), as ``graphile-worker fail`` writes it; a
job already failed for good is left as it is. A job keeps one error (each
attempt's replaces the one before; the history copies the last): the pages
say so, and show the errors a kept chain holds. Over HTTP, and in Chromium."""

from __future__ import annotations

import html
import re
from typing import Any
from urllib.parse import urlencode

import pytest
from dashboard_helpers import (
    COOKIE,
    TOKEN,
    Reply,
    chromium,
    click,
    console_errors,
    follow,
    http,
    wait_for,
)
from dbhelpers import rows, value
from selenium.webdriver.common.by import By

from worker_cli.dashboard.error_chain import error_chain

pytestmark = pytest.mark.db

HTML_ERROR = '<img src=x id=evil onerror="window.pwned = 1"> boom'


def add_job(db: str, *, attempts: int = 0, max_attempts: int = 25, error: str | None = None) -> int:
    job_id = int(value(db, "select id from graphile_worker.add_job('hello')"))
    rows(
        db,
        "update graphile_worker._private_jobs set attempts = %s, max_attempts = %s, "
        "last_error = %s where id = %s",
        (attempts, max_attempts, error, job_id),
    )
    return job_id


def job(db: str, job_id: int) -> dict[str, Any]:
    [found] = rows(db, "select * from graphile_worker._private_jobs where id = %s", (job_id,))
    return found


def fail(url: str, job_id: int, reason: str) -> Reply:
    body = urlencode({"csrf_token": TOKEN, "reason": reason}).encode()
    return follow(
        url, http(f"{url}/jobs/{job_id}/fail", data=body, headers={"Cookie": COOKIE}), COOKIE
    )


def chain(body: str) -> list[str]:
    """The entries of the page's error chain (none when it shows one error)."""
    found = re.search(r'<ol class="error-chain" id="job-error-chain">(.*?)</ol>', body, re.S)
    if found is None:
        return []
    return [
        html.unescape(e)
        for e in re.findall(r'<pre class="error-block">(.*?)</pre>', found.group(1), re.S)
    ]


def banner(page: Reply) -> tuple[str, str]:
    found = re.search(r'data-outcome="(\w+)">(.*?)</div>', page.body, re.S)
    assert found, page.body[-600:]
    return found.group(1), html.unescape(re.sub(r"<[^>]+>", "", found.group(2)))


def test_the_chain_of_a_last_error() -> None:
    assert error_chain(None) == [] and error_chain("") == []
    assert error_chain("KeyError: 'x'") == ["KeyError: 'x'"]
    assert error_chain("stop (was: boom)") == ["stop", "boom"]
    assert error_chain("again (was: stop (was: boom))") == ["again", "stop", "boom"]
    assert error_chain("f(x) (was: g(y) failed)") == ["f(x)", "g(y) failed"]
    # Not what the fail action writes: kept whole.
    assert error_chain("it broke (was: fine") == ["it broke (was: fine"]


def test_permanently_fail_keeps_the_real_error(db: str, url: str) -> None:
    retrying = add_job(db, attempts=2, error=HTML_ERROR)
    page = fail(url, retrying, "not needed any more")
    assert banner(page) == ("done", f"Job {retrying} was permanently failed.")
    row = job(db, retrying)
    assert row["last_error"] == f"not needed any more (was: {HTML_ERROR})"
    assert row["attempts"] == row["max_attempts"]
    # Its page: each error apart, as text, once (how it is stored said in a
    # note, not repeated whole).
    assert chain(page.body) == ["not needed any more", HTML_ERROR]
    assert 'id="evil"' not in page.body
    assert 'id="job-last-error-stored"' in page.body
    assert row["last_error"] not in html.unescape(page.body)
    assert 'id="job-errors-kept"' in page.body

    never_failed = add_job(db)
    fail(url, never_failed, "obsolete")
    assert job(db, never_failed)["last_error"] == "obsolete"

    # Failed for good already: left as it is (its error is not wrapped again).
    failed = add_job(db, attempts=25, error="ValueError: the real one")
    page = fail(url, failed, "cleanup")
    assert banner(page) == (
        "refused",
        f"Refused: Job {failed} was already permanently failed: its last error is kept as it "
        "is. Nothing was changed.",
    )
    assert job(db, failed)["last_error"] == "ValueError: the real one"
    assert chain(page.body) == []  # one error: shown once

    locked = add_job(db, attempts=1, error="boom")
    rows(
        db,
        "update graphile_worker._private_jobs set locked_at = now(), locked_by = 'pool-x' "
        "where id = %s",
        (locked,),
    )
    outcome, text = banner(fail(url, locked, "cleanup"))
    assert outcome == "refused" and "locked by a worker" in text
    assert job(db, locked)["last_error"] == "boom"


def test_a_finished_job_shows_the_errors_it_kept(db: str, url: str) -> None:
    job_id = add_job(db, attempts=3, error="TimeoutError: no answer")
    fail(url, job_id, "gave up")
    # Cancelled: it moves to the history with its last error.
    body = urlencode({"csrf_token": TOKEN, "reason": "not wanted"}).encode()
    http(f"{url}/jobs/{job_id}/cancel", data=body, headers={"Cookie": COOKIE})
    assert value(db, "select state from graphile_worker._private_py_job_history") == "cancelled"
    page = http(f"{url}/jobs/{job_id}")
    assert "finished: its record in the history" in page.body
    assert chain(page.body) == ["gave up", "TimeoutError: no answer"]
    assert "(the history copied it when the job finished)" in page.body


@pytest.mark.slow
def test_in_a_browser(db: str, url: str) -> None:
    job_id = add_job(db, attempts=1, error=HTML_ERROR)
    with chromium() as browser:
        browser.get(f"{url}/jobs/{job_id}")
        assert HTML_ERROR in wait_for(browser, "#job-last-error").text
        assert browser.find_elements(By.ID, "job-error-chain") == []
        click(browser, "#action-fail")
        reason = wait_for(browser, "#fail-reason")
        reason.clear()
        reason.send_keys("<b>stop</b>")
        click(browser, "#confirm-button")
        assert "permanently failed" in wait_for(browser, "#notice.notice-done").text
        entries = [
            e.text
            for e in browser.find_elements(By.CSS_SELECTOR, "#job-error-chain pre.error-block")
        ]
        assert entries == ["<b>stop</b>", HTML_ERROR]
        assert browser.find_elements(By.ID, "evil") == []
        assert browser.execute_script("return window.pwned") is None  # type: ignore[no-untyped-call]
        assert job(db, job_id)["last_error"] == f"<b>stop</b> (was: {HTML_ERROR})"

        # Again: already failed for good, so refused, and the error stays.
        click(browser, "#action-fail")
        click(browser, "#confirm-button")
        assert "already permanently failed" in wait_for(browser, "#notice.notice-refused").text
        assert job(db, job_id)["last_error"] == f"<b>stop</b> (was: {HTML_ERROR})"
        assert console_errors(browser) == []
