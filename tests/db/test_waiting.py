"""Waiting for a job: the worker tells the waiters of the jobs it finishes (one
NOTIFY per written batch, none for jobs nobody waits for), and
``wait_for_job`` (async and blocking) returns each job's record once it is
finished, race-free, through lost notifications and outages."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from dbhelpers import cli_path, rows, run_cli, value
from fault_helpers import restartable_pg
from workers import until, worker

from worker_cli import (
    ConfigurationError,
    GraphileWorkerError,
    Helpers,
    JobResult,
    JobSpecError,
    WaitTimeout,
    WorkerUtils,
    make_sync_worker_utils,
    make_worker_utils,
    run_once,
)
from worker_cli.client import job_waiting as waiting
from worker_cli.client import worker_utils
from worker_cli.client.job_waiting import VISIBILITY_GRACE, Waiting
from worker_cli.db.backoff import Backoff
from worker_cli.schema import channels
from worker_cli.sql import completion as completion_sql
from worker_cli.sql import compose
from worker_cli.sql import failure as failure_sql
from worker_cli.worker.background.maintenance import Sweeper

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
    if statement.startswith("complete_batch"):
        # complete_batch[_recording][_without_queues]: its parts switched on or off.
        recording = statement.startswith("complete_batch_recording")
        params.update(
            result_ids=[],
            results=[],
            result_errors=[],
            timed_out=[],
            keep=timedelta(days=1) if recording else None,
            record=recording,
            any_queued=not statement.endswith("without_queues"),
        )
        statement = "complete_batch"
    if statement == "fail_batch":
        n = len(job_ids)
        params.update(
            messages=["no"] * n,
            items=[None] * n,
            permanent=[False] * n,
            timed_out=[False] * n,
            delays=[None] * n,
            snoozes=[None] * n,
            max_snoozes=[None] * n,
            tracebacks=[None] * n,
            logs=[None] * n,
            logs_dropped=[None] * n,
        )
    source = getattr(completion_sql, statement.upper(), None) or getattr(
        failure_sql, statement.upper()
    )
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(compose(source, "graphile_worker"), params)


def waited_for(db: str, job_ids: list[int], notify: bool = True) -> None:
    rows(
        db,
        f"insert into {OPTIONS} (job_id, notify_on_finish) select unnest(%s::bigint[]), %s",
        (job_ids, notify),
    )


# --- what the worker sends ---------------------------------------------------------


@pytest.mark.parametrize(
    "statement",
    [
        "complete_batch",
        "complete_batch_without_queues",
        "complete_batch_recording",
        "complete_batch_recording_without_queues",
        "fail_batch",
    ],
)
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
    channel_a, channel_b = channels.finished_channel(long_a), channels.finished_channel(long_b)
    assert len(channel_a.encode()) <= 63 and channel_a.endswith(":py:finished")
    assert channel_a != channel_b
    assert channels.finished_channel("graphile_worker") == CHANNEL
    assert len(channels.finished_channel("é" * 31).encode()) <= 63  # cut between characters
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


# --- wait_for_job ----------------------------------------------------------------


class Reads:
    """The state each read of a wait found (None: the read failed)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.states: list[str | None] = []
        original = Waiting.next

        def next_(waiting: Waiting, record: JobResult | None) -> JobResult | float:
            self.states.append(None if record is None else record.state)
            return original(waiting, record)

        monkeypatch.setattr(Waiting, "next", next_)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Reads:
    return Reads(monkeypatch)


@pytest.fixture
def no_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """The safety poll once a minute: a wait that ends sooner was woken by a
    notification (or by its listener reconnecting)."""
    monkeypatch.setattr(waiting, "POLL", Backoff((60.0,)))


#: A wait woken by a notification (or a reconnect) returns within this; its own
#: timeout is longer, and with ``no_poll`` nothing else would wake it sooner.
WOKEN = 5.0


async def woken(wait: asyncio.Future[Any], within: float = WOKEN) -> Any:
    """The result of ``wait``, which must come within ``within`` seconds."""
    return await asyncio.wait_for(wait, within)


def waiter_connections(db: str) -> int:
    return int(
        value(
            db,
            "select count(*) from pg_stat_activity where datname = current_database() "
            "and application_name = 'graphile-worker waiter'",
        )
    )


async def double(payload: dict[str, int], helpers: Helpers) -> int:
    return payload["n"] * 2


async def test_a_wait_for_a_finished_job_returns_at_once(
    utils: WorkerUtils, db: str, reads: Reads, no_poll: None
) -> None:
    first = await utils.add_job("double", {"n": 1})
    job = await utils.add_job("double", {"n": 2})
    await drain(db, {"double": double})
    assert (await utils.wait_for_job(first.id)).result == 2  # the listener is up
    started = time.monotonic()
    record = await utils.wait_for_job(job.id, timeout=30)
    assert time.monotonic() - started < 1.0  # read at once, not at a poll or the timeout
    assert record.state == "succeeded" and record.result == 4
    assert record == await utils.get_job_result(job.id)  # the same record
    assert reads.states == ["succeeded", "succeeded"]


async def test_a_waiter_started_before_the_job_runs_wakes_on_its_notification(
    utils: WorkerUtils, db: str, reads: Reads, no_poll: None
) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(payload: Any, helpers: Helpers) -> str:
        started.set()
        await release.wait()
        return "done"

    job = await utils.add_job("slow", {})
    async with worker(db, {"slow": slow}):
        await started.wait()
        waiter = asyncio.create_task(utils.wait_for_job(job.id, timeout=30))
        await until(lambda: reads.states == ["running"], what="the waiter's first read")
        release.set()
        record = await woken(waiter)
    assert record.state == "succeeded" and record.result == "done"
    assert reads.states == ["running", "succeeded"]  # woken once, by the notification


async def test_with_its_notifications_lost_the_poll_finds_the_job(
    utils: WorkerUtils, db: str, reads: Reads, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The listener listens where nothing is ever sent: only the poll can tell.
    monkeypatch.setattr(worker_utils, "finished_channel", lambda schema: "elsewhere")
    job = await utils.add_job("double", {"n": 3})
    waiter = asyncio.create_task(utils.wait_for_job(job.id, timeout=30))
    await until(lambda: reads.states == ["waiting"], what="the waiter's first read")
    await drain(db, {"double": double})
    record = await woken(waiter, within=8)  # reads 1 s after the first, then 2 s after that
    assert record.state == "succeeded" and record.result == 6


async def test_after_its_listener_reconnects_a_waiter_reads_again(
    utils: WorkerUtils, db: str, reads: Reads, no_poll: None, caplog: Any
) -> None:
    job = await utils.add_job("t", {})
    waiter = asyncio.create_task(utils.wait_for_job(job.id, timeout=30))
    await until(lambda: reads.states == ["waiting"], what="the waiter's first read")
    await utils.complete_jobs([job.id])  # an admin function: no notification
    terminated = value(
        db,
        "select count(pg_terminate_backend(pid)) from pg_stat_activity "
        "where datname = current_database() and application_name = 'graphile-worker waiter'",
    )
    assert terminated == 1
    record = await woken(waiter)
    assert record.state == "unknown"  # seen, then gone: no grace
    assert reads.states == ["waiting", "unknown"]
    assert "Waiting for jobs: LISTEN connection lost" in caplog.text


@pytest.mark.slow
async def test_a_wait_lasts_through_a_database_restart(
    reads: Reads, no_poll: None, caplog: Any
) -> None:
    caplog.set_level(logging.INFO, logger="graphile_worker")
    with restartable_pg() as server:
        url = server.server.url(server.server.create_database())
        async with make_worker_utils(url) as utils:
            await utils.migrate()
            job = await utils.add_job("double", {"n": 5})
            waiter = asyncio.create_task(utils.wait_for_job(job.id, timeout=60))
            await until(lambda: reads.states == ["waiting"], what="the waiter's first read")
            await asyncio.to_thread(server.stop)
            await asyncio.to_thread(server.start)
            # Once listening again, every waiter reads (on the pool's connections,
            # which the restart broke: that read fails, and the wait goes on).
            await until(
                lambda: "Waiting for jobs: listening again" in caplog.text,
                within=30,
                what="the listener to reconnect",
            )
            await until(lambda: len(reads.states) > 1, what="the read after the reconnect")
            await drain(url, {"double": double})
            record = await woken(waiter)
    assert record.state == "succeeded" and record.result == 10
    assert "Waiting for jobs: LISTEN connection lost" in caplog.text
    print(f"\nreads through the restart: {reads.states}")


async def test_a_timeout_raises_wait_timeout_and_leaves_the_job_alone(
    utils: WorkerUtils, db: str
) -> None:
    job = await utils.add_job("t", {}, max_attempts=3)
    before = rows(db, "select * from graphile_worker._private_jobs")
    with pytest.raises(WaitTimeout) as raised:
        async with asyncio.timeout(10):
            await utils.wait_for_job(job.id, timeout=0.3)
    error = raised.value
    assert isinstance(error, TimeoutError) and isinstance(error, GraphileWorkerError)
    assert str(error) == f"job {job.id} did not finish within 0.3s (it is waiting)"
    assert error.job_id == job.id and error.last is not None and error.last.state == "waiting"
    assert rows(db, "select * from graphile_worker._private_jobs") == before


async def test_until_attempt_returns_at_a_failure_and_final_waits_through_the_retry(
    utils: WorkerUtils, db: str, reads: Reads, no_poll: None
) -> None:
    async def flaky(payload: Any, helpers: Helpers) -> str:
        if helpers.job.attempts == 1:
            raise ValueError("first try")
        return "second try"

    job = await utils.add_job("flaky", {}, max_attempts=3)
    attempt = asyncio.create_task(utils.wait_for_job(job.id, timeout=30, until="attempt"))
    final = asyncio.create_task(utils.wait_for_job(job.id, timeout=30))
    await until(lambda: reads.states.count("waiting") == 2, what="both first reads")
    async with worker(db, {"flaky": flaky}, poll_interval=0.05):
        record = await woken(attempt)
        assert (record.state, record.last_error, record.attempts) == (
            "retrying",
            "ValueError: first try",
            1,
        )
        # The final waiter was woken by the failure too, and waits on.
        await until(lambda: reads.states.count("retrying") == 2, what="the final waiter's read")
        assert not final.done()
        await utils.reschedule_jobs([job.id], run_at=datetime.now(UTC))  # no 2.7 s backoff
        record = await woken(final)
    assert (record.state, record.result, record.attempts) == ("succeeded", "second try", 2)


async def test_an_id_nobody_can_see_is_unknown_after_the_grace(utils: WorkerUtils) -> None:
    started = time.monotonic()
    record = await utils.wait_for_job(10**12, timeout=30)
    elapsed = time.monotonic() - started
    assert record == JobResult(id=10**12, state="unknown")
    assert VISIBILITY_GRACE == 2.0 <= elapsed < 3.5  # the README's 2 seconds


async def test_a_job_committed_during_the_grace_is_waited_for(
    utils: WorkerUtils, db: str, reads: Reads
) -> None:
    with psycopg.connect(db) as app:  # the application's transaction, not committed yet
        [(job_id,)] = app.execute("select id from graphile_worker.add_job('double', '{\"n\": 7}')")
        waiter = asyncio.create_task(utils.wait_for_job(job_id, timeout=20))
        await until(lambda: reads.states == ["unknown"], what="the waiter's first read")
        app.commit()
    await until(lambda: "waiting" in reads.states, what="a read in the grace")
    await drain(db, {"double": double})
    record = await waiter
    assert record.state == "succeeded" and record.result == 14


async def test_waiting_inside_a_task_is_refused(utils: WorkerUtils, db: str) -> None:
    refused: dict[str, str] = {}

    async def async_task(payload: Any, helpers: Helpers) -> None:
        try:
            await utils.wait_for_job(1, timeout=0)
        except RuntimeError as exc:
            refused["async"] = str(exc)

    def plain_task(payload: Any, helpers: Helpers) -> None:
        with make_sync_worker_utils(db) as sync:
            try:
                sync.wait_for_job(1, timeout=0)
            except RuntimeError as exc:
                refused["plain"] = str(exc)

    await utils.add_job("async_task", {})
    await utils.add_job("plain_task", {})
    await drain(db, {"async_task": async_task, "plain_task": plain_task})
    assert set(refused) == {"async", "plain"}
    assert all(
        message.startswith("wait_for_job was called inside a task run by this process's worker")
        and "allow_in_task=True" in message
        for message in refused.values()
    )


async def test_allow_in_task_waits_for_another_job(utils: WorkerUtils, db: str) -> None:
    async def parent(payload: Any, helpers: Helpers) -> Any:
        child = await helpers.add_job("child", {"n": 21})
        return (await utils.wait_for_job(child.id, timeout=20, allow_in_task=True)).result

    def plain_parent(payload: Any, helpers: Helpers) -> Any:
        with make_sync_worker_utils(db) as sync:
            child = sync.add_job("child", {"n": 50})
            return sync.wait_for_job(child.id, timeout=20, allow_in_task=True).result

    async def child(payload: dict[str, int], helpers: Helpers) -> int:
        return payload["n"] * 2

    jobs = [await utils.add_job("parent", {}), await utils.add_job("plain_parent", {})]
    tasks = {"parent": parent, "plain_parent": plain_parent, "child": child}
    async with worker(db, tasks, concurrency=3):
        records = [await utils.wait_for_job(job.id, timeout=20) for job in jobs]
    assert [(r.state, r.result) for r in records] == [("succeeded", 42), ("succeeded", 100)]


async def test_one_listener_serves_every_waiter_and_closes_with_the_utils(
    db: str, reads: Reads, no_poll: None
) -> None:
    async with make_worker_utils(db) as utils:
        jobs = [await utils.add_job("double", {"n": n}) for n in range(5)]
        waiters = [asyncio.create_task(utils.wait_for_job(job.id, timeout=30)) for job in jobs]
        await until(lambda: len(reads.states) == 5, what="every first read")
        assert waiter_connections(db) == 1
        await drain(db, {"double": double})
        assert [(await woken(w)).result for w in waiters] == [0, 2, 4, 6, 8]
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "graphile-worker waiter"]
    await until(lambda: waiter_connections(db) == 0, what="the listener's connection to close")


async def test_the_sync_twin_waits_the_same_way(db: str, reads: Reads, no_poll: None) -> None:
    with make_sync_worker_utils(db) as sync:
        job = sync.add_job("double", {"n": 4})
        other = sync.add_job("double", {"n": 9})
        waiter = asyncio.create_task(asyncio.to_thread(sync.wait_for_job, job.id, 30))
        waiter_2 = asyncio.create_task(asyncio.to_thread(sync.wait_for_job, other.id, 30))
        await until(lambda: reads.states == ["waiting"] * 2, what="both first reads")
        assert waiter_connections(db) == 1
        await drain(db, {"double": double})
        record = await woken(waiter)
        assert record.state == "succeeded" and record.result == 8
        assert (await woken(waiter_2)).result == 18
        assert reads.states == ["waiting"] * 2 + ["succeeded"] * 2  # woken by the notification
        sync.add_job("t", {})
        late = sync.add_job("t", {})
        with pytest.raises(WaitTimeout, match=f"job {late.id} did not finish within 0.2s"):
            sync.wait_for_job(late.id, 0.2, until="attempt")
        with pytest.raises(JobSpecError, match="until: is 'first'"):
            sync.wait_for_job(late.id, until="first")  # type: ignore[arg-type]
    assert not [t for t in threading.enumerate() if t.name == "graphile-worker waiter"]
    await until(lambda: waiter_connections(db) == 0, what="the listener's connection to close")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0,), "job_id: is 0"),
        ((1, -1), "timeout: is -1"),
        ((1, math.nan), "timeout: is nan"),
        ((1, True), "timeout: is True"),
    ],
)
async def test_bad_arguments_are_refused(utils: WorkerUtils, args: Any, message: str) -> None:
    with pytest.raises(JobSpecError, match=message):
        await utils.wait_for_job(*args)


async def test_utilities_on_the_callers_connection_cannot_wait(db: str) -> None:
    async with (
        await psycopg.AsyncConnection.connect(db) as conn,
        make_worker_utils(connection=conn) as utils,
    ):
        with pytest.raises(ConfigurationError, match="connection given"):
            await utils.wait_for_job(1)


# --- the command line ----------------------------------------------------------------


async def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(run_cli, *args)


async def test_the_job_command_prints_the_record(utils: WorkerUtils, db: str) -> None:
    job = await utils.add_job("double", {"n": 8}, queue_name="q")
    await drain(db, {"double": double})
    shown = await cli("job", "-c", db, str(job.id))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[:4] == [f"Job {job.id}: succeeded", "  task: double", "  queue: q",
                         "  attempts: 1 of 25"]  # fmt: skip
    assert lines[-1] == "  result: 16"
    assert [line.split(":")[0] for line in lines[4:-1]] == [
        "  created at", "  run at", "  started at", "  finished at", "  payload"
    ]  # fmt: skip
    as_json = await cli("job", "-c", db, str(job.id), "--json")
    assert as_json.returncode == 0, as_json.stderr
    record = (await utils.get_job_result(job.id)).as_dict()
    assert json.loads(as_json.stdout) == {
        **record, "payload": None, "removed_by": None, "attempt_errors": []
    }  # fmt: skip
    unknown = await cli("job", "-c", db, "999999", "--json")
    assert unknown.returncode == 0 and json.loads(unknown.stdout)["state"] == "unknown"


async def test_the_job_command_waits(utils: WorkerUtils, db: str) -> None:
    job = await utils.add_job("double", {"n": 4})
    late = await cli("job", "-c", db, str(job.id), "--wait", "0.3")
    assert late.returncode == 3
    assert late.stdout.splitlines()[0] == f"Job {job.id}: waiting"
    assert late.stderr == f"Error: job {job.id} did not finish within 0.3s (it is waiting)\n"
    waiting_cli = await asyncio.create_subprocess_exec(
        cli_path(), "job", "-c", db, str(job.id), "--wait", "30", "--json",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        # Its job is registered already (by the command above): wait for its LISTEN.
        await until(lambda: waiter_connections(db) == 1, what="the command to listen")
        await drain(db, {"double": double})
        async with asyncio.timeout(30):
            out, err = await waiting_cli.communicate()
    finally:
        if waiting_cli.returncode is None:
            waiting_cli.kill()
            await waiting_cli.wait()
    assert waiting_cli.returncode == 0, err
    record = json.loads(out)
    assert record["state"] == "succeeded" and record["result"] == 8


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("x",), "Invalid value for 'ID': 'x' is not a job id"),
        (("0",), "Invalid value for 'ID': '0' is not a job id"),
        (("9223372036854775808",), "is not a job id (a whole number from 1 to 2**63-1)"),
        (("1", "--wait", "-1"), "Invalid value for '--wait': -1.0 is not in the range"),
        (("1", "--wait", "nan"), "Invalid value for '--wait': 'nan' is not a number"),
    ],
)
async def test_the_job_command_refuses_bad_input_in_one_line(
    db: str, args: tuple[str, ...], error: str
) -> None:
    refused = await cli("job", "-c", db, *args)
    assert refused.returncode == 2
    last = refused.stderr.splitlines()[-1]
    assert last.startswith("Error: ") and error in last
    assert "Traceback" not in refused.stderr


async def test_the_job_command_without_the_schema(empty_db: str) -> None:
    refused = await cli("job", "-c", empty_db, "1")
    assert refused.returncode == 1
    assert refused.stderr.startswith("Error: the graphile-worker schema 'graphile_worker' is not")
    assert len(refused.stderr.splitlines()) == 1


def test_the_readmes_waiting_examples_run_as_written(db: str, tmp_path: Any) -> None:
    from readme_blocks import app_env, blocks, write_files

    heading = "### Waiting for a job"
    files = write_files(heading, tmp_path)
    assert set(files) == {"resize_and_wait.py", "resize_and_wait_sync.py"}
    assert set(write_files("### Results and history", tmp_path)) >= {"tasks/resize.py"}
    env = app_env(db)
    worker_process = subprocess.Popen(
        [cli_path()], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        [transcript] = blocks(heading, "text")
        lines = transcript.splitlines()
        for command, expected in zip(lines[::2], lines[1::2], strict=True):
            script = command.removeprefix("$ python ")
            shown = subprocess.run(
                [sys.executable, script], cwd=tmp_path, env=env, capture_output=True,
                text=True, timeout=60, check=False,
            )  # fmt: skip
            assert shown.stdout.strip() == expected, shown.stderr
    finally:
        worker_process.send_signal(signal.SIGTERM)
        _, log = worker_process.communicate(timeout=30)
    assert worker_process.returncode == 0, log
