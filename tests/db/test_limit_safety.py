"""Limits that one job cannot break (issue 41): a partition value of any
length or content keys its own partition without failing the fetch; the
blocking forms of helpers.limit and helpers.run, called on the event loop's
own thread, fail that job at once instead of deadlocking the worker; nested
holds of one operation by one job count once; and a limit set or changed
while jobs run counts them, fetches in flight included."""

from __future__ import annotations

import asyncio
import random
import signal
import string
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dbhelpers import cli_path, rows, run_cli, value
from worker_fleet import start
from workers import until, worker

from worker_cli import Helpers, Limit, LimitsBusyError, Snooze, WorkerUtils, run_once

TASKS = "array(select id from graphile_worker._private_tasks)"
FETCH_LIMITED = (
    f"select id from graphile_worker.py_fetch_limited_jobs({TASKS}, null, %s, 'p') order by id"
)
FETCH = f"select id from graphile_worker.py_fetch_jobs({TASKS}, null, 100, 'p') order by id"
STATE = (
    "select partition, running from graphile_worker._private_py_limit_state "
    "where kind = %s and name = %s order by partition"
)


def fetched(db: str, limit: int = 100) -> list[int]:
    return [row["id"] for row in rows(db, FETCH_LIMITED, (limit,))]


def finish(db: str, ids: list[int]) -> None:
    """The jobs end (their rows go, as a completion does)."""
    rows(db, "delete from graphile_worker._private_jobs where id = any(%s)", (ids,))


def incompressible(length: int) -> str:
    """A value too long for a btree entry (one that compresses well would fit)."""
    return "".join(random.Random(length).choices(string.ascii_letters, k=length))


def add_sql_job(db: str, task: str, payload: str) -> int:
    """A job added in SQL (as Node or any client may), its payload as written."""
    job_id: int = value(db, "select (graphile_worker.add_job(%s, %s::json)).id", (task, payload))
    return job_id


# --- Partition keys of any length and content (finding 4) ---------------------


@pytest.mark.db
async def test_a_partition_value_too_long_for_an_index_keys_its_own_partition(
    utils: WorkerUtils, db: str
) -> None:
    """A value longer than a btree entry may be (about 2.7 kB) and a payload
    PostgreSQL cannot read as text fail the limited fetch for every job of
    the limit; here they are keyed like any other value."""
    await utils.set_limit(Limit(max_running=1, partition_by="account"), task="lim")
    long_a = incompressible(3000)
    long_b = long_a[:-1] + "!"  # the same first 64 characters
    ids = [
        j.id
        for j in await utils.add_jobs(
            [
                {"identifier": "lim", "payload": {"account": account}}
                for account in [long_a, long_a, long_b, "short"]
            ]
        )
    ]
    assert fetched(db) == [ids[0], ids[2], ids[3]]
    assert fetched(db) == []  # the second long_a job shares long_a's partition
    # \u0000 is valid JSON that PostgreSQL cannot turn into text: the job
    # counts under the empty value, as a job without the field does.
    unreadable = add_sql_job(db, "lim", '{"account": "a\\u0000b"}')
    assert fetched(db) == [unreadable]
    keys = [row["partition"] for row in rows(db, STATE, ("task", "lim"))]
    assert "short" in keys and "" in keys  # short values stay readable
    hashed = [key for key in keys if key.startswith(long_a[:64])]
    assert len(hashed) == 2 and all(len(key.encode()) < 300 for key in hashed)
    finish(db, [ids[0]])
    assert fetched(db) == [ids[1]]


@pytest.mark.db
async def test_a_worker_runs_every_job_of_a_limit_with_an_unindexable_value(
    utils: WorkerUtils, db: str
) -> None:
    ran: list[int] = []

    async def lim(payload: Any, helpers: Helpers) -> None:
        ran.append(helpers.job.id)

    await utils.set_limit(Limit(max_running=2, partition_by="account"), task="lim")
    added = await utils.add_jobs(
        [
            {"identifier": "lim", "payload": {"account": account}}
            for account in [incompressible(5000), "b"]
        ]
    )
    unreadable = add_sql_job(db, "lim", '{"account": "\\u0000", "\\u0000": 1}')
    async with asyncio.timeout(60):
        await run_once(db, task_list={"lim": lim}, concurrency=4, no_handle_signals=True)
    assert sorted(ran) == sorted([*(j.id for j in added), unreadable])


@pytest.mark.db
async def test_an_operation_partition_of_any_length_or_character_is_keyed(
    utils: WorkerUtils, db: str
) -> None:
    """helpers.limit's partition: a long value, or one PostgreSQL cannot store
    as text (NUL, a lone surrogate), keys its own partition; the same value
    shares it."""
    await utils.set_limit(Limit(max_running=1), operation="op")
    long = incompressible(5000)
    partitions = [long, "a\x00b", "\ud800", long]
    entered: list[str] = []
    hold = asyncio.Event()
    in_block = 0

    async def call(payload: Any, helpers: Helpers) -> None:
        nonlocal in_block
        partition = partitions[payload["n"]]
        async with helpers.limit("op", partition=partition):
            entered.append(partition)
            in_block += 1
            await hold.wait()
            in_block -= 1

    jobs = await utils.add_jobs([{"identifier": "call", "payload": {"n": n}} for n in range(4)])
    async with worker(db, {"call": call}, concurrency=4, poll_interval=0.2):
        # The first three hold their partitions; the fourth (the first's
        # value) is held back (it snoozes) while the first holds it.
        await until(lambda: in_block == 3, what="three distinct partitions to be entered")
        await until(
            lambda: (
                value(
                    db,
                    "select count(*) from graphile_worker._private_jobs "
                    "where locked_at is null and run_at > now()",
                )
                == 1
            ),
            what="the fourth job to snooze",
        )
        assert sorted(entered) == sorted(partitions[:3])
        hold.set()
        await until(
            lambda: value(db, "select count(*) from graphile_worker._private_jobs") == 0,
            within=20,
            what="every job to finish",
        )
    assert sorted(entered) == sorted(partitions)
    attempts = "select attempts from graphile_worker._private_py_job_history where job_id = any(%s)"
    assert [r["attempts"] for r in rows(db, attempts, ([j.id for j in jobs],))] == [1, 1, 1, 1]


# --- Blocking forms on the event loop's thread (finding 5) ---------------------

SYNC_LIMIT = """\
async def task(payload, helpers):
    with helpers.limit("op"):
        pass
"""

SYNC_RUN = """\
async def task(payload, helpers):
    helpers.run(helpers.query("select 1"))
"""

FINE = """\
async def task(payload, helpers):
    pass
"""


@pytest.mark.db
async def test_blocking_forms_in_an_async_task_fail_that_job_and_the_worker_stops(
    utils: WorkerUtils, db: str, tmp_path: Path
) -> None:
    """``with helpers.limit(...)`` and ``helpers.run(...)`` wait for the
    worker's event loop: called on that loop's own thread (an ``async def``
    task) they deadlocked the worker, which then ignored SIGTERM. Now the job
    fails at once with one line naming the form to use; the others run, and
    SIGTERM stops the worker."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name, text in [("sync_limit", SYNC_LIMIT), ("sync_run", SYNC_RUN), ("fine", FINE)]:
        (tasks / f"{name}.py").write_text(text)
    await utils.set_limit(Limit(max_running=5), operation="op")
    bad_limit = await utils.add_job("sync_limit", {}, max_attempts=1)
    bad_run = await utils.add_job("sync_run", {}, max_attempts=1)
    fine = [j.id for j in await utils.add_jobs([{"identifier": "fine", "payload": {}}] * 3)]
    proc = start([cli_path(), "-c", db, "-j", "2"], tmp_path)
    try:
        # The three fine jobs gone, the two bad ones failed for good.
        done = (
            "select count(*) = 2 and bool_and(locked_at is null and attempts >= max_attempts) "
            "from graphile_worker._private_jobs"
        )
        await until(lambda: value(db, done), within=30, what="the worker to run its five jobs")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for job, first_line in [
        (
            bad_limit,
            "RuntimeError: helpers.limit: 'with helpers.limit(...)' waits for the worker's "
            "event loop, and this is that loop's own thread (an async def task); "
            "write 'async with helpers.limit(...)'",
        ),
        (
            bad_run,
            "RuntimeError: helpers.run() waits for the worker's event loop, and this is "
            "that loop's own thread (an async def task); write 'await ...' instead",
        ),
    ]:
        record = await utils.get_job_result(job.id)
        assert record.state == "failed"
        assert record.last_error is not None
        assert record.last_error.splitlines()[0] == first_line
    for job_id in fine:
        assert (await utils.get_job_result(job_id)).state == "succeeded"


# --- Nested holds of one operation (finding 7) ---------------------------------


@pytest.mark.db
async def test_nested_holds_of_one_operation_count_once_and_release_once(
    utils: WorkerUtils, db: str
) -> None:
    """A task's block around a client that takes the same limit: the job
    holds one slot, until its outermost block ends. With max_running=2, one
    other job may enter while it holds the slot, not two."""
    await utils.set_limit(Limit(max_running=2), operation="api")
    inner_done = asyncio.Event()
    tried: list[str] = []
    both_tried = asyncio.Event()
    release = asyncio.Event()

    async def client(helpers: Helpers) -> None:
        async with helpers.limit("api"):
            pass

    async def outer(payload: Any, helpers: Helpers) -> None:
        async with helpers.limit("api"):
            await client(helpers)  # nested: the same operation, the same job
            inner_done.set()
            await both_tried.wait()  # still inside the outer block

    async def other(payload: Any, helpers: Helpers) -> None:
        await inner_done.wait()
        try:
            async with helpers.limit("api"):
                tried.append("entered")
                if len(tried) == 2:
                    both_tried.set()
                await release.wait()
        except Snooze:
            if not release.is_set():
                tried.append("denied")
                if len(tried) == 2:
                    both_tried.set()
            raise

    await utils.add_job("outer", {})
    await utils.add_jobs([{"identifier": "other", "payload": {}}] * 2)
    async with worker(db, {"outer": outer, "other": other}, concurrency=3, poll_interval=0.2):
        async with asyncio.timeout(20):
            await both_tried.wait()
        assert sorted(tried) == ["denied", "entered"]
        release.set()
        await until(
            lambda: value(db, "select count(*) from graphile_worker._private_jobs") == 0,
            within=20,
            what="every job to finish",
        )


@pytest.mark.db
async def test_nested_holds_in_a_plain_task_take_one_slot_and_one_start(
    utils: WorkerUtils, db: str
) -> None:
    """With one slot and one start a minute, a job whose block nests another
    of the same operation (and partition) still enters both: it snoozed for
    ever before."""
    await utils.set_limit(Limit(max_running=1, max_starts=1, per=60), operation="api")
    entered: list[str] = []

    def nested(payload: Any, helpers: Helpers) -> None:
        with helpers.limit("api", partition="acct"):
            with helpers.limit("api", partition="acct"):
                entered.append("inner")
            entered.append("outer")

    job = await utils.add_job("nested", {})
    await run_once(db, task_list={"nested": nested}, no_handle_signals=True)
    assert entered == ["inner", "outer"]
    assert (await utils.get_job_result(job.id)).state == "succeeded"
    [state] = rows(db, STATE, ("operation", "api"))
    assert state == {"partition": "acct", "running": []}  # released once the outer ended


# --- A limit set or changed while jobs run (finding 8) -------------------------


@pytest.mark.db
async def test_a_limit_set_while_jobs_run_counts_them(utils: WorkerUtils, db: str) -> None:
    """Jobs of the task locked when the limit is set, by any pool (a Node
    worker's too), count: no job starts until the count is under it."""
    running = [j.id for j in await utils.add_jobs([{"identifier": "lim", "payload": {}}] * 2)]
    assert [row["id"] for row in rows(db, FETCH)] == running  # no limit yet: the usual fetch
    node = (await utils.add_job("lim", {})).id
    rows(
        db,
        "update graphile_worker._private_jobs set locked_at = now(), locked_by = 'node-pool', "
        "attempts = 1 where id = %s",
        (node,),
    )
    waiting = (await utils.add_job("lim", {})).id
    info = await utils.set_limit(Limit(max_running=2), task="lim")
    assert info.running == 3  # what set_limit (and the CLI) report
    assert fetched(db) == []
    finish(db, running)
    assert fetched(db) == [waiting]
    assert (await utils.list_limits())[0].running == 2


@pytest.mark.db
async def test_changing_partition_by_counts_the_running_jobs_per_new_value(
    utils: WorkerUtils, db: str
) -> None:
    await utils.set_limit(Limit(max_running=5), task="lim")
    [a1] = [j.id for j in await utils.add_jobs([job({"account": "a", "region": "eu"})])]
    assert fetched(db) == [a1]
    await utils.set_limit(Limit(max_running=1, partition_by="account"), task="lim")
    a2, b1 = [j.id for j in await utils.add_jobs([job({"account": "a"}), job({"account": "b"})])]
    assert fetched(db) == [b1]  # a1 runs: account a is full
    # Another field: the values are the new field's (a1 is in region eu).
    await utils.set_limit(Limit(max_running=1, partition_by="region"), task="lim")
    r_a, r_eu = [
        j.id
        for j in await utils.add_jobs(
            [job({"account": "z", "region": "a"}), job({"account": "y", "region": "eu"})]
        )
    ]
    # a2 has no region: the empty value, where b1 runs.
    assert fetched(db) == [r_a]
    finish(db, [a1, b1])
    assert fetched(db) == [a2, r_eu]


def job(payload: dict[str, Any]) -> dict[str, Any]:
    return {"identifier": "lim", "payload": payload}


def blocked_or_done(db: str, pid: int, thread: threading.Thread) -> Callable[[], bool]:
    """Whether the session ``pid`` waits for a lock, or ``thread`` has ended."""

    def check() -> bool:
        waiting = value(
            db, "select wait_event_type = 'Lock' from pg_stat_activity where pid = %s", (pid,)
        )
        return bool(waiting) or not thread.is_alive()

    return check


@pytest.mark.db
async def test_a_limit_set_during_a_fetch_counts_what_that_fetch_takes(
    utils: WorkerUtils, db: str
) -> None:
    """A fetch in flight when the limit is set (its snapshot before the
    limit's commit) locks jobs of the task: set_limit waits for it, and then
    counts them."""
    await utils.add_jobs([{"identifier": "lim", "payload": {}}] * 2)
    with psycopg.connect(db) as fetching, psycopg.connect(db, autocommit=True) as setting:
        taken = [r[0] for r in fetching.execute(FETCH).fetchall()]  # not committed yet
        assert len(taken) == 2
        pid = setting.info.backend_pid
        done: list[Any] = []
        thread = threading.Thread(
            target=lambda: done.append(
                setting.execute(
                    "select graphile_worker.py_set_limit('task', 'lim', max_running => 2)"
                ).fetchall()
            )
        )
        thread.start()
        await until(blocked_or_done(db, pid, thread), what="set_limit to wait or end")
        assert not done, "set_limit did not wait for the fetch in flight"
        fetching.commit()
        thread.join(10)
        assert done
    waiting = (await utils.add_job("lim", {})).id
    assert fetched(db) == []
    finish(db, taken[:1])
    assert fetched(db) == [waiting]


@pytest.mark.db
async def test_a_fetch_during_set_limit_sees_the_limit(utils: WorkerUtils, db: str) -> None:
    """A fetch that starts while set_limit's transaction is open waits for it
    and then leaves the newly limited task to the limited fetch."""
    ids = [j.id for j in await utils.add_jobs([{"identifier": "lim", "payload": {}}] * 3)]
    with psycopg.connect(db) as setting, psycopg.connect(db, autocommit=True) as fetching:
        setting.execute("select graphile_worker.py_set_limit('task', 'lim', max_running => 1)")
        pid = fetching.info.backend_pid
        got: list[list[int]] = []
        thread = threading.Thread(
            target=lambda: got.append([r[0] for r in fetching.execute(FETCH).fetchall()])
        )
        thread.start()
        await until(blocked_or_done(db, pid, thread), what="the fetch to wait or end")
        assert not got, "the fetch did not wait for set_limit"
        setting.commit()
        thread.join(10)
        assert got == [[]]
    assert fetched(db) == ids[:1]


@pytest.mark.db
@pytest.mark.slow  # the 5-second wait, then the command line's own
async def test_set_limit_waits_at_most_5_seconds_for_a_transaction_using_the_limits(
    utils: WorkerUtils, db: str
) -> None:
    """Fetches queue behind set_limit's lock: a transaction left open after
    reading the limits must not hold every worker's fetches for ever."""
    with psycopg.connect(db) as holding:
        holding.execute("select count(*) from graphile_worker._private_py_limits")
        with pytest.raises(LimitsBusyError) as caught:
            await utils.set_limit(Limit(max_running=1), task="lim")
        assert str(caught.value) == (
            "set_limit: the limits were in use for more than 5 seconds (a transaction left "
            "open after reading them?); nothing was changed"
        )
        # The command line says it in one line (exit 1), no traceback.
        done = await asyncio.to_thread(
            run_cli, "limit", "-c", db, "--task", "lim", "--max-running", "1", timeout=30
        )
        assert done.returncode == 1
        assert done.stderr.strip() == f"Error: {caught.value}"
        holding.rollback()
    assert await utils.list_limits() == []
