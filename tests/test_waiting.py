"""Waiting for a job: the worker tells the waiters of the jobs it finishes (one
NOTIFY per written batch, none for jobs nobody waits for), and
``wait_for_job`` (async and blocking) returns each job's record once it is
finished, race-free, through lost notifications and outages."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from dbhelpers import rows, value

from worker_cli import Helpers, WorkerUtils, make_worker_utils, run_once
from worker_cli.schema import lifecycle, statements
from worker_cli.worker.maintenance import Sweeper

pytestmark = pytest.mark.db

CHANNEL = "graphile_worker:py:finished"
OPTIONS = "graphile_worker._private_py_job_options"
MARKER = "marker"


async def drain(db: str, tasks: dict[str, Any], **options: Any) -> None:
    async with asyncio.timeout(30):
        assert await run_once(db, task_list=tasks, no_handle_signals=True, **options) == 0


def listen(db: str, channel: str = CHANNEL) -> psycopg.Connection[Any]:
    conn = psycopg.connect(db, autocommit=True)
    conn.execute(psycopg.sql.SQL("listen {}").format(psycopg.sql.Identifier(channel)))
    return conn


def heard(conn: psycopg.Connection[Any], db: str, channel: str = CHANNEL) -> list[str]:
    """The payloads ``conn`` received on the channel before a marker sent now
    (notifications arrive in commit order: all those committed before it)."""
    rows(db, "select pg_notify(%s, %s)", (channel, MARKER))
    payloads = []
    for notify in conn.notifies(timeout=10):
        if notify.payload == MARKER:
            return payloads
        payloads.append(notify.payload)
    raise AssertionError(f"the marker never came (heard {payloads})")


def locked_jobs(db: str, count: int) -> list[int]:
    """``count`` jobs locked by the pool "p", as a fetch leaves them."""
    rows(db, "select graphile_worker.add_job('t') from generate_series(1, %s)", (count,))
    return sorted(
        row["id"]
        for row in rows(
            db,
            "update graphile_worker._private_jobs set locked_at = now(), locked_by = 'p' "
            "where locked_by is null returning id",
        )
    )


def write_batch(db: str, statement: str, job_ids: list[int]) -> None:
    """Write a batch's outcome with the worker's statement, as its completer does."""
    params: dict[str, Any] = {"job_ids": job_ids, "pool_id": "p", "channel": CHANNEL}
    if statement == "complete_batch_recording":
        params.update(result_ids=[], results=[], result_errors=[], keep=timedelta(days=1))
    if statement == "fail_batch":
        n = len(job_ids)
        params.update(messages=["no"] * n, items=[None] * n, permanent=[False] * n)
    source = getattr(lifecycle, statement, None) or getattr(statements, statement)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(statements.compose(source, "graphile_worker"), params)


def waited_for(db: str, job_ids: list[int], notify: bool = True) -> None:
    rows(
        db,
        f"insert into {OPTIONS} (job_id, notify_on_finish) select unnest(%s::bigint[]), %s",
        (job_ids, notify),
    )


# --- what the worker sends ---------------------------------------------------------


@pytest.mark.parametrize("statement", ["complete_batch", "complete_batch_recording", "fail_batch"])
def test_one_notification_per_batch_lists_the_jobs_waited_for(db: str, statement: str) -> None:
    jobs = locked_jobs(db, 10)
    waited_for(db, jobs[2:6])
    waited_for(db, jobs[6:8], notify=False)  # options of another kind (a timeout)
    with listen(db) as conn:
        write_batch(db, statement, jobs)
        [payload] = heard(conn, db)
    assert sorted(map(int, payload.split(","))) == jobs[2:6]
    # A success deletes its jobs' options with them; a failure keeps them (the
    # job runs again, and may be waited for until it finishes).
    left = value(db, f"select count(*) from {OPTIONS}")
    assert left == (6 if statement == "fail_batch" else 0)


@pytest.mark.parametrize("statement", ["complete_batch_recording", "fail_batch"])
def test_a_large_batch_is_announced_in_notifications_below_8000_bytes(
    db: str, statement: str
) -> None:
    rows(
        db,
        "select setval(pg_get_serial_sequence('graphile_worker._private_jobs', 'id'), %s)",
        (10**17,),
    )  # fmt: skip  (ids of 18 digits: the longest payloads)
    jobs = locked_jobs(db, 700)
    waited_for(db, jobs[:650])
    with listen(db) as conn:
        write_batch(db, statement, jobs)
        payloads = heard(conn, db)
    assert sorted(len(p.split(",")) for p in payloads) == [50, 300, 300]
    assert all(len(p.encode()) < 8000 for p in payloads)
    assert sorted(int(i) for p in payloads for i in p.split(",")) == jobs[:650]


async def test_jobs_nobody_waits_for_send_no_notification(utils: WorkerUtils, db: str) -> None:
    for n in range(20):
        await utils.add_job("ok", {"n": n})
    await utils.add_job("fails", {}, max_attempts=1)
    await utils.add_job("fails", {}, max_attempts=2)

    async def ok(payload: Any, helpers: Helpers) -> int:
        return 1

    async def fails(payload: Any, helpers: Helpers) -> None:
        raise ValueError("no")

    with listen(db) as conn:
        await drain(db, {"ok": ok, "fails": fails})
        assert heard(conn, db) == []
        waited = await utils.add_job("ok", {})
        waited_for(db, [waited.id])
        await drain(db, {"ok": ok, "fails": fails})
        assert heard(conn, db) == [str(waited.id)]
    assert value(db, f"select count(*) from {OPTIONS}") == 0


async def test_a_schema_name_too_long_for_a_channel_gets_a_shortened_one(db: str) -> None:
    long_a, long_b = "a" * 55 + "_one", "a" * 55 + "_two"
    channel_a, channel_b = lifecycle.finished_channel(long_a), lifecycle.finished_channel(long_b)
    assert len(channel_a.encode()) <= 63 and channel_a.endswith(":py:finished")
    assert channel_a != channel_b
    assert lifecycle.finished_channel("graphile_worker") == CHANNEL
    assert len(lifecycle.finished_channel("é" * 31).encode()) <= 63  # cut between characters
    # PostgreSQL takes it (a longer one would fail the worker's result statement).
    async with make_worker_utils(db, schema=long_a) as utils:
        await utils.migrate()
        job = await utils.add_job("ok", {})
        rows(db, f'insert into "{long_a}"._private_py_job_options values (%s, null, true)',
             (job.id,))  # fmt: skip

        async def ok(payload: Any, helpers: Helpers) -> str:
            return "fine"

        with listen(db, channel_a) as conn:
            await drain(db, {"ok": ok}, schema=long_a)
            assert heard(conn, db, channel_a) == [str(job.id)]
        assert (await utils.get_job_result(job.id)).result == "fine"


async def test_the_sweeper_deletes_the_options_of_jobs_that_are_gone(
    utils: WorkerUtils, db: str
) -> None:
    live = await utils.add_job("t", {})
    rows(
        db,
        f"insert into {OPTIONS} (job_id, notify_on_finish, added_at) values "
        "(%(live)s, true, now() - interval '1 hour'), "  # its job is there
        "(%(gone)s, true, now() - interval '1 hour'), "  # left over
        "(%(young)s, true, now() - interval '1 minute')",  # perhaps not committed yet
        {"live": live.id, "gone": 10**9, "young": 10**9 + 1},
    )
    sweeper = Sweeper(
        utils,
        schema="graphile_worker",
        stale_lock_timeout=timedelta(hours=4),
        interval=(480, 600),
        on_released=lambda: None,
    )
    assert await sweeper.collect_job_options() == 1
    left = [r["job_id"] for r in rows(db, f"select job_id from {OPTIONS} order by job_id")]
    assert left == [live.id, 10**9 + 1]
