"""Every attempt's error (migrations/py/000018.sql): graphile-worker's
``last_error`` holds the newest only; a Python pool also appends each failed
attempt's error to ``_private_py_job_errors`` in the statement that fails it,
says whether the job was to run again, shows them on the job's page (live or
finished), and the pruner deletes them after 7 days, in bounded batches."""

from __future__ import annotations

import asyncio
import html
import json
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import psycopg
import pytest
from dashboard_helpers import (
    COOKIE,
    TOKEN,
    chromium,
    console_errors,
    dashboard,
    http,
    wait_for,
)
from dbhelpers import rows, run_cli, value
from selenium.webdriver.common.by import By

from worker_cli import (
    Cancel,
    Helpers,
    JobSpecError,
    RetryPolicy,
    Snooze,
    WorkerUtils,
    make_sync_worker_utils,
    run_once,
    task_options,
)
from worker_cli.sql import compose
from worker_cli.sql import dashboard as dashboard_sql
from worker_cli.sql import history as history_sql
from worker_cli.worker.background.pruner import HistoryPruner

pytestmark = pytest.mark.db

ERRORS = "graphile_worker._private_py_job_errors"


async def drain(db: str, tasks: dict[str, Any]) -> None:
    async with asyncio.timeout(30):
        assert await run_once(db, task_list=tasks, no_handle_signals=True) == 0


def due_now(db: str, job_id: int) -> None:
    rows(db, "update graphile_worker._private_jobs set run_at = now() where id = %s", (job_id,))


def attempt_errors(db: str, job_id: int) -> list[tuple[Any, ...]]:
    return [
        (r["attempt"], r["error"].splitlines()[0], r["retried"], r["task_identifier"])
        for r in rows(
            db,
            f"select attempt, error, retried, task_identifier, pool_id from {ERRORS} "
            "where job_id = %s order by id",
            (job_id,),
        )
    ]


@pytest.fixture
def url(db: str) -> Iterator[str]:
    with dashboard(db) as base:
        yield base


def shown_attempts(body: str) -> list[tuple[str, str]]:
    """The job page's attempt errors: (its heading, its error), in page order."""
    found = re.search(r'<ol class="error-chain attempt-errors"[^>]*>(.*?)</ol>', body, re.S)
    if found is None:
        return []
    return [
        (" ".join(html.unescape(re.sub(r"<[^>]+>", "", kind)).split()), html.unescape(error))
        for kind, error in re.findall(
            r'<span class="muted error-kind">(.*?)</span>\s*<pre class="error-block">(.*?)</pre>',
            found.group(1),
            re.S,
        )
    ]


async def test_each_failed_attempt_keeps_its_error(utils: WorkerUtils, db: str, url: str) -> None:
    job = await utils.add_job("flaky", {}, max_attempts=3)
    fine = await utils.add_job("fine", {})

    async def flaky(payload: Any, helpers: Helpers) -> None:
        raise RuntimeError(f"<b>boom</b> {helpers.job.attempts}")

    async def ok(payload: Any, helpers: Helpers) -> None:
        return None

    tasks = {"flaky": flaky, "fine": ok}
    for _ in range(3):
        await drain(db, tasks)
        due_now(db, job.id)
    assert attempt_errors(db, job.id) == [
        (1, "RuntimeError: <b>boom</b> 1", True, "flaky"),
        (2, "RuntimeError: <b>boom</b> 2", True, "flaky"),
        (3, "RuntimeError: <b>boom</b> 3", False, "flaky"),  # its last: failed for good
    ]
    assert value(db, f"select count(distinct pool_id) from {ERRORS} where pool_id is not null") >= 1
    assert value(db, f"select count(*) from {ERRORS} where job_id = %s", (fine.id,)) == 0
    last = value(db, "select last_error from graphile_worker.jobs where id = %s", (job.id,))
    assert last.startswith("RuntimeError: <b>boom</b> 3")

    # Its page lists them, newest first, as text.
    body = http(f"{url}/jobs/{job.id}").body
    shown = shown_attempts(body)
    assert [kind.split(",")[0] for kind, _ in shown] == ["attempt 3", "attempt 2", "attempt 1"]
    assert [error.splitlines()[0] for _, error in shown] == [
        f"RuntimeError: <b>boom</b> {n}" for n in (3, 2, 1)
    ]
    assert "<b>boom</b>" not in body
    assert "(3, newest first)" in body

    # Cancelled: its finished page (from the history) still has them.
    form = urlencode({"csrf_token": TOKEN, "reason": "not wanted"}).encode()
    http(f"{url}/jobs/{job.id}/cancel", data=form, headers={"Cookie": COOKIE})
    assert await utils.get_job_status(job.id) == "cancelled"
    finished = http(f"{url}/jobs/{job.id}").body
    assert "finished: its record in the history" in finished
    assert len(shown_attempts(finished)) == 3

    # A job that never failed says so.
    never = await utils.add_job("fine", {}, run_at=None)
    assert 'id="job-attempts-none"' in http(f"{url}/jobs/{never.id}").body


async def test_get_job_errors_and_the_job_command(utils: WorkerUtils, db: str) -> None:
    """The utilities (async and sync, name for name) and ``graphile-worker
    job`` give the same attempts, oldest first."""
    job = await utils.add_job("flaky", {}, max_attempts=2)

    async def flaky(payload: Any, helpers: Helpers) -> None:
        raise ValueError(f"try {helpers.job.attempts}\nsecond line")

    await drain(db, {"flaky": flaky})
    due_now(db, job.id)
    await drain(db, {"flaky": flaky})
    errors = await utils.get_job_errors(job.id)
    assert [(e.attempt, e.retried, e.task_identifier) for e in errors] == [
        (1, True, "flaky"),
        (2, False, "flaky"),
    ]
    assert errors[0].error is not None and errors[0].error.startswith("ValueError: try 1\n")
    assert errors[0].failed_at <= errors[1].failed_at and errors[0].pool_id
    assert await utils.get_job_errors(123456789) == []
    with make_sync_worker_utils(connection_string=db) as sync_utils:
        assert sync_utils.get_job_errors(job.id) == errors
    with pytest.raises(JobSpecError, match="job_id"):
        await utils.get_job_errors(0)

    shown = await asyncio.to_thread(run_cli, "job", "-c", db, str(job.id))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    tail = lines[lines.index("  attempt errors (oldest first):") + 1 :]
    tail = tail[: tail.index(next(line for line in tail if line.startswith("  traceback of")))]
    assert [re.sub(r" at \S+ ", " at T ", line) for line in tail] == [
        "    attempt 1 at T (retried): ValueError: try 1",
        "    attempt 2 at T (not retried): ValueError: try 2",
    ]
    as_json = await asyncio.to_thread(run_cli, "job", "-c", db, str(job.id), "--json")
    document = json.loads(as_json.stdout)
    assert document["attempt_errors"] == [e.as_dict() for e in errors]
    assert document["attempt_errors"][1]["error"].startswith("ValueError: try 2\nsecond line")


async def test_a_snooze_is_no_error_and_a_cancel_is_not_retried(
    utils: WorkerUtils, db: str
) -> None:
    snoozing = await utils.add_job("poll", {})
    cancelling = await utils.add_job("stop", {})

    @task_options(retry=RetryPolicy(max_snoozes=5))
    async def poll(payload: Any, helpers: Helpers) -> None:
        raise Snooze(60)

    async def stop(payload: Any, helpers: Helpers) -> None:
        raise Cancel("no longer wanted")

    await drain(db, {"poll": poll, "stop": stop})
    assert attempt_errors(db, snoozing.id) == []
    [(attempt, error, retried, task)] = attempt_errors(db, cancelling.id)
    assert (attempt, retried, task) == (1, False, "stop") and "no longer wanted" in error


async def test_the_pruner_deletes_errors_older_than_7_days_in_batches(
    utils: WorkerUtils, db: str
) -> None:
    rows(
        db,
        f"insert into {ERRORS} (job_id, task_identifier, attempt, failed_at, error, retried) "
        "select n, 't', 1, now() - interval '8 days' + n * interval '1 second', 'old', true "
        "from generate_series(1, 2500) as n",
    )
    rows(
        db,
        f"insert into {ERRORS} (job_id, task_identifier, attempt, failed_at, error, retried) "
        "select n, 't', 1, now() - interval '6 days', 'kept', true "
        "from generate_series(1, 100) as n",
    )
    pruner = HistoryPruner(utils, schema="graphile_worker", interval=(60, 120))
    assert await pruner.prune_attempt_errors(batch=1000, max_batches=2) == 2000
    assert await pruner.prune_attempt_errors(batch=1000, max_batches=2) == 500
    assert await pruner.prune_attempt_errors(batch=1000, max_batches=2) == 0
    assert rows(db, f"select error, count(*) from {ERRORS} group by error") == [
        {"error": "kept", "count": 100}
    ]

    # Another pool pruning right now: this one leaves it alone.
    rows(db, f"update {ERRORS} set failed_at = now() - interval '8 days'")
    with psycopg.connect(db) as other:
        other.execute(
            "select pg_advisory_xact_lock(%s, hashtext('graphile_worker'))", (0x67775068,)
        )
        assert await pruner.prune_attempt_errors() is None
    assert await pruner.prune_attempt_errors() == 100


@pytest.mark.slow
def test_the_attempt_errors_in_a_browser(db: str, url: str) -> None:
    job_id = int(value(db, "select id from graphile_worker.add_job('hello')"))
    evil = '<img src=x id=evil onerror="window.pwned = 1">'
    rows(
        db,
        f"insert into {ERRORS} (job_id, task_identifier, attempt, error, retried) "
        "values (%s, 'hello', 1, %s, true), (%s, 'hello', 2, 'ValueError: second', true)",
        (job_id, f"KeyError: {evil}", job_id),
    )
    with chromium() as browser:
        browser.get(f"{url}/jobs/{job_id}")
        listed = wait_for(browser, "#job-attempt-errors")
        errors = [e.text for e in listed.find_elements(By.CSS_SELECTOR, "pre.error-block")]
        assert errors == ["ValueError: second", f"KeyError: {evil}"]
        kinds = [e.text for e in listed.find_elements(By.CSS_SELECTOR, ".error-kind")]
        assert kinds[0].startswith("attempt 2, ") and kinds[1].startswith("attempt 1, ")
        assert listed.value_of_css_property("list-style-type") == "none"
        assert browser.find_elements(By.ID, "evil") == []
        assert browser.execute_script("return window.pwned") is None  # type: ignore[no-untyped-call]
        assert console_errors(browser) == []


@pytest.mark.slow
async def test_pruning_a_million_errors_reads_only_the_oldest(utils: WorkerUtils, db: str) -> None:
    """1,000,000 attempt errors, the 20,000 oldest expired: a turn deletes
    those, each statement reading at most its batch by primary key (no table
    read whole), and a job's errors are read through their job_id index."""
    rows(
        db,
        f"insert into {ERRORS} (job_id, task_identifier, attempt, failed_at, error, retried) "
        "select n, 't', 1, case when n <= 20000 then now() - interval '8 days' else now() end, "
        "'boom', true from generate_series(1, 1000000) as n",
    )
    rows(db, f"analyze {ERRORS}")
    prune = compose(history_sql.PRUNE_ATTEMPT_ERRORS, "graphile_worker")
    params = {"lock_namespace": 1, "schema": "graphile_worker", "limit": 10_000}
    with psycopg.connect(db) as conn:
        [(plan,)] = conn.execute(
            psycopg.sql.SQL("explain (analyze, format json) ") + prune, params
        ).fetchall()
        conn.rollback()  # the explained statement deleted: undo it
        [(page_plan,)] = conn.execute(
            psycopg.sql.SQL("explain (format json) ")
            + compose(dashboard_sql.ATTEMPT_ERRORS, "graphile_worker"),
            {"id": 500_000, "limit": 50, "cut": 20_000},
        ).fetchall()
    nodes = list(plan_nodes(plan[0]["Plan"]))
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], nodes
    scans = [n for n in nodes if n.get("Index Name") == "_private_py_job_errors_pkey"]
    assert scans and all(n["Actual Rows"] <= 10_000 for n in scans), scans
    page_nodes = list(plan_nodes(page_plan[0]["Plan"]))
    assert not [n for n in page_nodes if n["Node Type"] == "Seq Scan"], page_nodes
    assert any(n.get("Index Name") == "_private_py_job_errors_job_id" for n in page_nodes)

    pruner = HistoryPruner(utils, schema="graphile_worker", interval=(60, 120))
    assert await pruner.prune_attempt_errors() == 20_000
    assert value(db, f"select count(*) from {ERRORS}") == 980_000
    assert value(db, f"select min(job_id) from {ERRORS}") == 20_001


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan."""
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)
