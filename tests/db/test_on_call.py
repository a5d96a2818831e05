"""On-call from the command line and the job's page (issue 43;
migrations/py/000023.sql): each failed attempt's traceback kept beside its
error, the payload in ``job ID`` (cut) and ``--json`` (whole), attempt numbers
that say which attempt it really was (a cancel while running, an operator's
retry), removals recorded in the history, and an admin-failed job's error
shown once on its page."""

from __future__ import annotations

import asyncio
import html
import json
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
from dashboard_helpers import COOKIE, TOKEN, dashboard, http
from dbhelpers import UNLISTED_HISTORY, rows, run_cli, value
from workers import until, worker

from worker_cli import Helpers, WorkerUtils, run_once

pytestmark = pytest.mark.db

HISTORY = "graphile_worker._private_py_job_history"


async def drain(db: str, tasks: dict[str, Any]) -> None:
    async with asyncio.timeout(30):
        assert await run_once(db, task_list=tasks, no_handle_signals=True) == 0


def due_now(db: str, job_id: int) -> None:
    rows(db, "update graphile_worker._private_jobs set run_at = now() where id = %s", (job_id,))


async def cli(*args: str) -> list[str]:
    done = await asyncio.to_thread(run_cli, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def timeless(lines: list[str]) -> list[str]:
    return [re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+\+00:00", "T", line) for line in lines]


@pytest.fixture
def url(db: str) -> Iterator[str]:
    with dashboard(db) as base:
        yield base


def post(url: str, fields: dict[str, str] | None = None) -> int:
    body = urlencode({"csrf_token": TOKEN, **(fields or {})}).encode()
    return http(url, data=body, headers={"Cookie": COOKIE}).status


# --- tracebacks ---------------------------------------------------------------------


def _parse(text: str) -> int:
    return int(text)


async def test_each_attempt_keeps_its_traceback(utils: WorkerUtils, db: str) -> None:
    job = await utils.add_job("parse", {"text": "x"}, max_attempts=2)

    async def parse(payload: Any, helpers: Helpers) -> None:
        _parse(payload["text"] + str(helpers.job.attempts))

    for _ in range(2):
        await drain(db, {"parse": parse})
        due_now(db, job.id)
    errors = await utils.get_job_errors(job.id)
    assert [e.attempt for e in errors] == [1, 2]
    for error in errors:
        assert error.traceback is not None
        assert error.traceback.startswith("Traceback (most recent call last):")
        assert "in _parse" in error.traceback  # the innermost frame
        assert error.traceback.endswith(
            f"invalid literal for int() with base 10: 'x{error.attempt}'"
        )
    # last_error stays the message alone, as graphile-worker writes it.
    last = value(db, "select last_error from graphile_worker.jobs where id = %s", (job.id,))
    assert last == "ValueError: invalid literal for int() with base 10: 'x2'"

    shown = await cli("job", "-c", db, str(job.id))
    titles = [line for line in shown if line.startswith("  traceback of attempt")]
    assert timeless(titles) == ["  traceback of attempt 2 at T:"]
    assert "    Traceback (most recent call last):" in shown
    every = await cli("job", "-c", db, str(job.id), "--tracebacks")
    titles = [line for line in every if line.startswith("  traceback of attempt")]
    assert timeless(titles) == ["  traceback of attempt 1 at T:", "  traceback of attempt 2 at T:"]
    document = json.loads("\n".join(await cli("job", "-c", db, str(job.id), "--json")))
    assert [a["traceback"] for a in document["attempt_errors"]] == [e.traceback for e in errors]


def _chain(depth: int) -> None:
    try:
        if depth == 0:
            raise ValueError("the root cause")
        _chain(depth - 1)
    except Exception as exc:
        raise RuntimeError(f"level {depth}") from exc


def test_a_long_traceback_keeps_its_innermost_end() -> None:
    from worker_cli.jobs.last_error import MAX_TRACEBACK_LENGTH, traceback_of

    try:
        _chain(60)
    except RuntimeError as exc:
        error = exc
    whole = traceback_of(error)
    assert whole is not None
    first, _, kept = whole.partition("\n")
    assert re.fullmatch(r"\[\d+ characters cut: the outermost frames\]", first), first
    assert len(kept) <= MAX_TRACEBACK_LENGTH
    assert kept.endswith("RuntimeError: level 60")
    # Never raised, no cause: no traceback to keep.
    assert traceback_of(ValueError("never raised")) is None


# --- the payload --------------------------------------------------------------------


async def test_the_payload_is_shown_cut_and_given_whole(utils: WorkerUtils, db: str) -> None:
    payload = {"order": 42, "note": "n" * 2000}
    job = await utils.add_job("ship", payload)
    small = await utils.add_job("ship", {"order": 7})

    shown = await cli("job", "-c", db, str(job.id))
    [line] = [line for line in shown if line.startswith("  payload: ")]
    assert line.startswith('  payload: {"order": 42, "note": "nnn')
    assert line.endswith("... (cut: 2,025 characters in all; --json prints it whole)")
    assert len(line) < 600
    assert '  payload: {"order": 7}' in await cli("job", "-c", db, str(small.id))

    document = json.loads("\n".join(await cli("job", "-c", db, str(job.id), "--json")))
    assert document["payload"] == payload
    listed = json.loads("\n".join(await cli("jobs", "-c", db, "--json")))
    assert {entry["id"]: entry["payload"] for entry in listed} == {
        job.id: payload,
        small.id: {"order": 7},
    }

    async def ship(payload: Any, helpers: Helpers) -> None:
        return None

    await drain(db, {"ship": ship})
    shown = await cli("job", "-c", db, str(small.id))
    assert "  payload: not kept once the job left the jobs table" in shown
    document = json.loads("\n".join(await cli("job", "-c", db, str(small.id), "--json")))
    assert document["payload"] is None


# --- attempt numbers ----------------------------------------------------------------


async def test_a_cancelled_running_job_keeps_the_attempt_it_was(
    utils: WorkerUtils, db: str, url: str
) -> None:
    job = await utils.add_job("long", {})
    started = asyncio.Event()
    release = asyncio.Event()

    async def long(payload: Any, helpers: Helpers) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await release.wait()  # running, asked to cancel, until the test has looked
            raise

    async with worker(db, {"long": long}, concurrency=1) as runner:
        await started.wait()
        assert await utils.cancel_job(job.id, "not needed") == "running"
        running = await utils.get_job_result(job.id)
        assert (running.state, running.attempts, running.max_attempts) == ("running", 1, 25)
        body = (await asyncio.to_thread(http, f"{url}/jobs/{job.id}")).body
        assert 'id="job-attempts">1 of 25 <span class="muted">(asked to cancel' in body
        release.set()
        await until(lambda: value(db, f"select state from {HISTORY} where job_id = %s", (job.id,)))
        await runner.stop()
    record = await utils.get_job_result(job.id)
    assert (record.state, record.attempts, record.max_attempts) == ("cancelled", 1, 25)
    assert [(e.attempt, e.retried) for e in await utils.get_job_errors(job.id)] == [(1, False)]
    shown = timeless(await cli("job", "-c", db, str(job.id)))
    assert "  attempts: 1 of 25" in shown
    assert "    attempt 1 at T (not retried): JobCancelled: cancelled: not needed" in shown


async def test_an_operators_retry_is_marked_among_the_attempts(utils: WorkerUtils, db: str) -> None:
    job = await utils.add_job("flaky", {}, max_attempts=2)

    async def flaky(payload: Any, helpers: Helpers) -> None:
        raise RuntimeError(f"try {helpers.job.attempts}")

    for _ in range(2):
        await drain(db, {"flaky": flaky})
        due_now(db, job.id)
    assert (await utils.get_job_result(job.id)).state == "failed"
    await cli("retry", "-c", db, str(job.id))
    await drain(db, {"flaky": flaky})

    shown = timeless(await cli("job", "-c", db, str(job.id)))
    tail = shown[shown.index("  attempt errors (oldest first):") + 1 :]
    assert tail[:4] == [
        "    attempt 1 at T (retried): RuntimeError: try 1",
        "    attempt 2 at T (not retried): RuntimeError: try 2",
        "    retried by an operator at T (cli) after 2 attempt(s): "
        "the attempts below are numbered from 1 again",
        "    attempt 1 at T (retried): RuntimeError: try 1",
    ]
    markers = [e for e in await utils.get_job_errors(job.id) if e.operator_retry]
    assert [(e.retried_by, e.attempt, e.error, e.retried) for e in markers] == [
        ("cli", 2, None, False)
    ]
    # A job never attempted gets no marker: its numbers do not restart.
    fresh = await utils.add_job("flaky", {}, run_at=None)
    await cli("retry", "-c", db, str(fresh.id))
    assert await utils.get_job_errors(fresh.id) == []


async def test_a_retry_from_the_dashboard_is_marked(utils: WorkerUtils, db: str, url: str) -> None:
    job = await utils.add_job("flaky", {}, max_attempts=1)

    async def flaky(payload: Any, helpers: Helpers) -> None:
        raise RuntimeError("boom")

    await drain(db, {"flaky": flaky})
    fields = {"task": "flaky", "state": "permanently_failed", "upto": str(job.id)}
    assert post(f"{url}/bulk/retry", fields) == 303
    body = http(f"{url}/jobs/{job.id}").body
    assert "retried by an operator at" in body and "(dashboard) after 1 attempt:" in body


# --- removals -----------------------------------------------------------------------


async def test_removals_are_recorded_with_how(utils: WorkerUtils, db: str, url: str) -> None:
    by_id = await utils.add_job("mail", {"n": 1})
    by_key = await utils.add_job("mail", {"n": 2}, job_key="weekly")
    by_api = await utils.add_job("mail", {"n": 3}, job_key="daily")
    by_page = await utils.add_job("mail", {"n": 4})

    await cli("remove", "-c", db, str(by_id.id))
    await cli("remove", "-c", db, "--key", "weekly")
    assert await utils.remove_job("daily") is not None
    assert post(f"{url}/jobs/{by_page.id}/delete") == 303

    how = {
        by_id.id: "by an operator, from the command line",
        by_key.id: "by an operator, from the command line",
        by_api.id: "through the Python API (remove_job)",
        by_page.id: "by an operator, from the dashboard",
    }
    for job_id, said in how.items():
        assert await utils.get_job_status(job_id) == "removed"
        shown = timeless(await cli("job", "-c", db, str(job_id)))
        assert shown[:3] == [f"Job {job_id}: removed", f"  removed at T, {said}", "  task: mail"]
        document = json.loads("\n".join(await cli("job", "-c", db, str(job_id), "--json")))
        assert document["state"] == "removed" and document["finished_at"]
    assert rows(db, f"select job_id, removed_by from {HISTORY} order by job_id") == [
        {"job_id": by_id.id, "removed_by": "cli"},
        {"job_id": by_key.id, "removed_by": "cli"},
        {"job_id": by_api.id, "removed_by": "api"},
        {"job_id": by_page.id, "removed_by": "dashboard"},
    ]
    # Kept like other history: each row listed in the expiry ledger, a day.
    assert value(db, UNLISTED_HISTORY) == []
    assert value(db, f"select bool_and(expires_at > now() + interval '23 hours') from {HISTORY}")
    # Its page says so.
    body = http(f"{url}/jobs/{by_page.id}").body
    assert "Removed by an operator at" in body and "from the dashboard" in body


async def test_a_running_job_removed_by_key_is_not_recorded_removed(
    utils: WorkerUtils, db: str
) -> None:
    job = await utils.add_job("long", {}, job_key="k")
    started = asyncio.Event()
    release = asyncio.Event()

    async def long(payload: Any, helpers: Helpers) -> None:
        started.set()
        await release.wait()

    async with worker(db, {"long": long}, concurrency=1) as runner:
        await started.wait()
        await cli("remove", "-c", db, "--key", "k")
        assert await utils.get_job_status(job.id) == "running"
        release.set()
        await until(lambda: value(db, f"select state from {HISTORY} where job_id = %s", (job.id,)))
        await runner.stop()
    assert await utils.get_job_status(job.id) == "succeeded"


# --- the page of an admin-failed job -------------------------------------------------


def visible_text(body: str) -> str:
    """The page's text as shown: tags and collapsed tracebacks left out."""
    body = re.sub(r"<details.*?</details>", "", body, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", body))


async def test_an_admin_failed_job_shows_its_error_once(
    utils: WorkerUtils, db: str, url: str
) -> None:
    job = await utils.add_job("flaky", {}, max_attempts=3)

    async def flaky(payload: Any, helpers: Helpers) -> None:
        raise RuntimeError("card declined 4242")

    await drain(db, {"flaky": flaky})
    await cli("fail", "-c", db, str(job.id), "--reason", "giving up")
    last = value(db, "select last_error from graphile_worker.jobs where id = %s", (job.id,))
    assert last == "giving up (was: RuntimeError: card declined 4242)"
    text = visible_text(http(f"{url}/jobs/{job.id}").body)
    assert text.count("card declined 4242") == 1, text
    assert text.count("giving up") == 1
    assert "attempt 1's error, below." in text

    # A job failed by a worker alone: its error once too.
    other = await utils.add_job("flaky", {}, max_attempts=1)
    await drain(db, {"flaky": flaky})
    text = visible_text(http(f"{url}/jobs/{other.id}").body)
    assert text.count("card declined 4242") == 1, text
