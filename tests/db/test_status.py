"""``graphile-worker status``: exact figures for jobs in every state, read-only."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from dbhelpers import admin_cli, rows, run_cli, value
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
    assert lines[1:8] == [
        "Jobs: 9",
        "  waiting: 3  (due now, never attempted)",
        "  scheduled: 1  (run_at in the future, never attempted)",
        "  retrying: 2  (failed before, will run again)",
        "  paused: 0  (held by a pause)",
        "  running: 2  (locked by a worker)",
        "  failed: 1  (attempts >= max_attempts)",
    ]
    assert lines[8] == f"Oldest waiting job: {ids['oldest']} (report), due for 1h 00m"
    # The live worker runs resize only: report and email have runnable jobs
    # (the one of report in the queue "mail" too: its queue is locked, not the job).
    # (seconds shown: the ages grow between the jobs' insert and the read, by
    # however long this machine takes; minutes and hours do not move)
    assert [re.sub(r"(\d+m) \d\ds$", r"\1", line) for line in lines[9:12]] == [
        "Stranded tasks: 2  (runnable jobs, but no live Python worker handles it; "
        "Node workers are not seen)",
        "  email: 1 runnable, oldest due for 10m",
        "  report: 3 runnable, oldest due for 1h 00m",
    ]
    header = ["total", "waiting", "scheduled", "retrying", "paused", "running", "failed"]
    assert _split("\n".join(lines[12:])) == [
        [],
        ["task", *header],
        ["email", "4", "0", "0", "2", "0", "1", "1"],
        ["report", "4", "3", "1", "0", "0", "0", "0"],
        ["resize", "1", "0", "0", "0", "0", "1", "0"],
        [],
        ["queue", *header, "locked_by"],
        ["mail", "2", "1", "0", "0", "0", "1", "0", pool_id, _age_cell(lines, "mail")],
        ["reports", "1", "0", "0", "0", "0", "1", "0", "pool-crashed", "(5h", "00m)"],
    ]
    assert re.fullmatch(r"\(\d+s\)", _age_cell(lines, "mail"))

    assert as_json.returncode == 0, as_json.stderr
    document = json.loads(as_json.stdout)
    assert document["schema"] == "graphile_worker" and document["revision"] == 20
    assert document["jobs"] == {
        "total": 9,
        "waiting": 3,
        "scheduled": 1,
        "retrying": 2,
        "paused": 0,
        "running": 2,
        "failed": 1,
    }
    assert document["paused_by"] == {}
    oldest = document["oldest_waiting"]
    assert (oldest["job_id"], oldest["task_identifier"], oldest["queue_name"]) == (
        ids["oldest"],
        "report",
        None,
    )
    assert 3600 <= oldest["age_seconds"] < 3660
    counts = ["total", "waiting", "scheduled", "retrying", "paused", "running", "failed"]
    assert {name: [task[c] for c in counts] for name, task in document["tasks"].items()} == {
        "email": [4, 0, 0, 2, 0, 1, 1],
        "report": [4, 3, 1, 0, 0, 0, 0],
        "resize": [1, 0, 0, 0, 0, 1, 0],
    }
    queues = document["queues"]
    assert {name: [q[c] for c in counts] for name, q in queues.items()} == {
        "mail": [2, 1, 0, 0, 0, 1, 0],
        "reports": [1, 0, 0, 0, 0, 1, 0],
    }
    assert queues["mail"]["locked_by"] == pool_id and queues["mail"]["locked_for_seconds"] < 60
    assert [(s["task_identifier"], s["runnable"]) for s in document["stranded"]] == [
        ("email", 1),
        ("report", 3),
    ]
    assert queues["reports"]["locked_by"] == "pool-crashed"
    assert 5 * 3600 <= queues["reports"]["locked_for_seconds"] < 5 * 3600 + 60


def _age_cell(lines: list[str], queue: str) -> str:
    [line] = [line for line in lines if line.startswith(f"{queue} ")]
    return line.split()[-1]


def test_status_of_an_empty_queue(db: str) -> None:
    result = admin_cli("status", "-c", db)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1:] == [
        "Jobs: 0",
        "  waiting: 0  (due now, never attempted)",
        "  scheduled: 0  (run_at in the future, never attempted)",
        "  retrying: 0  (failed before, will run again)",
        "  paused: 0  (held by a pause)",
        "  running: 0  (locked by a worker)",
        "  failed: 0  (attempts >= max_attempts)",
        "Oldest waiting job: none",
        "Stranded tasks: not checked: no Python worker heartbeat to compare with "
        "(no Python worker is running, or heartbeats are off)",
    ]
    document = json.loads(admin_cli("status", "--json", env={"DATABASE_URL": db}).stdout)
    assert document["jobs"]["total"] == 0 and document["oldest_waiting"] is None
    assert document["stranded"] is None
    assert document["tasks"] == {} and document["queues"] == {}


def test_status_without_the_schema_is_one_line_and_installs_nothing(empty_db: str) -> None:
    result = admin_cli("status", "-c", empty_db)
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
    result = admin_cli("status", "-c", empty_db, env={"GRAPHILE_WORKER_SCHEMA": "other"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Schema 'other' (revision 20)")
    assert "Jobs: 1" in result.stdout.splitlines()
    # -c and -s may come before the subcommand too.
    before = run_cli("-s", "other", "-c", empty_db, "status")
    assert before.returncode == 0, before.stderr
    # The same status, but for the oldest job's age, which may have grown a second.
    assert _without_ages(before.stdout)[1:] == _without_ages(result.stdout)[1:]
    # The default schema is not installed there.
    assert admin_cli("status", "-c", empty_db).returncode == 1


def test_status_shows_run_at_times_python_cannot_hold(db: str) -> None:
    """Issue 23: a waiting job due since -infinity or a BC date, and one
    scheduled for infinity (SQL's add_job takes them all), made status fail."""
    bc = value(db, "select (graphile_worker.add_job('bc', run_at => '0044-03-15 BC')).id")
    rows(db, "select graphile_worker.add_job('never', run_at => 'infinity')")
    result = admin_cli("status", "-c", db)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1:4] == [
        "Jobs: 2",
        "  waiting: 1  (due now, never attempted)",
        "  scheduled: 1  (run_at in the future, never attempted)",
    ]
    assert re.fullmatch(
        rf"Oldest waiting job: {bc} \(bc\), due for \d+d \d\dh "
        r"\(run_at 0044-03-1[45] [0-9:]+[-+][0-9:]+ BC\)",  # in the server's time zone
        lines[8],
    ), lines[8]

    always = value(db, "select (graphile_worker.add_job('always', run_at => '-infinity')).id")
    result = admin_cli("status", "-c", db)
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout.splitlines()[8]
        == f"Oldest waiting job: {always} (always), due since -infinity"
    )
    as_json = admin_cli("status", "-c", db, "--json")
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
    result = admin_cli("status", "-c", db)
    assert result.returncode == 0, result.stderr
    assert _split(result.stdout)[-1] == ["stuck", "1", "1", "0", "0", "0", "0", "0", "pool-gone"]
    as_json = admin_cli("status", "-c", db, "--json")
    stuck = json.loads(as_json.stdout)["queues"]["stuck"]
    assert (stuck["locked_by"], stuck["locked_for_seconds"]) == ("pool-gone", None)


def test_worker_flags_before_status_are_refused(db: str) -> None:
    result = run_cli("--once", "-j", "3", "status", "-c", db)
    assert result.returncode == 2
    assert "--once, --jobs cannot be used with the status command" in result.stderr
    assert "Traceback" not in result.stderr


# --- Stranded tasks -------------------------------------------------------------

BEATS = "graphile_worker._private_py_heartbeats"


def _stranded_jobs(db: str) -> None:
    """Task a: 2 runnable jobs. Task b: 3 runnable (one due an hour ago, one a
    retry), and jobs that are not runnable: locked, scheduled, out of attempts."""
    rows(db, "select graphile_worker.add_job('a')")
    rows(db, "select graphile_worker.add_job('a', priority => 5)")
    rows(db, "select graphile_worker.add_job('b', run_at => now() - interval '1 hour')")
    rows(db, "select graphile_worker.add_job('b', priority => -3)")
    retry = value(db, "select (graphile_worker.add_job('b')).id")
    rows(db, "update graphile_worker._private_jobs set attempts = 1 where id = %s", [retry])
    locked = value(db, "select (graphile_worker.add_job('b')).id")
    rows(
        db,
        "update graphile_worker._private_jobs set locked_at = now(), locked_by = 'p' where id = %s",
        [locked],
    )
    rows(db, "select graphile_worker.add_job('b', run_at => now() + interval '1 day')")
    failed = value(db, "select (graphile_worker.add_job('b', max_attempts => 2)).id")
    rows(db, "update graphile_worker._private_jobs set attempts = 2 where id = %s", [failed])


def _beat(db: str, pool: str, tasks: list[str] | None, *, silent: str = "0 seconds") -> None:
    rows(
        db,
        f"insert into {BEATS} (pool_id, beat_at, timeout, task_identifiers) "
        "values (%s, now() - %s::interval, interval '5 minutes', %s)",
        [pool, silent, tasks],
    )


def _stranded(status: Any) -> dict[str, tuple[int, bool]] | None:
    if status.stranded is None:
        return None
    return {s.task_identifier: (s.runnable, s.capped) for s in status.stranded}


async def test_stranded_tasks_are_the_ones_no_live_pool_runs(db: str) -> None:
    from worker_cli.observe.status_report import read_status

    _stranded_jobs(db)
    # No heartbeat row at all: nothing to compare with, nothing flagged.
    assert _stranded(await read_status(db)) is None
    # A live pool running a: only b is stranded, with its runnable jobs.
    _beat(db, "pool-a", ["a", "c"])
    status = await read_status(db)
    assert _stranded(status) == {"b": (3, False)}
    [b] = status.stranded or []
    assert 3600 <= (b.oldest_age_seconds or 0) < 3660
    # Its heartbeat expired: a and b are both stranded.
    rows(db, f"update {BEATS} set beat_at = now() - interval '6 minutes'")
    assert _stranded(await read_status(db)) == {"a": (2, False), "b": (3, False)}
    # Another live pool runs b (one of several tasks): only a.
    _beat(db, "pool-b", ["x", "b"])
    assert _stranded(await read_status(db)) == {"a": (2, False)}
    # A paused task is held by its pause, not stranded.
    rows(db, "select * from graphile_worker.py_pause('task', 'a')")
    assert _stranded(await read_status(db)) == {}
    rows(db, "select * from graphile_worker.py_resume('task', 'a')")
    assert _stranded(await read_status(db)) == {"a": (2, False)}
    # A live pool of an older version lists no tasks: it may run any of them.
    _beat(db, "pool-old", None)
    assert _stranded(await read_status(db)) == {}


async def test_stranded_counts_are_capped(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from worker_cli.observe import status_report as status_module

    monkeypatch.setattr(status_module, "STRANDED_CAP", 2)
    _stranded_jobs(db)
    _beat(db, "pool-z", ["z"])
    status = await status_module.read_status(db)
    assert _stranded(status) == {"a": (2, False), "b": (2, True)}
    assert "  b: 2+ runnable, oldest due for 1h 00m" in status_module.format_text(status)


def test_status_shows_stranded_tasks_text_and_json(db: str) -> None:
    _stranded_jobs(db)
    unchecked = admin_cli("status", "-c", db)
    assert unchecked.returncode == 0, unchecked.stderr
    assert unchecked.stdout.splitlines()[9] == (
        "Stranded tasks: not checked: no Python worker heartbeat to compare with "
        "(no Python worker is running, or heartbeats are off)"
    )
    assert json.loads(admin_cli("status", "-c", db, "--json").stdout)["stranded"] is None

    _beat(db, "pool-a", ["a"])
    text = admin_cli("status", "-c", db)
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[9:11] == [
        "Stranded tasks: 1  (runnable jobs, but no live Python worker handles it; "
        "Node workers are not seen)",
        "  b: 3 runnable, oldest due for 1h 00m",
    ]
    document = json.loads(admin_cli("status", "-c", db, "--json").stdout)
    [b] = document["stranded"]
    assert (b["task_identifier"], b["runnable"], b["capped"]) == ("b", 3, False)
    assert 3600 <= b["oldest_age_seconds"] < 3660 and b["oldest_run_at"].startswith("20")

    rows(db, f"update {BEATS} set task_identifiers = array['a', 'b']")
    assert admin_cli("status", "-c", db).stdout.splitlines()[9] == "Stranded tasks: none"
    assert json.loads(admin_cli("status", "-c", db, "--json").stdout)["stranded"] == []
