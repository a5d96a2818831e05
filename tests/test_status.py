"""``graphile-worker status``: exact figures for jobs in every state, read-only."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from dbhelpers import rows, run_cli, value
from workers import Recorder, worker

from worker_cli import Helpers, WorkerUtils

pytestmark = pytest.mark.db


def _split(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


async def _every_state(utils: WorkerUtils, db: str) -> dict[str, Any]:
    """Jobs in every state; returns the ids the assertions need."""
    ids: dict[str, Any] = {}

    async def sql(query: str, params: Any = None) -> Any:
        return await asyncio.to_thread(rows, db, query, params)

    # report: waiting for an hour (the oldest), waiting now, waiting in the
    # named queue "mail" (held by the live worker below), scheduled.
    ids["oldest"] = (await utils.add_job("report", {"n": 1})).id
    await sql(
        "update graphile_worker._private_jobs set run_at = now() - interval '1 hour' where id = %s",
        (ids["oldest"],),
    )
    await utils.add_job("report", {"n": 2})
    await utils.add_job("report", {"n": 3}, queue_name="mail")
    await sql("select graphile_worker.add_job('report', run_at => now() + interval '1 day')")
    # email: a retry backing off (scheduled), a retry due now (waiting), a
    # permanently failed job, and one held by a crashed worker in queue "reports".
    backing_off = (await utils.add_job("email", {"n": 1})).id
    due_retry = (await utils.add_job("email", {"n": 2})).id
    await sql(
        "update graphile_worker._private_jobs set attempts = 1, last_error = 'boom', "
        "run_at = now() + interval '10 minutes' where id = %s",
        (backing_off,),
    )
    await sql(
        "update graphile_worker._private_jobs set attempts = 2, last_error = 'boom', "
        "run_at = now() - interval '10 minutes' where id = %s",
        (due_retry,),
    )
    failed = (await utils.add_job("email", {"n": 3}, max_attempts=3)).id
    await utils.permanently_fail_jobs([failed], "gave up")
    # (on its last attempt: locked, not permanently failed)
    crashed = (await utils.add_job("email", {"n": 4}, queue_name="reports", max_attempts=1)).id
    await sql(
        "update graphile_worker._private_jobs set attempts = 1, locked_at = now(), "
        "locked_by = 'pool-crashed' where id = %s",
        (crashed,),
    )
    await sql(
        "update graphile_worker._private_job_queues set locked_at = now() - interval '5 hours', "
        "locked_by = 'pool-crashed' where queue_name = 'reports'"
    )
    # resize: running right now in queue "mail", on a live worker (added last,
    # so the worker cannot take the "report" job of that queue first: it only
    # knows "resize").
    ids["running"] = (await utils.add_job("resize", {}, queue_name="mail")).id
    return ids


async def test_status_in_every_state_text_and_json(utils: WorkerUtils, db: str) -> None:
    ids = await _every_state(utils, db)
    release = asyncio.Event()

    async def resize(payload: Any, helpers: Helpers) -> None:
        await release.wait()

    async with worker(db, {"resize": resize}) as runner:
        seen = Recorder(runner.events, "job:start")
        await seen.wait_for("job:start")
        pool_id = runner.pool.id
        text = await asyncio.to_thread(run_cli, "status", "-c", db)
        as_json = await asyncio.to_thread(run_cli, "-c", db, "status", "--json")
        release.set()

    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert re.fullmatch(r"Schema 'graphile_worker' \(revision 20\) at \S+", lines[0]), lines[0]
    assert lines[1:7] == [
        "Jobs: 9",
        "  waiting: 4  (due now)",
        "  scheduled: 2  (run_at in the future)",
        "  locked: 2  (being run)",
        "  permanently_failed: 1  (attempts >= max_attempts)",
        "  retrying: 2  (waiting or scheduled after a failed attempt)",
    ]
    assert lines[7] == f"Oldest waiting job: {ids['oldest']} (report), due for 1h 00m"
    header = ["total", "waiting", "scheduled", "locked", "permanently_failed", "retrying"]
    assert _split("\n".join(lines[8:])) == [
        [],
        ["task", *header],
        ["email", "4", "1", "1", "1", "1", "2"],
        ["report", "4", "3", "1", "0", "0", "0"],
        ["resize", "1", "0", "0", "1", "0", "0"],
        [],
        ["queue", *header, "locked_by"],
        ["mail", "2", "1", "0", "1", "0", "0", pool_id, _age_cell(lines, "mail")],
        ["reports", "1", "0", "0", "1", "0", "0", "pool-crashed", "(5h", "00m)"],
    ]
    assert re.fullmatch(r"\(\d+s\)", _age_cell(lines, "mail"))

    assert as_json.returncode == 0, as_json.stderr
    document = json.loads(as_json.stdout)
    assert document["schema"] == "graphile_worker" and document["revision"] == 20
    assert document["jobs"] == {
        "total": 9,
        "waiting": 4,
        "scheduled": 2,
        "locked": 2,
        "permanently_failed": 1,
        "retrying": 2,
    }
    oldest = document["oldest_waiting"]
    assert (oldest["job_id"], oldest["task_identifier"], oldest["queue_name"]) == (
        ids["oldest"],
        "report",
        None,
    )
    assert 3600 <= oldest["age_seconds"] < 3660
    counts = ["total", "waiting", "scheduled", "locked", "permanently_failed", "retrying"]
    assert {name: [task[c] for c in counts] for name, task in document["tasks"].items()} == {
        "email": [4, 1, 1, 1, 1, 2],
        "report": [4, 3, 1, 0, 0, 0],
        "resize": [1, 0, 0, 1, 0, 0],
    }
    queues = document["queues"]
    assert {name: [q[c] for c in counts] for name, q in queues.items()} == {
        "mail": [2, 1, 0, 1, 0, 0],
        "reports": [1, 0, 0, 1, 0, 0],
    }
    assert queues["mail"]["locked_by"] == pool_id and queues["mail"]["locked_for_seconds"] < 60
    assert queues["reports"]["locked_by"] == "pool-crashed"
    assert 5 * 3600 <= queues["reports"]["locked_for_seconds"] < 5 * 3600 + 60


def _age_cell(lines: list[str], queue: str) -> str:
    [line] = [line for line in lines if line.startswith(f"{queue} ")]
    return line.split()[-1]


def test_status_of_an_empty_queue(db: str) -> None:
    result = run_cli("status", "-c", db)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1:] == [
        "Jobs: 0",
        "  waiting: 0  (due now)",
        "  scheduled: 0  (run_at in the future)",
        "  locked: 0  (being run)",
        "  permanently_failed: 0  (attempts >= max_attempts)",
        "  retrying: 0  (waiting or scheduled after a failed attempt)",
        "Oldest waiting job: none",
    ]
    document = json.loads(run_cli("status", "--json", env={"DATABASE_URL": db}).stdout)
    assert document["jobs"]["total"] == 0 and document["oldest_waiting"] is None
    assert document["tasks"] == {} and document["queues"] == {}


def test_status_without_the_schema_is_one_line_and_installs_nothing(empty_db: str) -> None:
    result = run_cli("status", "-c", empty_db)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "Error: the graphile-worker schema 'graphile_worker' is not installed in this database; "
        "nothing to report (`graphile-worker --schema-only` installs it)"
    ]
    assert (
        value(empty_db, "select count(*) from pg_namespace where nspname = 'graphile_worker'") == 0
    )


def _without_ages(output: str) -> list[str]:
    return re.sub(r"due for [0-9dhms ]+", "due for <age>", output).splitlines()


def test_status_uses_the_schema_option_and_is_read_only(db: str, empty_db: str) -> None:
    assert run_cli("-c", empty_db, "--schema-only", "-s", "other").returncode == 0
    rows(empty_db, "select other.add_job('t')")
    # The database refuses writes: status must not need any.
    database = value(empty_db, "select current_database()")
    rows(empty_db, f'alter database "{database}" set default_transaction_read_only = on')
    result = run_cli("status", "-c", empty_db, env={"GRAPHILE_WORKER_SCHEMA": "other"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Schema 'other' (revision 20)")
    assert "Jobs: 1" in result.stdout.splitlines()
    # -c and -s may come before the subcommand too.
    before = run_cli("-s", "other", "-c", empty_db, "status")
    assert before.returncode == 0, before.stderr
    # The same status, but for the oldest job's age, which may have grown a second.
    assert _without_ages(before.stdout)[1:] == _without_ages(result.stdout)[1:]
    # The default schema is not installed there.
    assert run_cli("status", "-c", empty_db).returncode == 1


def test_status_shows_run_at_times_python_cannot_hold(db: str) -> None:
    """Issue 23: a waiting job due since -infinity or a BC date, and one
    scheduled for infinity (SQL's add_job takes them all), made status fail."""
    bc = value(db, "select (graphile_worker.add_job('bc', run_at => '0044-03-15 BC')).id")
    rows(db, "select graphile_worker.add_job('never', run_at => 'infinity')")
    result = run_cli("status", "-c", db)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1:4] == [
        "Jobs: 2",
        "  waiting: 1  (due now)",
        "  scheduled: 1  (run_at in the future)",
    ]
    assert re.fullmatch(
        rf"Oldest waiting job: {bc} \(bc\), due for \d+d \d\dh "
        r"\(run_at 0044-03-1[45] [0-9:]+[-+][0-9:]+ BC\)",  # in the server's time zone
        lines[7],
    ), lines[7]

    always = value(db, "select (graphile_worker.add_job('always', run_at => '-infinity')).id")
    result = run_cli("status", "-c", db)
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout.splitlines()[7]
        == f"Oldest waiting job: {always} (always), due since -infinity"
    )
    as_json = run_cli("status", "-c", db, "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["oldest_waiting"] == {
        "job_id": always,
        "task_identifier": "always",
        "queue_name": None,
        "run_at": "-infinity",
        "age_seconds": None,
    }


def test_status_shows_a_queue_locked_since_minus_infinity(db: str) -> None:
    """Only SQL can do it, but it made status fail as an infinite run_at did."""
    rows(db, "select graphile_worker.add_job('q', queue_name => 'stuck')")
    rows(
        db,
        "update graphile_worker._private_job_queues set locked_at = '-infinity', "
        "locked_by = 'pool-gone' where queue_name = 'stuck'",
    )
    result = run_cli("status", "-c", db)
    assert result.returncode == 0, result.stderr
    assert _split(result.stdout)[-1] == ["stuck", "1", "1", "0", "0", "0", "0", "pool-gone"]
    as_json = run_cli("status", "-c", db, "--json")
    stuck = json.loads(as_json.stdout)["queues"]["stuck"]
    assert (stuck["locked_by"], stuck["locked_for_seconds"]) == ("pool-gone", None)


def test_worker_flags_before_status_are_refused(db: str) -> None:
    result = run_cli("--once", "-j", "3", "status", "-c", db)
    assert result.returncode == 2
    assert "--once, --jobs cannot be used with the status command" in result.stderr
    assert "Traceback" not in result.stderr
