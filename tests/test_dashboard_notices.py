"""The banner after an action, over HTTP: a refusal (nothing was changed) is
shown as a refusal, not in the green of an action done."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
from dashboard_helpers import Reply, http, serve_app
from dbhelpers import rows, value

from worker_cli.dashboard import create_app
from worker_cli.dashboard.security import Csrf

pytestmark = pytest.mark.db

SECRET, NONCE = b"s" * 32, "a-browser"
TOKEN = Csrf(SECRET).token(NONCE)
COOKIE = f"{Csrf.COOKIE}={NONCE}"


@pytest.fixture
def url(db: str) -> Iterator[str]:
    with serve_app(create_app(db, csrf_secret=SECRET)) as base:
        yield base


def add_job(db: str, **options: Any) -> int:
    names = "".join(f", {name} => %({name})s" for name in options)
    return int(value(db, f"select id from graphile_worker.add_job('hello'{names})", options))


def lock(db: str, job_id: int, pool: str) -> None:
    rows(
        db,
        "update graphile_worker._private_jobs set locked_at = now(), locked_by = %s, "
        "attempts = 1 where id = %s",
        (pool, job_id),
    )


def post(url: str, fields: dict[str, str] | None = None) -> Reply:
    body = urlencode({"csrf_token": TOKEN, **(fields or {})}).encode()
    return http(url, data=body, headers={"Cookie": COOKIE})


def after(base: str, reply: Reply) -> Reply:
    """The page an action's redirect leads to, as the browser gets it."""
    assert reply.status == 303, (reply.status, reply.body[-600:])
    return http(base + reply.headers["location"], headers={"Cookie": COOKIE})


def banner(page: Reply) -> tuple[str, str, str] | None:
    """The page's banner: its outcome (``data-outcome``), its classes and its text."""
    found = re.search(
        r'<div class="([^"]*)"[^>]* id="notice" data-outcome="(\w+)">(.*?)</div>', page.body
    )
    if found is None:
        return None
    text = html.unescape(re.sub(r"<[^>]+>", "", found.group(3)))
    return found.group(2), found.group(1), text


def assert_refused(page: Reply, says: str) -> None:
    shown = banner(page)
    assert shown is not None, page.body[-800:]
    outcome, classes, text = shown
    assert outcome == "refused" and "notice-refused" in classes.split(), shown
    assert "notice-done" not in classes.split()
    assert text.startswith("Refused: ") and says in text, text
    assert 'role="alert"' in page.body


def assert_done(page: Reply, says: str) -> None:
    shown = banner(page)
    assert shown is not None, page.body[-800:]
    outcome, classes, text = shown
    assert outcome == "done" and "notice-done" in classes.split(), shown
    assert "notice-refused" not in classes.split()
    assert says in text and "Refused" not in text, text


def test_a_refused_action_is_shown_as_a_refusal(db: str, url: str) -> None:
    running = add_job(db)
    lock(db, running, "pool-busy")
    assert_refused(after(url, post(f"{url}/jobs/{running}/delete")), "locked by a worker")
    assert_refused(after(url, post(f"{url}/jobs/{running}/fail")), "locked by a worker")

    deleted = add_job(db)
    assert_done(after(url, post(f"{url}/jobs/{deleted}/delete")), f"Job {deleted} was deleted")
    assert_refused(after(url, post(f"{url}/jobs/{deleted}/reschedule")), "no longer in the jobs")
    assert_refused(after(url, http(f"{url}/jobs/{deleted}/delete")), "no longer in the jobs")
    # Cancel: the job had finished already (here: no row anywhere, a 404 page).
    cancelled = after(url, post(f"{url}/jobs/{deleted}/cancel"))
    assert cancelled.status == 404
    assert_refused(cancelled, "had already finished (unknown)")

    rows(
        db,
        "insert into graphile_worker._private_py_heartbeats (pool_id, timeout) "
        "values ('pool-live', interval '1 hour')",
    )
    assert_refused(after(url, post(f"{url}/pools/unlock", {"pool": "pool-live"})), "live heartbeat")


def test_an_action_done_is_shown_as_done(db: str, url: str) -> None:
    job_id = add_job(db, run_at="2099-01-01T00:00:00Z")
    assert_done(after(url, post(f"{url}/jobs/{job_id}/run-now")), "will run now")
    assert_done(after(url, post(f"{url}/jobs/{job_id}/fail")), "permanently failed")
    running = add_job(db)
    lock(db, running, "pool-busy")
    # Asked to stop: done (the request is made), not a refusal.
    assert_done(after(url, post(f"{url}/jobs/{running}/cancel")), "asked to stop it")
    assert_done(after(url, post(f"{url}/pools/unlock", {"pool": "pool-dead"})), "Released")
