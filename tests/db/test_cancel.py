"""Cancelling jobs: waiting ones never run; running ones are told; nothing
cancelled is ever retried; shutdown is not a cancel."""

from __future__ import annotations

import asyncio
import logging
import math
import re
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dbhelpers import rows, stuck_in_heartbeat, value
from workers import Recorder, until, worker

from worker_cli import (
    Events,
    Helpers,
    JobCancelled,
    WorkerUtils,
    make_sync_worker_utils,
    run,
    run_once,
)
from worker_cli.config.options import WorkerOptions
from worker_cli.tasks.loader import make_task_list
from worker_cli.worker import WorkerPool

pytestmark = pytest.mark.db

HISTORY = "graphile_worker._private_py_job_history"


def history(db: str, job_id: int) -> dict[str, Any]:
    [row] = rows(db, f"select * from {HISTORY} where job_id = %s", (job_id,))
    return row


async def test_a_waiting_scheduled_retrying_or_failed_job_is_cancelled_at_once(
    utils: WorkerUtils, db: str
) -> None:
    waiting = await utils.add_job("t", {})
    later = await utils.add_job("t", {}, run_at=datetime.now(UTC) + timedelta(hours=1))
    retrying = await utils.add_job("fails", {}, max_attempts=3)
    dead = await utils.add_job("fails", {}, max_attempts=1)

    async def fails(payload: Any, helpers: Helpers) -> None:
        raise ValueError("no")

    await run_once(db, task_list={"fails": fails}, no_handle_signals=True)
    ids = [waiting.id, later.id, retrying.id, dead.id]
    states = await utils.cancel_jobs(ids, "not needed")
    assert states == dict.fromkeys(ids, "cancelled")
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0
    row = history(db, retrying.id)
    assert (row["state"], row["cancel_reason"], row["last_error"]) == (
        "cancelled",
        "not needed",
        "ValueError: no",
    )
    assert row["expires_at"] - row["finished_at"] == timedelta(days=1)
    ran: list[int] = []

    async def t(payload: Any, helpers: Helpers) -> None:
        ran.append(helpers.job.id)

    await run_once(db, task_list={"t": t, "fails": fails}, no_handle_signals=True)
    assert ran == []
    # Cancelling again, or a job that is gone, changes nothing.
    assert await utils.cancel_job(waiting.id) == "cancelled"
    assert await utils.cancel_job(10**12) == "unknown"


async def test_a_cancelled_job_releases_its_unique_lock(utils: WorkerUtils, db: str) -> None:
    first = await utils.add_job("t", {"user": 1}, unique={"period": 600})
    assert not first.conflict
    assert (await utils.add_job("t", {"user": 1}, unique={"period": 600})).conflict
    await utils.cancel_job(first.job_id)
    again = await utils.add_job("t", {"user": 1}, unique={"period": 600})
    assert not again.conflict and again.job_id != first.job_id


async def test_a_running_async_task_gets_cancelled_error(
    utils: WorkerUtils, db: str, caplog: Any
) -> None:
    job = await utils.add_job("long", {})
    others = [await utils.add_job("short", {"n": n}) for n in range(3)]
    started = asyncio.Event()
    caught: list[BaseException] = []
    short_ran: list[int] = []

    async def long(payload: Any, helpers: Helpers) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError as exc:
            caught.append(exc)
            assert helpers.cancelled and helpers.cancel_reason == "user asked"
            raise

    async def short(payload: Any, helpers: Helpers) -> None:
        short_ran.append(helpers.job.id)

    caplog.set_level(logging.INFO, logger="graphile_worker")
    async with worker(db, {"long": long, "short": short}, concurrency=1) as runner:
        await started.wait()
        asked = time.monotonic()
        assert await utils.cancel_job(job.id, "user asked") == "running"
        await until(lambda: value(db, f"select state from {HISTORY} where job_id = %s", (job.id,)))
        told_in = time.monotonic() - asked
        # The slot goes on with the other jobs.
        await until(lambda: len(short_ran) == 3, what="the other jobs")
        await runner.stop()
    assert len(caught) == 1 and told_in < 2
    row = history(db, job.id)
    assert (row["state"], row["cancel_reason"]) == ("cancelled", "user asked")
    assert row["last_error"] == "JobCancelled: cancelled: user asked"
    assert sorted(short_ran) == [o.id for o in others]
    assert value(db, "select count(*) from graphile_worker._private_py_cancellations") == 0
    # An operator's cancel is no error: one INFO line naming the job, no traceback.
    [line] = [r for r in caplog.records if f"Job {job.id} " in r.getMessage()]
    assert (line.levelname, line.exc_info, line.exc_text) == ("INFO", None, None)
    assert line.getMessage().startswith(f"Job {job.id} (long, ")
    assert line.getMessage().endswith(
        "cancelled while it ran (it stopped with 'JobCancelled: cancelled: user asked'): "
        "recorded as cancelled (no retry)"
    )


async def test_a_task_that_returns_anyway_succeeded(utils: WorkerUtils, db: str) -> None:
    job = await utils.add_job("stubborn", {})
    started = asyncio.Event()

    async def stubborn(payload: Any, helpers: Helpers) -> str:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            return "finished my work"
        return "never"

    async with worker(db, {"stubborn": stubborn}) as runner:
        await started.wait()
        await utils.cancel_job(job.id)
        await until(lambda: value(db, f"select state from {HISTORY} where job_id = %s", (job.id,)))
        await runner.stop()
    record = await utils.get_job_result(job.id)
    assert (record.state, record.result) == ("succeeded", "finished my work")
    # Its own attempt (not the max_attempts the cancel put on its row), and
    # the cancel that came too late.
    assert (record.attempts, record.max_attempts) == (1, 25)
    assert record.cancel_requested_at is not None


async def test_a_plain_task_sees_helpers_cancelled(utils: WorkerUtils, db: str) -> None:
    raising = await utils.add_job("plain", {"mode": "raise"})
    returning = await utils.add_job("plain", {"mode": "return"})
    started = threading.Semaphore(0)
    seen: list[tuple[str, str | None]] = []

    def plain(payload: dict[str, str], helpers: Helpers) -> str:
        started.release()
        while not helpers.cancelled:
            time.sleep(0.005)
        seen.append((payload["mode"], helpers.cancel_reason))
        if payload["mode"] == "raise":
            helpers.raise_if_cancelled()
        return "stopped early"

    async with worker(db, {"plain": plain}, concurrency=2) as runner:
        for _ in range(2):
            await asyncio.to_thread(started.acquire)
        await utils.cancel_jobs([raising.id, returning.id], "enough")
        await until(lambda: value(db, f"select count(*) from {HISTORY}") == 2)
        await runner.stop()
    assert sorted(seen) == [("raise", "enough"), ("return", "enough")]
    assert (await utils.get_job_result(raising.id)).state == "cancelled"
    assert history(db, raising.id)["last_error"] == "JobCancelled: cancelled: enough"
    assert (await utils.get_job_result(returning.id)).result == "stopped early"


async def test_a_job_cancelled_while_queued_never_starts(
    utils: WorkerUtils, db: str, caplog: Any
) -> None:
    blocker = await utils.add_job("block", {}, priority=-1)
    queued = await utils.add_job("t", {})
    release = asyncio.Event()
    started = asyncio.Event()
    ran: list[int] = []

    async def block(payload: Any, helpers: Helpers) -> None:
        started.set()
        await release.wait()

    async def t(payload: Any, helpers: Helpers) -> None:
        ran.append(helpers.job.id)

    # The local queue always full: the second job is fetched while the first runs.
    options = {"concurrency": 1, "local_queue_horizon": math.inf}
    async with worker(db, {"block": block, "t": t}, **options) as runner:
        await started.wait()
        # The second job is fetched ahead into the local queue (locked by this pool).
        locked = "select locked_by from graphile_worker._private_jobs where id = %s"
        await until(lambda: value(db, locked, (queued.id,)) is not None, what="the queued job")
        with caplog.at_level(logging.DEBUG, logger="graphile_worker"):
            assert await utils.cancel_job(queued.id, "late") == "running"
            noted = f"Job {queued.id}: cancel request noted"
            await until(lambda: any(noted in r.getMessage() for r in caplog.records))
        release.set()
        await until(lambda: value(db, f"select count(*) from {HISTORY}") == 2)
        await runner.stop()
    assert ran == []
    assert history(db, queued.id)["state"] == "cancelled"
    assert history(db, blocker.id)["state"] == "succeeded"


async def test_without_notifications_the_poll_tells_the_job(utils: WorkerUtils, db: str) -> None:
    """--once has no listener: the cancel watch's poll finds the request."""
    job = await utils.add_job("long", {})
    started = asyncio.Event()

    async def long(payload: Any, helpers: Helpers) -> None:
        started.set()
        await asyncio.sleep(60)

    options = WorkerOptions(cancel_poll_interval=0.2)
    pool = WorkerPool(db, make_task_list({"long": long}), options, once=True)
    running = asyncio.create_task(pool.run())
    try:
        async with asyncio.timeout(20):
            await started.wait()
            await utils.cancel_job(job.id)
            await running
    finally:
        pool.stop()
    assert history(db, job.id)["state"] == "cancelled"


async def test_a_task_ignoring_its_cancel_is_reported_and_never_run_twice(
    utils: WorkerUtils, db: str, caplog: Any
) -> None:
    job = await utils.add_job("deaf", {})
    started = threading.Event()
    stop = threading.Event()
    runs = Counter[int]()

    def deaf(payload: Any, helpers: Helpers) -> None:
        runs[helpers.job.id] += 1
        started.set()
        stop.wait(30)  # ignores helpers.cancelled
        raise RuntimeError("gave up")

    options = WorkerOptions(cancel_grace=0.3, cancel_poll_interval=0.2, heartbeat_interval=0.1)
    pool = WorkerPool(db, make_task_list({"deaf": deaf}), options)
    running = asyncio.create_task(pool.run())
    try:
        with caplog.at_level(logging.WARNING, logger="graphile_worker"):
            await asyncio.to_thread(started.wait)
            await utils.cancel_job(job.id)

            def reported() -> bool:
                return any(f"Job {job.id} ignores its cancel request" in r.getMessage()
                           for r in caplog.records)  # fmt: skip

            await until(reported, what="the stuck job reported")
        warning = next(r.getMessage() for r in caplog.records if "ignores" in r.getMessage())
        assert "in deaf" in warning  # where its task is
        assert (await utils.get_job_result(job.id)).state == "running"
        assert pool.load.stuck == 1  # the metric's figure, and the heartbeat's list
        await until(lambda: stuck_in_heartbeat(db, pool.id) == [job.id], what="the beat")
        stop.set()
        await until(lambda: value(db, f"select count(*) from {HISTORY}") == 1)
        assert pool.load.stuck == 0
    finally:
        stop.set()
        pool.stop()
        await running
    assert runs == {job.id: 1}
    assert history(db, job.id)["state"] == "cancelled"


async def test_a_job_locked_by_a_node_worker_is_never_retried_then_recorded(
    utils: WorkerUtils, db: str
) -> None:
    """A pool that is not ours holds the job: the data changes are Node's own
    remove_job's; when that worker fails the job, the upkeep records it."""
    job = await utils.add_job("t", {}, job_key="k1")
    rows(
        db,
        "update graphile_worker._private_jobs set locked_at = now(), locked_by = 'node-pool', "
        "attempts = 1 where id = %s",
        (job.id,),
    )
    assert await utils.cancel_job(job.id, "stop it") == "running"
    [row] = rows(db, "select attempts, max_attempts, key from graphile_worker._private_jobs")
    assert (row["attempts"], row["key"]) == (row["max_attempts"], None)
    # Node fails the job: its own fail statement unlocks it; no retry is possible.
    rows(
        db,
        "update graphile_worker._private_jobs set locked_at = null, locked_by = null, "
        "last_error = 'node error' where id = %s",
        (job.id,),
    )
    from worker_cli.worker.background.pruner import HistoryPruner

    pruner = HistoryPruner(utils, schema="graphile_worker", interval=(60, 120))
    assert await pruner.finalize_cancelled() == 1
    row = history(db, job.id)
    assert (row["state"], row["last_error"], row["cancel_reason"]) == (
        "cancelled",
        "node error",
        "stop it",
    )


async def test_shutdown_is_not_a_cancel(utils: WorkerUtils, db: str) -> None:
    """An async task ignoring abort_signal is cancelled a second after it and
    its job given back: it runs again (attempts restored)."""
    job = await utils.add_job("deaf", {})
    started = asyncio.Event()

    async def deaf(payload: Any, helpers: Helpers) -> None:
        started.set()
        await asyncio.sleep(60)

    async with asyncio.timeout(20):
        async with worker(db, {"deaf": deaf}, graceful_shutdown_timeout=0.2) as runner:
            await started.wait()
            stopping = time.monotonic()
            await runner.stop()
    assert time.monotonic() - stopping < 5
    [row] = rows(db, "select attempts, locked_by, last_error from graphile_worker._private_jobs")
    assert (row["attempts"], row["locked_by"], row["last_error"]) == (0, None, None)
    assert value(db, f"select count(*) from {HISTORY}") == 0
    assert await utils.get_job_status(job.id) == "waiting"


async def test_sql_and_sync_twin(db: str) -> None:
    with make_sync_worker_utils(connection_string=db) as sync:
        job = sync.add_job("t", {})
        assert sync.cancel_job(job.id, "sql too") == "cancelled"
        assert sync.get_job_status(job.id) == "cancelled"
    other = value(db, "select id from graphile_worker.add_job('t')")
    [row] = rows(db, "select * from graphile_worker.py_cancel_jobs(array[%s]::bigint[])", (other,))
    assert row == {"id": other, "state": "cancelled"}


@pytest.mark.parametrize("bad", [0, 2**63, "7"])
async def test_bad_ids_are_refused(utils: WorkerUtils, bad: Any) -> None:
    from worker_cli import JobSpecError

    with pytest.raises(JobSpecError, match="job_id"):
        await utils.cancel_job(bad)


@pytest.mark.parametrize(
    ("reason", "says"),
    [
        ("a\x00b", "reason: contains a NUL character"),
        ("bad \ud800 half", "reason: contains a lone surrogate"),
        (ValueError("no"), "reason: is ValueError('no'); it must be a string or None"),
        (b"bytes", "reason: is b'bytes'; it must be a string or None"),
    ],
)
async def test_a_reason_the_database_cannot_store_is_refused_naming_it(
    utils: WorkerUtils, db: str, reason: Any, says: str
) -> None:
    """Before any SQL, as the utilities' other argument checks: the job is left alone."""
    from worker_cli import JobSpecError

    job = await utils.add_job("t", {})
    with pytest.raises(JobSpecError, match=re.escape(says)) as raised:
        await utils.cancel_job(job.id, reason)
    assert raised.value.field == "reason"
    with pytest.raises(JobSpecError, match=re.escape(says)):
        await utils.cancel_jobs([job.id], reason)
    with make_sync_worker_utils(connection_string=db) as sync:
        with pytest.raises(JobSpecError, match=re.escape(says)):
            sync.cancel_job(job.id, reason)
        with pytest.raises(JobSpecError, match=re.escape(says)):
            sync.cancel_jobs([job.id], reason)
    assert await utils.get_job_status(job.id) == "waiting"
    assert await utils.cancel_job(job.id, "a\\x00b, written out") == "cancelled"
    assert history(db, job.id)["cancel_reason"] == "a\\x00b, written out"


async def test_cancels_racing_fetches_never_retry_or_run_twice(utils: WorkerUtils, db: str) -> None:
    """Cancels sent while a worker fetches and runs: each job runs at most
    once and ends succeeded or cancelled; none is retried or left."""
    jobs = [await utils.add_job("t", {"n": n}) for n in range(120)]
    runs = Counter[int]()

    async def t(payload: dict[str, int], helpers: Helpers) -> None:
        runs[helpers.job.id] += 1
        await asyncio.sleep(0.01 + 0.01 * (payload["n"] % 5))

    async def cancel_some() -> None:
        for job in jobs[::2]:  # every other job, as the worker goes through them
            await utils.cancel_job(job.id, "race")
            await asyncio.sleep(0.004)

    async with worker(db, {"t": t}, concurrency=8) as runner:
        await cancel_some()
        await until(lambda: value(db, "select count(*) from graphile_worker._private_jobs") == 0,
                    within=30, what="every job to end")  # fmt: skip
        await runner.stop()
    ended = {
        row["job_id"]: row["state"] for row in rows(db, f"select job_id, state from {HISTORY}")
    }
    assert set(ended) == {job.id for job in jobs}
    assert max(runs.values()) == 1
    cancelled = {job_id for job_id, state in ended.items() if state == "cancelled"}
    assert cancelled <= {job.id for job in jobs[::2]}
    assert all(runs[job_id] == 1 for job_id, state in ended.items() if state == "succeeded")
    # Never both cancelled and retried: nothing went back to the queue.
    assert all(runs[job_id] <= 1 for job_id in cancelled)


async def test_a_raising_task_of_a_cancelled_job_is_not_retried(
    utils: WorkerUtils, db: str
) -> None:
    job = await utils.add_job("plain", {})
    started = threading.Event()
    runs: list[int] = []

    def plain(payload: Any, helpers: Helpers) -> None:
        runs.append(1)
        started.set()
        while not helpers.cancelled:
            time.sleep(0.005)
        raise ValueError("some other error after the cancel")

    async with worker(db, {"plain": plain}) as runner:
        await asyncio.to_thread(started.wait)
        await utils.cancel_job(job.id)
        await until(lambda: value(db, f"select count(*) from {HISTORY}") == 1)
        await runner.stop()
    row = history(db, job.id)
    assert (row["state"], row["last_error"]) == (
        "cancelled",
        "ValueError: some other error after the cancel",
    )
    assert runs == [1]
    with pytest.raises(JobCancelled):
        raise JobCancelled("x")


@pytest.mark.parametrize("schema", ["graphile_worker", "a" * 55 + "_one", "é" * 31, "ä" * 60])
def test_sql_and_python_name_the_channels_alike(db: str, schema: str) -> None:
    from worker_cli.schema import channels
    from worker_cli.schema.migrate import compose_script

    function = "create function pg_temp.channel(kind text) returns text language plpgsql as $fn$"
    script = (
        Path(__file__).resolve().parents[2] / "migrations" / "py" / "functions.sql"
    ).read_text()
    script = script[script.index("function {{schema}}.py_channel(") :]
    body = script[script.index("declare") : script.index("$fn$;")]
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(compose_script(function + "\n" + body + "$fn$", schema))
        for kind in ("cancel", "finished"):
            [(name,)] = conn.execute("select pg_temp.channel(%s)", (kind,)).fetchall()
            assert name == channels.channel(schema, kind)
            assert len(name.encode()) <= 63


async def test_a_waiter_hears_of_its_job_cancelled(utils: WorkerUtils, db: str) -> None:
    job = await utils.add_job("t", {})
    waiting = asyncio.ensure_future(utils.wait_for_job(job.id, timeout=20))
    options = "select count(*) from graphile_worker._private_py_job_options"
    await until(lambda: value(db, options) == 1, what="the waiter registered")
    asked = time.monotonic()
    await utils.cancel_job(job.id)
    record = await waiting
    assert record.state == "cancelled"
    assert time.monotonic() - asked < 0.9  # the notification, not the 1 s poll


def test_the_cancel_command(db: str) -> None:
    from dbhelpers import run_cli

    waiting = value(db, "select id from graphile_worker.add_job('t')")
    running = value(db, "select id from graphile_worker.add_job('t')")
    rows(db, "update graphile_worker._private_jobs set locked_at = now(), locked_by = 'p' "
             "where id = %s", (running,))  # fmt: skip
    done = run_cli("cancel", "-c", db, str(waiting), str(running), "999999", "--reason", "cli")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"Cancelled 1 job: {waiting}",
        "Not found: 999999",
        f"Told 1 running job to stop (recorded as cancelled when it ends): {running}",
    ]
    assert history(db, waiting)["cancel_reason"] == "cli"
    bad = run_cli("cancel", "-c", db, "x")
    assert bad.returncode == 2 and "'x' is not a job id" in bad.stderr
    assert "Traceback" not in bad.stderr and bad.stderr.strip().splitlines()[-1].startswith(
        "Error:"
    )


async def test_a_job_given_back_at_shutdown_with_a_cancel_request_is_recorded_cancelled(
    utils: WorkerUtils, db: str
) -> None:
    """A request that reaches a job fetched ahead just as the pool stops (the
    watch has not seen it): the job is not given back to run, it is recorded
    as cancelled, never run; its neighbours are given back, attempts restored."""
    jobs = [await utils.add_job("slow", {"n": n}) for n in range(4)]
    events = Events()
    recorder = Recorder(events, "job:start")
    release = asyncio.Event()

    async def slow(payload: Any, helpers: Helpers) -> None:
        await release.wait()

    runner = await run(
        db,
        task_list={"slow": slow},
        events=events,
        no_handle_signals=True,
        concurrency=1,
        local_queue_size=3,
        local_queue_horizon=math.inf,
    )
    await recorder.wait_for("job:start", 1)
    [start] = recorder.of("job:start")
    running = start["job"].id
    ahead = [job.id for job in jobs if job.id != running]
    locked = "select count(*) from graphile_worker._private_jobs where locked_by is not null"
    assert value(db, locked) == 4  # 1 running + 3 fetched ahead
    # A request the pool's watch does not read (no pool named): as if it came
    # in while the jobs were being given back.
    rows(
        db,
        "insert into graphile_worker._private_py_cancellations (job_id, reason) values (%s, 'x')",
        (ahead[0],),
    )
    runner.pool.stop()
    await until(lambda: value(db, locked) == 1, what="the unstarted jobs' return")
    release.set()
    await runner
    assert history(db, ahead[0])["state"] == "cancelled"
    assert history(db, ahead[0])["cancel_reason"] == "x"
    left = rows(db, "select id, attempts, locked_by from graphile_worker._private_jobs order by id")
    assert [r["id"] for r in left] == sorted(ahead[1:])
    assert all(r["attempts"] == 0 and r["locked_by"] is None for r in left)
    assert value(db, "select count(*) from graphile_worker._private_py_cancellations") == 0
