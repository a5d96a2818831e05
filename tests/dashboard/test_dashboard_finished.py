"""The dashboard and the job lifecycle, over HTTP: the Finished view (the
history, filtered and paged), a finished job's page, the unknown job, a live
job's state in ``py_job_status``'s words, and the Cancel action."""

from __future__ import annotations

import re
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from dashboard_helpers import COOKIE, SECRET, TOKEN, Reply, follow, http, serve_app
from dbhelpers import list_history_for_expiry, rows, value

from worker_cli import Helpers, WorkerUtils, run_once
from worker_cli.dashboard import create_app
from worker_cli.dashboard.security import Csrf

pytestmark = pytest.mark.db

HISTORY = "graphile_worker._private_py_job_history"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


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
    list_history_for_expiry(db)


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


def post(url: str, fields: dict[str, str] | None = None, **headers: str) -> Reply:
    body = urlencode({"csrf_token": TOKEN, **(fields or {})}).encode()
    return http(url, data=body, headers={"Cookie": COOKIE, **headers})


def status(db: str, job_id: int) -> str:
    return str(value(db, "select state from graphile_worker.py_job_status(%s)", (job_id,)))


def shown_state(url: str, job_id: int) -> str:
    """The state a job's page shows in its heading."""
    page = http(f"{url}/jobs/{job_id}")
    assert page.status == 200, page.body[-800:]
    match = re.search(r'<span id="job-state"><span class="badge badge-(\w+)">', page.body)
    assert match, page.body
    return match.group(1)


# --- the Finished view -----------------------------------------------------------


def test_finished_jobs_newest_first_filtered_by_task_state_and_time(db: str, url: str) -> None:
    """Newest job first (the history's primary key), whenever each finished;
    each filter, alone and together."""
    record(db, 11, T0 + timedelta(minutes=5), task="mail")
    record(db, 12, T0 + timedelta(minutes=1), task="resize", state="failed", last_error="boom")
    record(db, 13, T0 + timedelta(minutes=4), task="mail", state="cancelled")
    record(db, 14, T0 + timedelta(minutes=2), task="resize")
    record(db, 15, T0 + timedelta(minutes=3), task="mail", state="failed", last_error="bad")
    record(db, 16, T0 + timedelta(minutes=6), task="resize", state="cancelled")

    everything = finished(url)
    assert listed(everything) == [16, 15, 14, 13, 12, 11]
    for job_id in (11, 16):
        assert f'href="/jobs/{job_id}"' in everything.body
    assert listed(finished(url, task="mail")) == [15, 13, 11]
    assert listed(finished(url, state="failed")) == [15, 12]
    assert listed(finished(url, state="cancelled")) == [16, 13]
    assert listed(finished(url, state="succeeded")) == [14, 11]
    # Finished strictly after and before (UTC, as the form's fields say).
    assert listed(finished(url, after="2026-03-01T12:02:00", before="2026-03-01T12:05:00")) == [
        15,
        13,
    ]
    assert listed(finished(url, after="2026-03-01T12:04:00")) == [16, 11]
    assert listed(finished(url, before="2026-03-01T13:02:00+01:00")) == [12]
    assert listed(finished(url, task="mail", state="failed", before="2026-03-01T12:04:00")) == [15]
    nothing = finished(url, task="mail", state="succeeded", after="2026-03-01T12:05:00")
    assert listed(nothing) == [] and 'id="no-finished"' in nothing.body
    assert "No finished job matches" in nothing.body


def test_finished_pages_by_cursor_through_a_batch(db: str, url: str) -> None:
    """130 jobs, 60 of them finished by one statement (one finished_at) across
    the first page's end: three pages, each job once, newest job first."""
    batch_at = T0 + timedelta(minutes=30)
    for job_id in range(1, 131):
        if 20 <= job_id < 80:
            at = batch_at
        else:
            at = T0 + timedelta(seconds=job_id if job_id < 20 else 4000 + job_id)
        record(db, job_id, at)
    order = list(range(130, 0, -1))

    seen: list[int] = []
    page = finished(url)
    for _ in range(3):
        seen += listed(page)
        link = older_link(page)
        if link is None:
            break
        page = http(url + link)
        assert 'id="newest-page"' in page.body
    assert link is None, "more than three pages"
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
    list_history_for_expiry(db)
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
        ({"cursor": "2026-03-01T12:00:00Z_5"}, "bad cursor"),
        ({"cursor": "0"}, "bad cursor"),
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


# --- a job's page -------------------------------------------------------------------


async def test_a_finished_jobs_page_shows_its_record(db: str, url: str, utils: WorkerUtils) -> None:
    """Jobs a worker really ran: succeeded with its result, failed for good and
    archived with its error, cancelled with its reason."""
    done = await utils.add_job("resize", {"width": 640})
    failed = await utils.add_job("broken", {}, max_attempts=1)
    doomed = await utils.add_job("resize", {"width": 1}, run_at=T0 + timedelta(days=3650))

    async def resize(payload: dict[str, int], helpers: Helpers) -> dict[str, Any]:
        return {"width": payload["width"] // 2, "format": "<b>webp</b>"}

    async def broken(payload: Any, helpers: Helpers) -> None:
        raise RuntimeError("the <i>image</i> service is down")

    assert (
        await run_once(db, task_list={"resize": resize, "broken": broken}, no_handle_signals=True)
        == 0
    )
    await utils.cleanup(tasks=["DELETE_PERMAFAILED_JOBS"])
    assert await utils.cancel_job(doomed.id, "the upload was <deleted>") == "cancelled"

    page = http(f"{url}/jobs/{done.id}")
    assert page.status == 200
    assert "its record in the history" in page.body
    assert shown_state(url, done.id) == "succeeded"
    result = re.search(r'<pre class="payload" id="job-result">(.*?)</pre>', page.body, re.S)
    assert result, page.body
    assert (
        result.group(1)
        == "{\n  &#34;width&#34;: 320,\n  &#34;format&#34;: &#34;&lt;b&gt;webp&lt;/b&gt;&#34;\n}"
    )
    record_of = await utils.get_job_result(done.id)
    assert record_of.started_at is not None and record_of.finished_at is not None
    for moment in (record_of.created_at, record_of.started_at, record_of.finished_at):
        assert moment is not None
        assert moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") in page.body
    assert 'id="job-attempts">1 of 25<' in page.body

    page = http(f"{url}/jobs/{failed.id}")
    assert shown_state(url, failed.id) == "failed"
    assert "the &lt;i&gt;image&lt;/i&gt; service is down" in page.body
    assert 'id="job-last-error"' in page.body and 'id="job-no-result"' in page.body

    page = http(f"{url}/jobs/{doomed.id}")
    assert shown_state(url, doomed.id) == "cancelled"
    assert "the upload was &lt;deleted&gt;" in page.body
    assert 'id="job-cancelled"' in page.body


def test_a_large_result_is_cut_like_a_payload(db: str, url: str) -> None:
    """A result longer than a payload is shown (200,000 characters, pretty
    printed) is cut, and one longer than the page reads (a result may be 64
    MiB) is not even sent whole."""
    record(db, 1, T0, result='{"text": "' + "x" * 300_000 + '"}')
    record(db, 2, T0, result='["' + "y" * 3_000_000 + '"]')
    record(db, 3, T0, result='{"small":[1,2]}')
    record(db, 4, T0, result='"' + secrets.token_hex(20_000) + '"')  # stored uncompressed
    one = http(f"{url}/jobs/1")
    assert one.status == 200 and len(one.body) < 250_000
    assert "more characters)" in one.body
    two = http(f"{url}/jobs/2")
    assert two.status == 200 and len(two.body) < 250_000
    assert "(2,800,004 more characters)" in two.body
    assert "{\n  &#34;small&#34;: [\n    1,\n    2\n  ]\n}" in http(f"{url}/jobs/3").body
    # The list previews a result only up to 300 characters, and not one
    # stored in more than 16 kB, whose size it shows.
    listing = finished(url)
    assert listed(listing) == [4, 3, 2, 1]
    assert len(listing.body) < 30_000
    assert "a result of 40.0 kB" in listing.body


def test_an_unknown_job_is_a_styled_404(db: str, url: str) -> None:
    """No row anywhere: a job completed with history off, and an id never used."""
    job_id = add_job(db)
    rows(db, "select graphile_worker.complete_jobs(array[%s]::bigint[])", (job_id,))
    for unknown in (job_id, 424242):
        reply = http(f"{url}/jobs/{unknown}")
        assert reply.status == 404
        assert 'class="topbar"' in reply.body and "Unknown job" in reply.body
        assert f"job {unknown} is unknown" in reply.body
        for why in ("Node worker", "--history off", "removed", "pruned", "never existed"):
            assert why in reply.body, why


def test_a_live_jobs_state_is_py_job_status(db: str, url: str) -> None:
    later = add_job(db, run_at="2099-01-01T00:00:00Z")
    due = add_job(db)
    running = add_job(db)
    retrying = add_job(db, run_at="2099-01-01T00:00:00Z")
    failed = add_job(db, max_attempts=2)
    update = "update graphile_worker._private_jobs set {} where id = %s"
    rows(db, update.format("locked_at = now(), locked_by = 'pool-a', attempts = 1"), (running,))
    rows(db, update.format("attempts = 1, last_error = 'once'"), (retrying,))
    rows(db, update.format("attempts = 2, last_error = 'twice'"), (failed,))
    states = {
        job_id: shown_state(url, job_id) for job_id in (later, due, running, retrying, failed)
    }
    assert states == {job_id: status(db, job_id) for job_id in states}
    assert list(states.values()) == ["scheduled", "waiting", "running", "retrying", "failed"]


def test_a_running_job_asked_to_cancel_says_so(db: str, url: str) -> None:
    running = add_job(db)
    rows(
        db,
        "update graphile_worker._private_jobs set locked_at = now(), locked_by = 'pool-a', "
        "attempts = 1 where id = %s",
        (running,),
    )
    assert 'id="job-cancel-request"' not in http(f"{url}/jobs/{running}").body
    rows(
        db,
        "select * from graphile_worker.py_cancel_jobs(array[%s]::bigint[], 'too slow')",
        (running,),
    )
    page = http(f"{url}/jobs/{running}")
    requested = value(
        db,
        "select requested_at from graphile_worker._private_py_cancellations where job_id = %s",
        (running,),
    )
    assert 'id="job-cancel-request"' in page.body
    assert f"Asked to cancel at {requested.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC" in page.body
    assert "too slow" in page.body and "asked to cancel</span>" in page.body
    assert shown_state(url, running) == "running"


def test_a_stuck_job_is_shown_on_its_page_and_its_pools(db: str, url: str) -> None:
    """Only its pool knows a job is stuck: its heartbeat lists it."""
    stuck, fine = add_job(db), add_job(db)
    rows(
        db,
        "update graphile_worker._private_jobs set locked_at = now(), locked_by = 'pool-a', "
        "attempts = 1 where id = any(%s)",
        ([stuck, fine],),
    )
    rows(
        db,
        "insert into graphile_worker._private_py_heartbeats (pool_id, timeout, stuck_job_ids) "
        "values ('pool-a', interval '5 minutes', %s)",
        ([stuck],),
    )
    page = http(f"{url}/jobs/{stuck}")
    assert 'id="job-stuck"' in page.body and 'id="job-stuck-note"' in page.body
    assert "It keeps its slot and its lock, so it never runs twice" in page.body
    assert shown_state(url, stuck) == "running"
    assert 'id="job-stuck"' not in http(f"{url}/jobs/{fine}").body
    pools = http(f"{url}/pools")
    assert pools.status == 200
    stuck_cell = re.search(r'<td class="stuck">(.*?)</td>', pools.body)
    assert stuck_cell is not None and f'href="/jobs/{stuck}"' in stuck_cell.group(1)
    assert f'href="/jobs/{fine}"' not in stuck_cell.group(1)


# --- the Cancel action ---------------------------------------------------------------


def test_cancelling_a_waiting_job(db: str, url: str) -> None:
    job_id = add_job(db, job_key="report-1")
    assert 'id="action-cancel"' in http(f"{url}/jobs/{job_id}").body
    confirm = http(f"{url}/jobs/{job_id}/cancel")
    assert confirm.status == 200 and 'id="confirm-form"' in confirm.body
    assert "It never runs" in confirm.body

    done = post(f"{url}/jobs/{job_id}/cancel", {"reason": "  not <needed>  "})
    assert done.status == 303
    assert done.headers["location"] == f"/jobs/{job_id}"
    assert status(db, job_id) == "cancelled"
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0
    [kept] = rows(db, f"select state, cancel_reason from {HISTORY} where job_id = %s", (job_id,))
    assert kept == {"state": "cancelled", "cancel_reason": "not <needed>"}

    page = follow(url, done, COOKIE)
    assert page.status == 200
    assert f"Job {job_id} was cancelled: it will not run." in page.body
    assert shown_state(url, job_id) == "cancelled" and "not &lt;needed&gt;" in page.body


def test_cancelling_a_running_job(db: str, url: str) -> None:
    job_id = add_job(db, job_key="sync", max_attempts=5)
    rows(
        db,
        "update graphile_worker._private_jobs set locked_at = now(), locked_by = 'pool-a', "
        "attempts = 1 where id = %s",
        (job_id,),
    )
    confirm = http(f"{url}/jobs/{job_id}/cancel")
    assert "its worker is asked to stop it" in confirm.body
    assert "the admin functions leave it alone" not in confirm.body

    done = post(f"{url}/jobs/{job_id}/cancel", {"reason": ""})
    assert done.status == 303
    assert done.headers["location"] == f"/jobs/{job_id}"
    assert status(db, job_id) == "running"
    [job] = rows(
        db, "select attempts, max_attempts, key, locked_by from graphile_worker._private_jobs"
    )
    assert job == {"attempts": 5, "max_attempts": 5, "key": None, "locked_by": "pool-a"}
    [request] = rows(
        db, "select job_id, reason, pool_id from graphile_worker._private_py_cancellations"
    )
    assert request == {"job_id": job_id, "reason": None, "pool_id": "pool-a"}

    page = follow(url, done, COOKIE)
    assert f"Job {job_id} is running: its worker was asked to stop it" in page.body
    assert 'id="job-cancel-request"' in page.body


def test_cancelling_a_finished_or_unknown_job_changes_nothing(db: str, url: str) -> None:
    record(db, 7, T0, result='{"ok": true}')
    done = post(f"{url}/jobs/7/cancel")
    assert done.headers["location"] == "/jobs/7"
    assert (
        "Job 7 had already finished (succeeded): nothing was changed."
        in follow(url, done, COOKIE).body
    )
    assert value(db, f"select state from {HISTORY} where job_id = 7") == "succeeded"

    unknown = post(f"{url}/jobs/8/cancel")
    assert unknown.headers["location"] == "/jobs/8"
    page = follow(url, unknown, COOKIE)
    assert page.status == 404 and "Job 8 had already finished (unknown)" in page.body
    # The confirmation of a job that is gone sends to its page.
    gone = http(f"{url}/jobs/7/cancel")
    assert gone.headers["location"] == "/jobs/7"
    assert "Job 7 is no longer in the jobs table" in follow(url, gone).body


def test_cancel_is_refused_read_only_and_without_its_token(db: str) -> None:
    job_id = add_job(db)
    action = f"/jobs/{job_id}/cancel"
    with serve_app(create_app(db, read_only=True, csrf_secret=SECRET)) as url:
        assert 'id="action-cancel"' not in http(f"{url}/jobs/{job_id}").body
        assert http(url + action).status == 403
        refused = post(url + action, {"reason": "no"})
        assert refused.status == 403 and "read-only" in refused.body
    assert status(db, job_id) == "waiting"
    with serve_app(create_app(db, csrf_secret=SECRET)) as url:
        for reply in (
            http(url + action, data=b"reason=no", headers={"Cookie": COOKIE}),  # no token
            post(url + action, {"csrf_token": "0" * 64}),  # a wrong one
            post(url + action, {}, Cookie=f"{Csrf.COOKIE}=another-browser"),  # another's
            post(url + action, {}, **{"Sec-Fetch-Site": "cross-site"}),
        ):
            assert reply.status == 403, reply.body[-400:]
        assert status(db, job_id) == "waiting"
        assert post(url + action).status == 303  # the same form, with its token
    assert status(db, job_id) == "cancelled"
