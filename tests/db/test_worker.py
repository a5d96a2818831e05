"""The worker pool in-process: ordering, retries, helpers, events, shutdown."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from dbhelpers import rows, value
from workers import Recorder, worker

from worker_cli import Events, Helpers, Job, WorkerUtils, run, run_once
from worker_cli.config.options import WorkerOptions
from worker_cli.jobs.job import jobs_from_rows
from worker_cli.sql import compose
from worker_cli.sql import fetch as fetch_sql
from worker_cli.tasks.loader import make_task_list
from worker_cli.worker import WorkerPool
from worker_cli.worker.pipeline.fetcher import configure_fetch_connection

pytestmark = pytest.mark.db


def jobs(db: str) -> list[dict[str, Any]]:
    return rows(db, "select * from graphile_worker.jobs order by id")


async def test_runs_jobs_in_priority_then_run_at_order(utils: WorkerUtils, db: str) -> None:
    ran: list[int] = []
    now = datetime.now(UTC)
    for n, (priority, age) in enumerate([(5, 1), (0, 2), (0, 5), (-3, 0), (5, 9)]):
        await utils.add_job(
            "record", {"n": n}, priority=priority, run_at=now - timedelta(seconds=age)
        )

    async def record(payload: dict[str, int], helpers: Helpers) -> None:
        ran.append(payload["n"])

    assert await run_once(db, task_list={"record": record}, no_handle_signals=True) == 0
    assert ran == [3, 2, 1, 4, 0]
    assert jobs(db) == []


async def test_future_jobs_between_priorities_neither_run_nor_hide_due_ones(
    utils: WorkerUtils, db: str
) -> None:
    # The fetch reads each priority's due jobs as a range that stops at the
    # first future job; the next priority must still be found.
    later = datetime.now(UTC) + timedelta(hours=1)
    specs = [
        (-5, later),
        (-5, None),
        (3, None),
        (-5, later),
        (3, later),
        (0, None),
        (-5, None),
        (0, later),
        (3, None),
        (0, None),
    ]
    await utils.add_jobs(
        [
            {"identifier": "t", "payload": {"n": n}, "priority": p, "run_at": when}
            for n, (p, when) in enumerate(specs)
        ]
    )
    ran: list[int] = []

    async def t(payload: dict[str, int], helpers: Helpers) -> None:
        ran.append(payload["n"])

    await run_once(
        db, task_list={"t": t}, no_handle_signals=True, concurrency=1, local_queue_size=1
    )
    assert ran == [1, 6, 5, 9, 2, 8]
    left = rows(
        db, "select (payload->>'n')::int as n from graphile_worker._private_jobs order by 1"
    )
    assert [r["n"] for r in left] == [0, 3, 4, 7]


def _add_many(db: str, task: str, count: int, priority: int, run_at: str) -> None:
    rows(
        db,
        "select count(*) from graphile_worker.add_jobs(array("
        "  select (%s, null, null, now() + %s::interval, null, null, %s::smallint, null)"
        "    ::graphile_worker.job_spec"
        "  from generate_series(1, %s)))",
        (task, run_at, priority, count),
    )


async def test_a_fetch_reads_only_its_jobs_when_statistics_are_stale(
    utils: WorkerUtils, db: str
) -> None:
    """Statistics taken while the table was nearly empty must not make a fetch
    read every job of the table.

    A queue drained of a burst of jobs (their dead rows not yet vacuumed) and
    then analyzed holds statistics saying "a handful of rows". Ordinary
    planning then bitmap-scanned and sorted every job of the task on every
    fetch, until the next ANALYZE: ~500 ms per fetch behind a million jobs.
    """
    rows(db, "alter table graphile_worker._private_jobs set (autovacuum_enabled = false)")
    _add_many(db, "other", 20_000, 0, "0 s")
    rows(db, "delete from graphile_worker._private_jobs")
    await utils.add_job("t", {})
    await utils.add_job("other", {}, priority=1)
    rows(db, "analyze graphile_worker._private_jobs")
    rows(db, "delete from graphile_worker._private_jobs")
    # 20k future jobs of t; 20k due jobs of another task, at a priority
    # between t's two priorities; 20 due jobs of t.
    _add_many(db, "t", 20_000, 0, "1 day")
    _add_many(db, "other", 20_000, 1, "0 s")
    _add_many(db, "t", 10, 0, "-1 s")
    _add_many(db, "t", 10, 2, "-1 s")
    task_id = value(db, "select id from graphile_worker._private_tasks where identifier = 't'")
    with psycopg.connect(db) as conn:
        fetched = conn.execute(
            compose(fetch_sql.GET_JOBS, "graphile_worker"),
            {"task_ids": [task_id], "forbidden_flags": None, "limit": 15, "pool_id": "p"},
        ).fetchall()
        read = conn.execute(
            "select seq_tup_read + idx_tup_fetch from pg_stat_xact_user_tables "
            "where relid = 'graphile_worker._private_jobs'::regclass"
        ).fetchone()
    assert [(row[4], row[2]) for row in fetched] == [(0, task_id)] * 10 + [(2, task_id)] * 5
    # The 15 jobs it took, a few index descents, and nothing of the 40,000 others.
    assert read is not None and read[0] < 100


async def test_future_jobs_and_unknown_tasks_are_left_alone(utils: WorkerUtils, db: str) -> None:
    ran: list[str] = []
    later = await utils.add_job(
        "known", {"when": "later"}, run_at=datetime.now(UTC) + timedelta(hours=1)
    )
    other = await utils.add_job("someone_elses_task", {})
    await utils.add_job("known", {"when": "now"})

    async def known(payload: dict[str, str], helpers: Helpers) -> None:
        ran.append(payload["when"])

    await run_once(db, task_list={"known": known}, no_handle_signals=True)
    assert ran == ["now"]
    assert [(j["id"], j["attempts"], j["locked_by"]) for j in jobs(db)] == [
        (later.id, 0, None),
        (other.id, 0, None),
    ]


async def test_failure_records_error_and_backs_off(utils: WorkerUtils, db: str) -> None:
    first = await utils.add_job("fails", {})
    third = await utils.add_job("fails", {})
    rows(db, "update graphile_worker._private_jobs set attempts = 2 where id = %s", (third.id,))

    async def fails(payload: Any, helpers: Helpers) -> None:
        raise ValueError("boom")

    await run_once(db, task_list={"fails": fails}, no_handle_signals=True)
    result = {
        r["id"]: r
        for r in rows(
            db,
            "select id, attempts, last_error, locked_at, "
            "extract(epoch from run_at - updated_at) as delay from graphile_worker._private_jobs",
        )
    }
    assert result[first.id]["attempts"] == 1 and result[third.id]["attempts"] == 3
    assert result[first.id]["last_error"] == "ValueError: boom"
    assert float(result[first.id]["delay"]) == pytest.approx(math.exp(1), abs=0.01)
    assert float(result[third.id]["delay"]) == pytest.approx(math.exp(3), abs=0.01)
    assert result[first.id]["locked_at"] is None


async def test_backoff_is_capped_at_exp_10(utils: WorkerUtils, db: str) -> None:
    job = await utils.add_job("fails", {}, max_attempts=30)
    rows(db, "update graphile_worker._private_jobs set attempts = 14 where id = %s", (job.id,))

    def fails(payload: Any, helpers: Helpers) -> None:
        raise RuntimeError

    await run_once(db, task_list={"fails": fails}, no_handle_signals=True)
    delay = value(
        db, "select extract(epoch from run_at - updated_at) from graphile_worker._private_jobs"
    )
    assert float(delay) == pytest.approx(math.exp(10), abs=0.01)
    assert value(db, "select last_error from graphile_worker._private_jobs") == "RuntimeError"


async def test_permanent_failure_at_max_attempts(utils: WorkerUtils, db: str) -> None:
    job = await utils.add_job("fails", {}, max_attempts=2)
    events = Events()
    recorder = Recorder(events, "job:error", "job:failed", "job:complete")
    calls = 0

    async def fails(payload: Any, helpers: Helpers) -> None:
        nonlocal calls
        calls += 1
        raise ValueError(f"attempt {helpers.job.attempts}")

    await run_once(db, task_list={"fails": fails}, no_handle_signals=True, events=events)
    assert calls == 1 and len(recorder.of("job:failed")) == 0
    rows(db, "update graphile_worker._private_jobs set run_at = now()")
    await run_once(db, task_list={"fails": fails}, no_handle_signals=True, events=events)
    assert calls == 2 and len(recorder.of("job:failed")) == 1
    [row] = rows(db, "select * from graphile_worker._private_jobs")
    assert (row["id"], row["attempts"], row["is_available"]) == (job.id, 2, False)
    assert row["last_error"] == "ValueError: attempt 2"
    rows(db, "update graphile_worker._private_jobs set run_at = now()")
    await run_once(db, task_list={"fails": fails}, no_handle_signals=True, events=events)
    assert calls == 2
    assert [e["error"] is not None for e in recorder.of("job:complete")] == [True, True]


@pytest.mark.parametrize("error", [SystemExit(3), KeyboardInterrupt(), BaseException("odd")])
async def test_base_exceptions_in_tasks_fail_the_job_not_the_worker(
    utils: WorkerUtils, db: str, error: BaseException
) -> None:
    await utils.add_job("bad", {})
    await utils.add_job("good", {})
    ran = []

    async def bad(payload: Any, helpers: Helpers) -> None:
        raise error

    def good(payload: Any, helpers: Helpers) -> None:
        ran.append("good")

    assert await run_once(db, task_list={"bad": bad, "good": good}, no_handle_signals=True) == 0
    assert ran == ["good"]
    assert value(db, "select last_error from graphile_worker._private_jobs") == (
        f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    )


async def test_sync_tasks_run_in_threads_and_async_on_the_loop(utils: WorkerUtils, db: str) -> None:
    await utils.add_job("sync_task", {"n": 1})
    await utils.add_job("async_task", {"n": 2})
    threads: dict[str, str] = {}

    def sync_task(payload: Any, helpers: Helpers) -> None:
        threads["sync"] = threading.current_thread().name
        time.sleep(0.05)  # blocking is fine here
        helpers.run(helpers.add_job("follow_up", {"from": "sync"}))

    async def async_task(payload: Any, helpers: Helpers) -> None:
        threads["async"] = threading.current_thread().name

    await run_once(
        db, task_list={"sync_task": sync_task, "async_task": async_task}, no_handle_signals=True
    )
    assert threads["async"] == threading.current_thread().name
    assert threads["sync"].startswith("graphile-worker-task")
    assert [j["task_identifier"] for j in jobs(db)] == ["follow_up"]


async def test_helpers(utils: WorkerUtils, db: str, caplog: pytest.LogCaptureFixture) -> None:
    added = await utils.add_job(
        "inspect", {"x": 1}, queue_name="inspect_queue", job_key="k1", priority=2
    )
    seen: dict[str, Any] = {}

    async def inspect(payload: Any, helpers: Helpers) -> None:
        seen["job"] = helpers.job
        seen["queue"] = helpers.get_queue_name()
        seen["query"] = await helpers.query("select %s::int + 1 as answer", (41,))
        async with helpers.with_pg_client() as conn:
            seen["client"] = (await (await conn.execute("select 'ok'")).fetchone())[0]  # type: ignore[index]
        seen["added"] = await helpers.add_jobs([{"identifier": "next", "payload": {"n": 1}}])
        seen["abort"] = helpers.abort_signal.is_set()
        helpers.logger.info("inspecting")

    caplog.set_level("INFO")
    await run_once(db, task_list={"inspect": inspect}, no_handle_signals=True)
    job = seen["job"]
    assert (job.id, job.task_identifier, job.payload, job.key, job.priority) == (
        added.id,
        "inspect",
        {"x": 1},
        "k1",
        2,
    )
    assert (job.attempts, job.max_attempts, job.queue_name) == (1, 25, "inspect_queue")
    assert job.locked_by.startswith("pool-") and job.locked_at is not None
    with pytest.raises(AttributeError):
        job.attempts = 5
    assert seen["queue"] == "inspect_queue"
    assert seen["query"] == [{"answer": 42}] and seen["client"] == "ok"
    assert seen["added"][0].task_identifier == "next" and seen["abort"] is False
    [line] = [r.getMessage() for r in caplog.records if "inspecting" in r.getMessage()]
    assert f"inspect{{{added.id}}}" in line and "worker-" in line
    assert any(f"Completed task {added.id} (inspect" in r.getMessage() for r in caplog.records)


async def _add_jobs_of_every_kind(utils: WorkerUtils) -> tuple[datetime, list[Job]]:
    run_at = datetime(2020, 2, 29, 23, 59, 58, 123456, tzinfo=timezone(timedelta(hours=5)))
    payloads: list[Any] = [{"x": [1, 2.5, None]}, [1, "two"], "text", 3, None, {"é": "😀"}]
    added = [
        await utils.add_job(
            "inspect", payload, run_at=run_at, flags=["f1", "f2"], job_key=f"k{n}", priority=n
        )
        for n, payload in enumerate(payloads)
    ]
    return run_at, added


@pytest.mark.parametrize("no_prepared_statements", [False, True])
async def test_both_fetch_forms_read_jobs_as_they_are_stored(
    utils: WorkerUtils, db: str, no_prepared_statements: bool
) -> None:
    """The fetch reads binary rows of get_jobs; after a lost reply the pool
    reads the jobs it holds with lost_fetch_jobs: both give the stored values."""
    _, added = await _add_jobs_of_every_kind(utils)
    task_id = value(
        db, "select id from graphile_worker._private_tasks where identifier = 'inspect'"
    )
    params = {"task_ids": [task_id], "forbidden_flags": None, "limit": 10, "pool_id": "pool-t"}
    names = {task_id: "inspect"}
    async with await psycopg.AsyncConnection.connect(db, autocommit=True) as conn:
        await configure_fetch_connection(conn, no_prepared_statements=no_prepared_statements)
        async with conn.transaction(force_rollback=True):
            cur = await conn.cursor(binary=True).execute(
                compose(fetch_sql.GET_JOBS, "graphile_worker"), params
            )
            binary = jobs_from_rows(await cur.fetchall(), names)
            cur = await conn.cursor(binary=True).execute(
                compose(fetch_sql.LOST_FETCH_JOBS, "graphile_worker"),
                {"pool_id": "pool-t", "known_ids": [binary[0].id]},
            )
            recovered = jobs_from_rows(await cur.fetchall(), names)
    assert len(binary) == len(added)
    assert sorted(recovered) == sorted(job for job in binary if job.id != binary[0].id)
    by_id = {job.id: job for job in binary}
    for before in added:
        job = by_id[before.id]
        assert job.payload == before.payload and job.flags == {"f1": True, "f2": True}
        assert job._replace(
            attempts=0, locked_at=None, locked_by=None, is_available=True
        ) == before._replace(attempts=0)
        assert (job.attempts, job.locked_by, job.is_available) == (1, "pool-t", False)


@pytest.mark.parametrize("no_prepared_statements", [False, True])
async def test_a_task_sees_its_job_as_it_is_stored(
    utils: WorkerUtils, db: str, no_prepared_statements: bool
) -> None:
    """The fetch reads rows on a UTC session: every field of helpers.job is the
    stored value (timestamps the same instants)."""
    run_at, added = await _add_jobs_of_every_kind(utils)
    seen: dict[int, Job] = {}

    async def inspect(payload: Any, helpers: Helpers) -> None:
        seen[helpers.job.id] = helpers.job

    await run_once(
        db,
        task_list={"inspect": inspect},
        no_handle_signals=True,
        no_prepared_statements=no_prepared_statements,
    )
    assert len(seen) == len(added)
    for before in added:
        job = seen[before.id]
        assert job.payload == before.payload
        assert job.run_at == run_at and job.created_at == before.created_at
        assert job.flags == {"f1": True, "f2": True}
        assert job._replace(
            attempts=0, locked_at=None, locked_by=None, is_available=True
        ) == before._replace(attempts=0)
        assert job.attempts == 1 and job.locked_at is not None and not job.is_available


async def test_no_log_success_hides_success_lines(
    utils: WorkerUtils, db: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    await utils.add_job("quiet", {})
    monkeypatch.setenv("NO_LOG_SUCCESS", "1")
    caplog.set_level("INFO")

    async def quiet(payload: Any, helpers: Helpers) -> None:
        pass

    await run_once(db, task_list={"quiet": quiet}, no_handle_signals=True)
    assert not any("Completed task" in r.getMessage() for r in caplog.records)
    assert jobs(db) == []


async def test_batch_job_retries_only_failed_items(utils: WorkerUtils, db: str) -> None:
    job = await utils.add_job("batch", [{"id": 1}, {"id": 2}, {"id": 3}])
    calls: list[list[dict[str, int]]] = []

    async def batch(payload: list[dict[str, int]], helpers: Helpers) -> list[Any]:
        calls.append(payload)
        return [ValueError(f"item {item['id']}") if item["id"] == 2 else "ok" for item in payload]

    await run_once(db, task_list={"batch": batch}, no_handle_signals=True)
    [row] = rows(db, "select * from graphile_worker._private_jobs")
    assert row["id"] == job.id and row["payload"] == [{"id": 2}]
    assert "Batch failures (1 of 3 items)" in row["last_error"] and "item 2" in row["last_error"]
    rows(db, "update graphile_worker._private_jobs set run_at = now()")
    await run_once(
        db,
        task_list={"batch": lambda payload, helpers: ["ok"] * len(payload)},
        no_handle_signals=True,
    )
    assert jobs(db) == []


async def test_forbidden_flags(utils: WorkerUtils, db: str) -> None:
    await utils.add_job("t", {"n": "plain"})
    await utils.add_job("t", {"n": "slow"}, flags=["slow"])
    await utils.add_job("t", {"n": "both"}, flags=["slow", "big"])
    await utils.add_job("t", {"n": "big"}, flags=["big"])
    ran: list[str] = []

    async def t(payload: dict[str, str], helpers: Helpers) -> None:
        ran.append(payload["n"])

    await run_once(db, task_list={"t": t}, no_handle_signals=True, forbidden_flags=["slow"])
    assert sorted(ran) == ["big", "plain"]
    calls = 0

    async def flags_now() -> list[str]:
        nonlocal calls
        calls += 1
        return ["big"]

    await run_once(db, task_list={"t": t}, no_handle_signals=True, forbidden_flags=flags_now)
    assert sorted(ran) == ["big", "plain", "slow"] and calls >= 1
    await run_once(db, task_list={"t": t}, no_handle_signals=True, forbidden_flags=lambda: None)
    assert sorted(ran) == ["big", "both", "plain", "slow"]


async def test_named_queue_runs_one_job_at_a_time_in_process(utils: WorkerUtils, db: str) -> None:
    await utils.add_jobs(
        [{"identifier": "q", "payload": {"n": n}, "queue_name": "serial"} for n in range(12)]
    )
    await utils.add_jobs([{"identifier": "q", "payload": {"n": 100 + n}} for n in range(12)])
    active = 0
    peak_serial = 0
    order: list[int] = []

    async def q(payload: dict[str, int], helpers: Helpers) -> None:
        nonlocal active, peak_serial
        if helpers.get_queue_name():
            active += 1
            peak_serial = max(peak_serial, active)
            order.append(payload["n"])
        await asyncio.sleep(0.005)
        if helpers.get_queue_name():
            active -= 1

    await run_once(
        db,
        task_list={"q": q},
        no_handle_signals=True,
        concurrency=10,
        local_queue_size=500,
        local_queue_horizon=math.inf,
    )
    assert peak_serial == 1
    assert order == list(range(12))
    assert jobs(db) == []


async def wait_for_empty_fetch_after(recorder: Recorder, name: str, nth: int = 1) -> None:
    """Until the ``nth`` ``name`` event has come and, after it, a fetch found nothing
    (the one that event's nudge caused, or a later one): the pool is then idle."""
    await recorder.wait_for(name, nth)
    names = [event for event, _, _ in recorder.seen]
    index = [i for i, event in enumerate(names) if event == name][nth - 1]
    await recorder.wait_for("worker:getJob:empty", names[:index].count("worker:getJob:empty") + 1)


async def test_job_added_to_idle_worker_starts_quickly(db: str) -> None:
    events = Events()
    recorder = Recorder(events, "job:start", "pool:listen:success", "worker:getJob:empty")

    async def t(payload: Any, helpers: Helpers) -> None:
        pass

    async with worker(db, {"t": t}, events=events, poll_interval=30.0) as runner:
        # Idle: listening, and the fetch after that found nothing.
        await wait_for_empty_fetch_after(recorder, "pool:listen:success")
        latencies = []
        for n in range(5):
            added = time.monotonic()
            await runner.add_job("t", {"n": n})
            await recorder.wait_for("job:start", n + 1, within=5)
            latencies.append(recorder.seen[-1][1] - added)
    assert max(latencies) < 1.0, latencies  # the poll interval is 30 s


async def test_listen_reconnects_after_the_server_drops_it(db: str) -> None:
    events = Events()
    recorder = Recorder(
        events, "pool:listen:success", "pool:listen:error", "job:start", "worker:getJob:empty"
    )

    async def t(payload: Any, helpers: Helpers) -> None:
        pass

    async with worker(db, {"t": t}, events=events, poll_interval=30.0) as runner:
        await recorder.wait_for("pool:listen:success")
        rows(
            db,
            "select pg_terminate_backend(pid) from pg_stat_activity "
            "where datname = current_database() and query like 'listen%%' "
            "and pid <> pg_backend_pid()",
        )
        await recorder.wait_for("pool:listen:error")
        # Listening again, and the catch-up fetch that followed found nothing: the
        # job below can only be noticed through the new LISTEN connection.
        await recorder.wait_for("pool:listen:success", 2, within=15)
        await wait_for_empty_fetch_after(recorder, "pool:listen:success", 2)
        added = time.monotonic()
        await runner.add_job("t", {})
        await recorder.wait_for("job:start", within=5)
        assert recorder.seen[-1][1] - added < 1.0


async def test_a_task_added_by_another_transaction_during_start_up_is_run(db: str) -> None:
    # A job for a new task is added while the worker registers its tasks: the
    # worker's insert of the identifier waits for that transaction, and must
    # still learn the task's id (it once never fetched that task's jobs).
    events = Events()
    recorder = Recorder(events, "job:success")

    async def t(payload: Any, helpers: Helpers) -> None:
        return None

    with psycopg.connect(db) as other:
        other.execute("select graphile_worker.add_job('t', '{}')")  # not committed yet
        starting = asyncio.ensure_future(
            run(db, task_list={"t": t}, events=events, no_handle_signals=True)
        )
        # Until the worker's registration of `t` waits for `other`'s lock.
        async with asyncio.timeout(10):
            while not value(
                db,
                "select count(*) from pg_stat_activity where datname = current_database() "
                "and wait_event_type = 'Lock' and %s = any(pg_blocking_pids(pid))",
                (other.info.backend_pid,),
            ):
                assert not starting.done()
                await asyncio.sleep(0.02)
        assert not starting.done()
        other.commit()
    runner = await starting
    try:
        await recorder.wait_for("job:success", within=10)
    finally:
        await runner.stop()
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0


async def test_jobs_added_together_run_in_the_order_they_were_added(
    utils: WorkerUtils, db: str
) -> None:
    # One add_jobs call gives every job the same run_at, so only the id says
    # which came first. Rows updated since (here: the first five of each
    # kind, moved to the end of the table) must not lose their turn.
    await utils.add_jobs(
        [{"identifier": "t", "payload": {"n": n}, "queue_name": "serial"} for n in range(10)]
        + [{"identifier": "t", "payload": {"n": n}} for n in range(10, 20)]
    )
    first_five = "(payload->>'n')::int % 10 < 5"
    rows(db, f"update graphile_worker._private_jobs set priority = 1 where {first_five}")
    rows(db, f"update graphile_worker._private_jobs set priority = 0 where {first_five}")
    ran: list[int] = []

    async def t(payload: Any, helpers: Helpers) -> None:
        ran.append(payload["n"])

    await run_once(db, task_list={"t": t}, concurrency=1)
    assert [n for n in ran if n < 10] == list(range(10))  # the named queue
    assert [n for n in ran if n >= 10] == list(range(10, 20))


async def test_graceful_shutdown_returns_unstarted_jobs(utils: WorkerUtils, db: str) -> None:
    await utils.add_jobs([{"identifier": "slow", "payload": {"n": n}} for n in range(10)])
    events = Events()
    recorder = Recorder(events, "job:start", "job:success")

    release = asyncio.Event()

    async def slow(payload: Any, helpers: Helpers) -> None:
        await release.wait()

    runner = await run(
        db,
        task_list={"slow": slow},
        events=events,
        no_handle_signals=True,
        concurrency=2,
        local_queue_size=5,
        local_queue_horizon=math.inf,
    )
    await recorder.wait_for("job:start", 2)
    locked = "select count(*) from graphile_worker._private_jobs where locked_by is not null"
    assert value(db, locked) == 7  # 2 running + 5 fetched ahead
    runner.pool.stop()
    # The 5 unstarted ones come back while the 2 running jobs still run.
    deadline = time.monotonic() + 10
    while value(db, locked) != 2:
        assert time.monotonic() < deadline, value(db, locked)
        await asyncio.sleep(0.05)
    assert len(recorder.of("job:success")) == 0
    release.set()
    await runner
    assert len(recorder.of("job:success")) == 2
    left = rows(db, "select attempts, locked_by, locked_at from graphile_worker._private_jobs")
    assert len(left) == 8
    assert all(r == {"attempts": 0, "locked_by": None, "locked_at": None} for r in left)
    assert runner.exit_code == 0


async def test_abort_signal_is_set_after_the_graceful_timeout(utils: WorkerUtils, db: str) -> None:
    await utils.add_job("long", {})
    events = Events()
    recorder = Recorder(events, "job:start")

    async def long(payload: Any, helpers: Helpers) -> str:
        await helpers.abort_signal.wait()
        return "stopped early"

    runner = await run(
        db,
        task_list={"long": long},
        events=events,
        no_handle_signals=True,
        graceful_shutdown_timeout=0.2,
    )
    await recorder.wait_for("job:start")
    started = time.monotonic()
    await runner.stop()
    assert 0.15 < time.monotonic() - started < 3
    assert jobs(db) == []  # it returned normally: success


async def test_forced_shutdown_fails_running_jobs_so_they_retry(
    utils: WorkerUtils, db: str
) -> None:
    job = await utils.add_job("stuck", {})
    events = Events()
    recorder = Recorder(events, "job:start")

    async def stuck(payload: Any, helpers: Helpers) -> None:
        await asyncio.sleep(60)  # ignores abort_signal

    runner = await run(
        db,
        task_list={"stuck": stuck},
        events=events,
        no_handle_signals=True,
        graceful_shutdown_timeout=0.1,
    )
    await recorder.wait_for("job:start")
    runner.pool.stop()
    await asyncio.sleep(0.3)
    # Graceful shutdown waits: the job ignores its abort_signal.
    assert value(db, "select locked_by from graphile_worker._private_jobs") == runner.pool.id
    runner.force_stop()
    await asyncio.wait_for(asyncio.shield(runner._task), 5)
    [row] = rows(db, "select * from graphile_worker._private_jobs")
    assert row["id"] == job.id and row["attempts"] == 1 and row["locked_by"] is None
    assert "stopped while the job was running" in row["last_error"]
    assert row["run_at"] > datetime.now(UTC)


async def test_breaking_migration_notice_stops_with_exit_code_57(db: str) -> None:
    async def t(payload: Any, helpers: Helpers) -> None:
        pass

    events = Events()
    recorder = Recorder(events, "pool:listen:success")
    runner = await run(db, task_list={"t": t}, events=events, no_handle_signals=True)
    await recorder.wait_for("pool:listen:success")
    rows(db, """select pg_notify('worker:migrate', '{"migrationNumber":21,"breaking":true}')""")
    await asyncio.wait_for(asyncio.shield(runner._task), 5)
    assert runner.exit_code == 57


async def test_stale_locks_are_released_by_the_sweep(utils: WorkerUtils, db: str) -> None:
    job = await utils.add_job("t", {}, queue_name="q")
    rows(
        db,
        "update graphile_worker._private_jobs set attempts = 1, "
        "locked_at = now() - interval '2 minutes', locked_by = 'pool-dead'",
    )
    rows(
        db,
        "update graphile_worker._private_job_queues "
        "set locked_at = now() - interval '2 minutes', locked_by = 'pool-dead'",
    )
    ran = asyncio.Event()

    async def t(payload: Any, helpers: Helpers) -> None:
        ran.set()

    options = WorkerOptions(
        stale_lock_timeout=timedelta(minutes=1), stale_sweep_interval=(0.1, 0.2)
    )
    pool = WorkerPool(db, make_task_list({"t": t}), options)
    running = asyncio.create_task(pool.run())
    try:
        await asyncio.wait_for(ran.wait(), 5)
    finally:
        pool.stop()
        await running
    assert (
        value(db, "select count(*) from graphile_worker._private_jobs where id = %s", (job.id,))
        == 0
    )


async def test_events_of_a_successful_job(utils: WorkerUtils, db: str) -> None:
    await utils.add_job("t", {})
    events = Events()
    names = [
        "pool:create",
        "worker:create",
        "job:start",
        "job:success",
        "job:complete",
        "worker:stop",
        "pool:release",
        "stop",
    ]
    recorder = Recorder(events, *names)
    seen_async = []

    async def async_handler(data: dict[str, Any]) -> None:
        await asyncio.sleep(0.01)
        seen_async.append(data["job"].id)

    events.on("job:success", async_handler)
    await run_once(db, task_list={"t": lambda payload, helpers: None}, events=events)
    order = [event for event, _, _ in recorder.seen]
    for name in names:
        assert name in order, name
    assert order.index("job:start") < order.index("job:success") < order.index("job:complete")
    assert len(seen_async) == 1


async def test_task_list_and_directory_are_exclusive(db: str) -> None:
    from worker_cli import ConfigurationError

    with pytest.raises(ConfigurationError, match="exactly one of task_list and task_directory"):
        await run(db, no_handle_signals=True)
