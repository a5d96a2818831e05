"""The dashboard and the job lifecycle, over HTTP: the Finished view (the
history, filtered and paged)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from dashboard_helpers import Reply, http, serve_app
from dbhelpers import rows, value

from worker_cli.dashboard import create_app

pytestmark = pytest.mark.db

HISTORY = "graphile_worker._private_py_job_history"
SECRET = b"s" * 32
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def url(db: str) -> Iterator[str]:
    with serve_app(create_app(db, csrf_secret=SECRET)) as base:
        yield base


def record(
    db: str,
    job_id: int,
    finished_at: datetime,
    *,
    task: str = "hello",
    state: str = "succeeded",
    **columns: Any,
) -> None:
    """A history row, as a worker writes one (the other columns given)."""
    values = {
        "job_id": job_id,
        "state": state,
        "task_identifier": task,
        "priority": 0,
        "attempts": 1,
        "max_attempts": 25,
        "revision": 0,
        "created_at": finished_at - timedelta(minutes=1),
        "run_at": finished_at - timedelta(minutes=1),
        "finished_at": finished_at,
        "expires_at": finished_at + timedelta(days=1),
        **columns,
    }
    names = ", ".join(values)
    placeholders = ", ".join(f"%({name})s" for name in values)
    rows(db, f"insert into {HISTORY} ({names}) values ({placeholders})", values)


def add_job(db: str, task: str = "hello", **options: Any) -> int:
    names = "".join(f", {name} => %({name})s" for name in options)
    return int(
        value(
            db,
            f"select id from graphile_worker.add_job(%(task)s{names})",
            {"task": task, **options},
        )
    )


def ids(body: str) -> list[int]:
    """The job ids a Finished page lists, in order."""
    return [int(job) for job in re.findall(r'<tr data-job="(\d+)"', body)]


def listed(reply: Reply) -> list[int]:
    assert reply.status == 200, reply.body[-800:]
    return ids(reply.body)


def older_link(reply: Reply) -> str | None:
    match = re.search(r'id="older-page" href="([^"]+)"', reply.body)
    return match.group(1).replace("&amp;", "&") if match else None


def finished(url: str, **query: str) -> Reply:
    return http(f"{url}/finished?{urlencode(query)}")


# --- the Finished view -----------------------------------------------------------


def test_finished_jobs_newest_first_filtered_by_task_state_and_time(db: str, url: str) -> None:
    """Ordered by when they finished, not by id; each filter, alone and together."""
    record(db, 11, T0 + timedelta(minutes=5), task="mail")
    record(db, 12, T0 + timedelta(minutes=1), task="resize", state="failed", last_error="boom")
    record(db, 13, T0 + timedelta(minutes=4), task="mail", state="cancelled")
    record(db, 14, T0 + timedelta(minutes=2), task="resize")
    record(db, 15, T0 + timedelta(minutes=3), task="mail", state="failed", last_error="bad")
    record(db, 16, T0 + timedelta(minutes=6), task="resize", state="cancelled")

    everything = finished(url)
    assert listed(everything) == [16, 11, 13, 15, 14, 12]
    for job_id in (11, 16):
        assert f'href="/jobs/{job_id}"' in everything.body
    assert listed(finished(url, task="mail")) == [11, 13, 15]
    assert listed(finished(url, state="failed")) == [15, 12]
    assert listed(finished(url, state="cancelled")) == [16, 13]
    assert listed(finished(url, state="succeeded")) == [11, 14]
    # Finished strictly after and before (UTC, as the form's fields say).
    assert listed(finished(url, after="2026-03-01T12:02:00", before="2026-03-01T12:05:00")) == [
        13,
        15,
    ]
    assert listed(finished(url, after="2026-03-01T12:04:00")) == [16, 11]
    assert listed(finished(url, before="2026-03-01T13:02:00+01:00")) == [12]
    assert listed(finished(url, task="mail", state="failed", before="2026-03-01T12:04:00")) == [15]
    nothing = finished(url, task="mail", state="succeeded", after="2026-03-01T12:05:00")
    assert listed(nothing) == [] and 'id="no-finished"' in nothing.body
    assert "No finished job matches" in nothing.body


def test_finished_pages_by_cursor_through_a_batch(db: str, url: str) -> None:
    """130 jobs, 60 of them finished by one statement (one finished_at) across
    the first page's end: three pages, each job once, in order."""
    batch_at = T0 + timedelta(minutes=30)
    expected: list[tuple[datetime, int]] = []
    for job_id in range(1, 131):
        if 20 <= job_id < 80:
            at = batch_at
        else:
            at = T0 + timedelta(seconds=job_id if job_id < 20 else 4000 + job_id)
        record(db, job_id, at)
        expected.append((at, job_id))
    order = [job_id for _, job_id in sorted(expected, reverse=True)]

    seen: list[int] = []
    page = finished(url)
    pages = 0
    while True:
        pages += 1
        seen += listed(page)
        link = older_link(page)
        if link is None:
            break
        page = http(url + link)
        assert 'id="newest-page"' in page.body
    assert pages == 3
    assert seen == order


def test_a_rare_task_beyond_the_window_is_found_by_searching_older(db: str, url: str) -> None:
    """A page examines at most 10,000 history rows: a task none of the latest
    10,000 has is found on the next, with what was searched said."""
    record(db, 1, T0, task="rare")
    rows(
        db,
        f"insert into {HISTORY} (job_id, state, task_identifier, priority, attempts, "
        "max_attempts, revision, created_at, run_at, finished_at, expires_at) "
        "select 1 + n, 'succeeded', 'bulk', 0, 1, 25, 0, %(t)s, %(t)s, "
        "%(t)s + n * interval '1 second', %(t)s + interval '1 day' "
        "from generate_series(1, 10100) as n",
        {"t": T0},
    )
    first = finished(url, task="rare")
    assert listed(first) == []
    assert "among the 10,000 finished jobs searched" in first.body
    assert "Searched 10,000 finished jobs and found 0" in first.body
    link = older_link(first)
    assert link is not None and "task=rare" in link
    assert listed(http(url + link)) == [1]


def test_bad_filters_are_bad_input(db: str, url: str) -> None:
    record(db, 1, T0)
    for query, says in (
        ({"cursor": "yesterday_5"}, "bad cursor"),
        ({"cursor": "2026-03-01T12:00:00Z_0"}, "bad cursor"),
        ({"after": "last week"}, "finished after: not a date and time"),
        ({"before": "10000-01-01T00:00"}, "finished before: not a date and time"),
        ({"state": "running"}, "unknown state"),
        ({"task": "a\x00b"}, "NUL character"),
    ):
        reply = finished(url, **query)
        assert reply.status == 400, (query, reply.status)
        assert says in reply.body, (query, reply.body[-800:])
        assert 'class="topbar"' in reply.body
        assert ids(reply.body) == [1]  # the rest still shown


def test_the_finished_view_says_when_nothing_is_recorded(db: str, url: str) -> None:
    empty = finished(url)
    assert empty.status == 200
    assert 'id="no-history"' in empty.body
    assert "No finished job is recorded" in empty.body
    assert "--history off" in empty.body and "in the last day" in empty.body
    assert 'id="no-history"' in finished(url, task="mail").body  # filtered: the same

    record(db, 1, T0, task="hello")
    filtered = finished(url, task="mail")
    assert listed(filtered) == []
    assert 'id="no-history"' not in filtered.body and 'id="no-finished"' in filtered.body
    assert 'id="no-history"' not in finished(url).body
