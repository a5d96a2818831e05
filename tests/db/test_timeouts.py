"""Timeouts: declared per task (``@task_options``) or per job (``add_job(...,
timeout=...)``); each attempt is timed from its task call; an ``async def``
task is cancelled at its timeout, a plain one is told; a plain one stuck past
the grace waits (never run twice) or stops the worker (exit code 75); long
jobs keep their locks."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import stat
import threading
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest
from dbhelpers import rows, stuck_in_heartbeat, value
from fault_helpers import Worker, kill_leftover_workers
from workers import until, worker

from worker_cli import (
    Helpers,
    JobSpecError,
    TaskOptions,
    WorkerUtils,
    make_sync_worker_utils,
    quick_add_job,
    task_options,
    typed_task_list,
)
from worker_cli.config.options import WorkerOptions
from worker_cli.tasks.loader import load_task_directory, make_task_list
from worker_cli.worker import WorkerPool

HISTORY = "graphile_worker._private_py_job_history"
OPTIONS = "graphile_worker._private_py_job_options"
JOBS = "graphile_worker._private_jobs"


def history(db: str, job_id: int) -> dict[str, Any]:
    [row] = rows(db, f"select * from {HISTORY} where job_id = %s", (job_id,))
    return row


def job_row(db: str, job_id: int) -> dict[str, Any]:
    [row] = rows(db, f"select * from {JOBS} where id = %s", (job_id,))
    return row


def ended(db: str, job_id: int) -> Any:
    """The job's history row or its failed attempt (a condition for ``until``)."""
    in_history = value(db, f"select 1 from {HISTORY} where job_id = %s", (job_id,))
    failed = value(db, f"select 1 from {JOBS} where id = %s and last_error is not null", (job_id,))
    return in_history or failed


def alive(pid_file: Path) -> bool:
    """The process whose pid the file holds still exists."""
    return Path(f"/proc/{pid_file.read_text().strip()}").exists()


# --- Declaring timeouts --------------------------------------------------------


@dataclass
class Resize:
    IDENTIFIER: ClassVar[str] = "resize"
    width: int


@pytest.mark.unit
def test_task_options_are_declared_beside_the_task_and_loaded_with_it(tmp_path: Path) -> None:
    (tmp_path / "slow.py").write_text(
        "from datetime import timedelta\n"
        "from worker_cli import task_options\n\n"
        "@task_options(timeout=timedelta(minutes=2), on_timeout='fail', on_stuck='exit')\n"
        "def task(payload, helpers):\n    pass\n"
    )
    (tmp_path / "plain.py").write_text("async def task(payload, helpers):\n    pass\n")
    (tmp_path / "script").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "script").chmod(stat.S_IRWXU)
    loaded = load_task_directory(tmp_path)
    assert loaded["slow"].options == TaskOptions(timeout=120, on_timeout="fail", on_stuck="exit")
    assert loaded["plain"].options == TaskOptions()
    assert loaded["plain"].options.timeout is None  # none by default, as in Node
    assert loaded["script"].options == TaskOptions()

    @task_options(timeout=1.5, on_timeout="cancel")
    async def listed(payload: Any, helpers: Helpers) -> None: ...

    @task_options(timeout=3)
    async def typed(payload: Resize, helpers: Helpers) -> None: ...

    tasks = make_task_list({"listed": listed, **typed_task_list(typed)})
    assert tasks["listed"].options == TaskOptions(timeout=1.5, on_timeout="cancel")
    assert tasks["resize"].options.timeout == 3  # a typed task keeps its options
    assert tasks["resize"].function is not typed  # (it is wrapped)
    with pytest.raises(AttributeError):
        tasks["listed"].options.timeout = 5  # type: ignore[misc]
    for bad in ({"timeout": 0}, {"timeout": "3"}, {"on_timeout": "skip"}, {"on_stuck": "kill"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            task_options(**bad)  # type: ignore[arg-type]


@pytest.mark.db
async def test_a_jobs_own_timeout_is_stored_beside_it_only_when_given(
    utils: WorkerUtils, db: str
) -> None:
    plain = await utils.add_job("t", {})
    timed = await utils.add_job("t", {}, timeout=30)
    keyed = await utils.add_job("t", {}, job_key="k", timeout=timedelta(minutes=5))
    # The latest call's (tests/db/test_job_key.py: each job_key mode).
    assert (await utils.add_job("t", {}, job_key="k", timeout=120)).id == keyed.id
    batch = await utils.add_jobs(
        [
            {"identifier": "t", "timeout": 1.5},
            {"identifier": "t"},
            {"identifier": "t", "timeout": 7},
        ]
    )
    unique = await utils.add_jobs(
        [{"identifier": "t", "payload": {"n": 1}, "timeout": 4}, {"identifier": "t"}],
        unique={"period": 60},
    )
    conflict = await utils.add_job("t", {"n": 1}, timeout=99, unique={"period": 60})
    quick = await quick_add_job("t", {}, connection_string=db, timeout=12)
    with make_sync_worker_utils(connection_string=db) as sync:
        synced = sync.add_job("t", {}, timeout=5)
    stored = {row["job_id"]: row["timeout"] for row in rows(db, f"select * from {OPTIONS}")}
    assert stored == {
        timed.id: timedelta(seconds=30),
        keyed.id: timedelta(minutes=2),
        batch[0].id: timedelta(seconds=1.5),
        batch[2].id: timedelta(seconds=7),
        unique[0].job_id: timedelta(seconds=4),
        quick.id: timedelta(seconds=12),
        synced.id: timedelta(seconds=5),
    }
    assert plain.id not in stored and batch[1].id not in stored and conflict.conflict
    refused = [(0, "more than 0"), (-1, "more than 0"), (float("nan"), "more than 0"),
               (True, "not bool"), ("30", "not str"), (10**9, "at most a year")]  # fmt: skip
    for bad, reason in refused:
        with pytest.raises(JobSpecError, match=reason) as info:
            await utils.add_job("t", {}, timeout=bad)
        assert info.value.field == "timeout"
    with pytest.raises(JobSpecError) as info:
        await utils.add_jobs([{"identifier": "t"}, {"identifier": "t", "timeout": -3}])
    assert info.value.field == "specs[1].timeout"
    assert value(db, f"select count(*) from {JOBS}") == 10  # nothing half added


# --- The fetch ---------------------------------------------------------------


#: What migrations/py/000014.sql and 000015.sql added to py_fetch_jobs:
#: paused and limited tasks and queues left alone.
PAUSE_PARTS = (
    """
  -- Named queues and tasks left alone: paused, or limited (null: none).
  v_paused_queues text[];
  v_paused_tasks text[];""",
    """  -- Pauses and limits: one look at each empty table when nothing is paused
  -- or limited. Paused and limited tasks leave task_ids; paused and limited
  -- queues are not locked below, so none of their jobs is a candidate
  -- (limited ones are py_fetch_limited_jobs'). Expired pauses (resume_at
  -- passed) count for nothing, whether or not the upkeep has deleted them yet.
  if exists (select from "graphile_worker"._private_py_pauses)
    or exists (select from "graphile_worker"._private_py_limits)
  then
    select array_agg(p.name) filter (where p.kind = 'queue'),
      array_agg(p.name) filter (where p.kind = 'task')
    into v_paused_queues, v_paused_tasks
    from (
      select p.kind, p.name
      from "graphile_worker"._private_py_pauses as p
      where p.resume_at is null or p.resume_at > v_now
      union all
      select l.kind, l.name from "graphile_worker"._private_py_limits as l
    ) as p;
    if v_paused_tasks is not null then
      task_ids := array(
        select t.id
        from "graphile_worker"._private_tasks as t
        where t.id = any(task_ids)
          and not ('*' = any(v_paused_tasks) or t.identifier = any(v_paused_tasks))
      );
    end if;
  end if;
""",
    """
      and (v_paused_queues is null
        or not ('*' = any(v_paused_queues) or q.queue_name = any(v_paused_queues)))""",
)


#: What migrations/py/000017.sql changed in py_fetch_jobs: the chosen jobs'
#: queues locked by primary key (never a hash of the whole queues table).
LOCK_QUEUES = (
    """
    update "graphile_worker"._private_job_queues as q
    set locked_at = v_now, locked_by = pool_id
    from chosen
    where q.id = chosen.job_queue_id
""",
    """
    -- By primary key, and only the queues chosen: joined to "chosen" instead,
    -- the planner could hash the whole queues table each fetch, even when no
    -- chosen job has a queue (1.7 ms with 10,000 queues).
    update "graphile_worker"._private_job_queues as q
    set locked_at = v_now, locked_by = pool_id
    where q.id = any(array(
      select chosen.job_queue_id from chosen where chosen.job_queue_id is not null
    ))
""",
)


@pytest.mark.db
def test_the_fetch_is_py_get_jobs_with_the_jobs_timeout_added(db: str) -> None:
    """py_fetch_jobs cannot drift from py_get_jobs (which stays, unchanged, for
    workers of older versions): the same body with now() read once (or the
    worker's now_at), the timeout column added, and paused and limited jobs
    left alone (the three parts of migrations/py/000014.sql and 000015.sql,
    each present once), and its queues locked by primary key (py/000017.sql)."""
    functions = {
        (row["name"], row["arity"]): row
        for row in rows(
            db,
            "select p.proname as name, p.pronargs as arity, p.prosrc as source, "
            "p.proconfig as settings from pg_proc as p "
            "join pg_namespace as n on n.oid = p.pronamespace "
            "where n.nspname = 'graphile_worker' and p.proname in ('py_get_jobs', 'py_fetch_jobs')",
        )
    }
    assert sorted(functions) == [("py_fetch_jobs", 5), ("py_get_jobs", 4), ("py_get_jobs", 5)]
    old, new = functions["py_get_jobs", 4], functions["py_fetch_jobs", 5]
    assert old["source"].count(LOCK_QUEUES[0].replace("v_now", "now()")) == 1
    expected = (
        old["source"]
        .replace(LOCK_QUEUES[0].replace("v_now", "now()"), LOCK_QUEUES[1])
        .replace("now()", "v_now")
        .replace(
            "\nbegin\n", "\ndeclare\n  v_now timestamptz := coalesce(now_at, now());\nbegin\n", 1
        )
        .replace(
            "\n    end;\nend;\n",
            "\n    end,\n"
            "    -- The job's own timeout, if it has one: a primary-key lookup per job,\n"
            "    -- made only while any job has options (one look per fetch: an initplan).\n"
            "    case when (select exists (select from"
            ' "graphile_worker"._private_py_job_options)) then\n'
            '      (select o.timeout from "graphile_worker"._private_py_job_options as o'
            " where o.job_id = j.id)\n"
            "    end;\nend;\n",
        )
    )
    source = new["source"]
    for part in PAUSE_PARTS:
        assert source.count(part) == 1, part
        source = source.replace(part, "")
    assert source == expected
    assert new["settings"] == old["settings"]


@pytest.mark.db
async def test_the_fetch_returns_each_jobs_timeout_and_looks_once_when_none_has_one(
    utils: WorkerUtils, db: str
) -> None:
    """A drain of jobs without options costs the fetch one look at the
    options per fetch, not one per job (a functional check of its plan)."""
    import psycopg

    await utils.add_jobs([{"identifier": "t"} for _ in range(40)])
    with psycopg.connect(db) as conn:
        task_id = conn.execute("select id from graphile_worker._private_tasks").fetchone()
        fetch = "select id, timeout from graphile_worker.py_fetch_jobs(%s::int[], null, 20, 'p')"
        scans = (
            "select pg_stat_get_xact_numscans("
            "'graphile_worker._private_py_job_options_pkey'::regclass)"
        )
        fetched = conn.execute(fetch, ([task_id[0]],)).fetchall()
        assert len(fetched) == 20 and {t for _, t in fetched} == {None}
        assert conn.execute(scans).fetchone() == (1,)  # one look, for 20 jobs
        conn.commit()
        timed = await utils.add_job("t", {}, timeout=9, priority=-1)
        timeouts = dict(conn.execute(fetch, ([task_id[0]],)).fetchall())
        assert len(timeouts) == 20 and timeouts.pop(timed.id) == timedelta(seconds=9)
        assert set(timeouts.values()) == {None}


# --- At the timeout ------------------------------------------------------------


@pytest.mark.db
@pytest.mark.parametrize("on_timeout", ["retry", "fail", "cancel"])
async def test_an_async_task_is_cancelled_at_its_timeout(
    utils: WorkerUtils, db: str, on_timeout: Any
) -> None:
    job = await utils.add_job("slow", {}, max_attempts=3)
    caught: list[str | None] = []

    @task_options(timeout=0.2, on_timeout=on_timeout)
    async def slow(payload: Any, helpers: Helpers) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            caught.append(helpers.cancel_reason)
            raise

    async with asyncio.timeout(30), worker(db, {"slow": slow}):
        await until(lambda: ended(db, job.id), what="the timeout")
    assert caught == ["timed out after 0.2s"]
    if on_timeout == "cancel":
        row = history(db, job.id)
        assert (row["state"], row["timed_out"], row["last_error"]) == (
            "cancelled",
            True,
            "JobTimeout: exceeded 0.2s",
        )
        assert row["cancel_reason"] == "timed out (JobTimeout: exceeded 0.2s)"
        assert value(db, f"select count(*) from {JOBS}") == 0
    else:
        row = job_row(db, job.id)
        assert (row["last_error"], row["locked_by"]) == ("JobTimeout: exceeded 0.2s", None)
        # retry: a failure like any other (retried with backoff); fail: for good now.
        assert row["attempts"] == (1 if on_timeout == "retry" else 3)
        expected = "retrying" if on_timeout == "retry" else "failed"
        assert await utils.get_job_status(job.id) == expected
    if on_timeout == "fail":  # archived by the cleanup: its last attempt timed out
        await utils.cleanup(["DELETE_PERMAFAILED_JOBS"])
        row = history(db, job.id)
        assert (row["state"], row["timed_out"]) == ("failed", True)


@pytest.mark.db
async def test_an_async_task_that_returns_after_its_timeout_succeeded(
    utils: WorkerUtils, db: str
) -> None:
    """Its work is done: a success, recorded as timed out. Its slot goes on as
    before: the next job raising CancelledError itself fails alone."""
    stubborn = await utils.add_job("stubborn", {})
    raising = await utils.add_job("raising", {})
    after = await utils.add_job("quick", {})

    @task_options(timeout=0.2)
    async def stubborn_task(payload: Any, helpers: Helpers) -> dict[str, str]:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            return {"done": "partly"}
        return {"done": "all"}

    async def raising_task(payload: Any, helpers: Helpers) -> None:
        cancelled = asyncio.get_running_loop().create_future()
        cancelled.cancel()
        await cancelled  # someone else's cancellation: only this job fails

    async def quick(payload: Any, helpers: Helpers) -> str:
        return "ran"

    tasks = {"stubborn": stubborn_task, "raising": raising_task, "quick": quick}
    async with asyncio.timeout(30), worker(db, tasks, concurrency=1):
        await until(lambda: ended(db, after.id), what="the last job")
    row = history(db, stubborn.id)
    assert (row["state"], row["timed_out"], row["result"]) == (
        "succeeded",
        True,
        {"done": "partly"},
    )
    assert (await utils.get_job_result(stubborn.id)).timed_out is True
    assert job_row(db, raising.id)["last_error"] == "CancelledError"
    assert (history(db, after.id)["result"], history(db, after.id)["timed_out"]) == ("ran", False)


@pytest.mark.db
@pytest.mark.parametrize("mode", ["raise", "return"])
async def test_a_plain_task_is_told_at_its_timeout(utils: WorkerUtils, db: str, mode: str) -> None:
    job = await utils.add_job("plain", {"mode": mode}, max_attempts=5)
    seen: list[tuple[bool, bool, str | None]] = []

    @task_options(timeout=0.2, on_timeout="fail")
    def plain(payload: dict[str, str], helpers: Helpers) -> str:
        seen.append((helpers.cancelled, helpers.timed_out, helpers.cancel_reason))
        while not helpers.cancelled:  # a step of its work at a time
            threading.Event().wait(0.005)
        seen.append((helpers.cancelled, helpers.timed_out, helpers.cancel_reason))
        if payload["mode"] == "raise":
            helpers.raise_if_cancelled()
        return "stopped at the timeout"

    async with asyncio.timeout(30), worker(db, {"plain": plain}):
        await until(lambda: ended(db, job.id), what="the timeout")
    assert seen == [(False, False, None), (True, True, "timed out after 0.2s")]
    if mode == "raise":
        row = job_row(db, job.id)  # on_timeout="fail": failed for good
        assert (row["last_error"], row["attempts"]) == ("JobTimeout: exceeded 0.2s", 5)
    else:
        row = history(db, job.id)
        assert (row["state"], row["timed_out"], row["result"]) == (
            "succeeded",
            True,
            "stopped at the timeout",
        )


@pytest.mark.db
async def test_an_executable_task_is_killed_at_its_jobs_timeout(
    utils: WorkerUtils, db: str, tmp_path: Path
) -> None:
    """An executable task file cannot declare options, but its jobs can: its
    process is killed at the job's timeout."""
    from worker_cli import run

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    pid_file = tmp_path / "pid"
    (tasks / "sleeper").write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 60\n")
    (tasks / "sleeper").chmod(stat.S_IRWXU)
    job = await utils.add_job("sleeper", {}, timeout=0.5)
    async with asyncio.timeout(30):
        runner = await run(db, task_directory=tasks, no_handle_signals=True)
        try:
            await until(lambda: ended(db, job.id), what="the timeout")
        finally:
            await runner.stop()
    assert job_row(db, job.id)["last_error"] == "JobTimeout: exceeded 0.5s"
    assert not alive(pid_file)  # killed, and reaped


@pytest.mark.db
async def test_a_jobs_own_timeout_wins_over_its_tasks(utils: WorkerUtils, db: str) -> None:
    release = asyncio.Event()

    @task_options(timeout=0.3)
    async def short(payload: Any, helpers: Helpers) -> str:
        await release.wait()
        return "released"

    @task_options(timeout=60)
    async def long(payload: Any, helpers: Helpers) -> None:
        await release.wait()

    by_task = await utils.add_job("short", {})
    longer = await utils.add_job("short", {}, timeout=60)
    shorter = await utils.add_job("long", {}, timeout=0.2)
    async with asyncio.timeout(30), worker(db, {"short": short, "long": long}, concurrency=3):
        await until(lambda: ended(db, by_task.id) and ended(db, shorter.id), what="timeouts")
        release.set()
        await until(lambda: ended(db, longer.id), what="the job with a longer timeout")
    assert job_row(db, by_task.id)["last_error"] == "JobTimeout: exceeded 0.3s"
    assert job_row(db, shorter.id)["last_error"] == "JobTimeout: exceeded 0.2s"
    row = history(db, longer.id)
    assert (row["state"], row["result"], row["timed_out"]) == ("succeeded", "released", False)


@pytest.mark.db
async def test_the_timeout_counts_from_the_task_call_not_from_the_queue(
    utils: WorkerUtils, db: str
) -> None:
    """A job fetched ahead waits in the local queue longer than its timeout,
    then runs its whole attempt."""
    blocker = await utils.add_job("block", {}, priority=-1)
    queued = await utils.add_job("quick", {}, timeout=0.2)
    started = asyncio.Event()
    release = asyncio.Event()

    async def block(payload: Any, helpers: Helpers) -> None:
        started.set()
        await release.wait()

    async def quick(payload: Any, helpers: Helpers) -> str:
        # One turn of the event loop: were its deadline counted from the
        # fetch (passed long ago), it would fire here. Its work takes no
        # time: a loaded machine cannot stretch it past the timeout.
        await asyncio.sleep(0)
        return "in time"

    options = {"concurrency": 1, "local_queue_horizon": math.inf}
    async with asyncio.timeout(30), worker(db, {"block": block, "quick": quick}, **options):
        await started.wait()
        waiting = f"select now() - locked_at > interval '0.6 s' from {JOBS} where id = %s"
        await until(lambda: value(db, waiting, (queued.id,)), what="a queued job past 0.6s")
        release.set()
        await until(lambda: ended(db, queued.id), what="the queued job")
    row = history(db, queued.id)
    assert (row["state"], row["result"], row["timed_out"]) == ("succeeded", "in time", False)
    assert history(db, blocker.id)["state"] == "succeeded"


# --- Stuck past the grace ------------------------------------------------------


@pytest.mark.db
async def test_a_stuck_plain_task_keeps_its_slot_and_lock_and_never_runs_twice(
    utils: WorkerUtils, db: str, caplog: Any
) -> None:
    job = await utils.add_job("deaf", {})
    started = threading.Event()
    stop = threading.Event()
    runs = Counter[int]()
    quick_ran: list[int] = []

    @task_options(timeout=0.2)  # on_stuck="wait"
    def deaf(payload: Any, helpers: Helpers) -> None:
        runs[helpers.job.id] += 1
        started.set()
        stop.wait(30)  # ignores helpers.cancelled
        raise RuntimeError("gave up")

    async def quick(payload: Any, helpers: Helpers) -> None:
        quick_ran.append(helpers.job.id)

    options = WorkerOptions(concurrency=2, timeout_grace=0.3, heartbeat_interval=0.1)
    pool = WorkerPool(db, make_task_list({"deaf": deaf, "quick": quick}), options)
    running = asyncio.create_task(pool.run())
    try:
        with caplog.at_level(logging.WARNING, logger="graphile_worker"):
            await asyncio.to_thread(started.wait)
            stuck = f"Job {job.id} is stuck: still running 0.3s after its timeout (0.2s)"
            await until(lambda: any(stuck in r.getMessage() for r in caplog.records))
        warning = next(r.getMessage() for r in caplog.records if stuck in r.getMessage())
        assert "it keeps its slot and its lock, and is never run twice" in warning
        assert "in deaf" in warning  # where its task is
        assert (job_row(db, job.id)["locked_by"], pool.stopping) == (pool.id, False)
        # Listed as stuck in the pool's heartbeat (the dashboard's) and its metric.
        await until(lambda: stuck_in_heartbeat(db, pool.id) == [job.id], what="the beat")
        assert pool.load.stuck == 1
        other = await utils.add_job("quick", {})  # the other slot goes on
        await until(lambda: quick_ran == [other.id], what="another job")
        assert pool.load.stuck == 1
        stop.set()
        await until(lambda: ended(db, job.id), what="the stuck job's end")
        assert pool.load.stuck == 0
        await until(lambda: stuck_in_heartbeat(db, pool.id) == [], what="the next beat")
    finally:
        stop.set()
        pool.stop()
        await running
    assert runs == {job.id: 1}
    row = job_row(db, job.id)  # on_timeout="retry": it runs again later
    assert (row["last_error"], row["attempts"], row["locked_by"]) == (
        "JobTimeout: exceeded 0.2s",
        1,
        None,
    )


STUCK_TASK = """\
import os
import threading

from worker_cli import task_options


@task_options(timeout=0.3, on_stuck="exit")
def task(payload, helpers):
    helpers.run(helpers.query(
        "insert into public.stuck_runs (job_id, pid, attempt) values (%s, %s, %s)",
        (helpers.job.id, os.getpid(), helpers.job.attempts),
    ))
    if helpers.job.attempts == 1:
        threading.Event().wait()  # ignores its timeout for ever
    return "second attempt"
"""

SLOW_TASK = """\
import asyncio
from pathlib import Path

GO = Path(__file__).parent.parent / "go"


async def task(payload, helpers):
    while not GO.exists():  # until the test says so
        await asyncio.sleep(0.02)
    return "finished"
"""


@pytest.mark.db
@pytest.mark.slow
async def test_a_stuck_plain_task_with_on_stuck_exit_stops_the_worker_with_code_75(
    utils: WorkerUtils, db: str, tmp_path: Path
) -> None:
    """The worker stops fetching, lets its other jobs finish and write their
    results, gives back the ones not started, and exits 75; the stuck job
    stays locked until another worker finds the pool dead, then runs again."""
    from worker_cli import run

    rows(db, "create table public.stuck_runs (job_id bigint, pid int, attempt int)")
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "stuck.py").write_text(STUCK_TASK)
    (tmp_path / "tasks" / "slow.py").write_text(SLOW_TASK)
    slow = await utils.add_job("slow", {})
    stuck = await utils.add_job("stuck", {})
    queued = await utils.add_job("slow", {}, priority=1)
    process = Worker(db, tmp_path, "-j", "2", "--timeout-grace", "0.3",
                     "--heartbeat-interval", "0.2", "--heartbeat-timeout", "1")  # fmt: skip
    try:
        await until(lambda: f"Job {stuck.id} is stuck" in process.log(), what="the stuck job")
        assert process.proc.poll() is None  # still running: the slow job holds it
        (tmp_path / "go").touch()  # the other job finishes
        assert await asyncio.to_thread(process.wait, 30) == 75, process.log()
    finally:
        kill_leftover_workers()
    log = process.log()
    assert "exits with code 75" in log and "in task" in log
    assert history(db, slow.id)["result"] == "finished"  # written before the exit
    left = job_row(db, stuck.id)  # still locked by the pool that is gone
    assert (left["attempts"], left["locked_by"] is not None) == (1, True)
    assert job_row(db, queued.id)["attempts"] == 0  # given back, not started
    # Another worker declares the pool dead (its own 1 s timeout) and runs the job.
    async with asyncio.timeout(30):
        runner = await run(db, task_directory=tmp_path / "tasks", no_handle_signals=True,
                           heartbeat_interval=0.2, heartbeat_timeout=1)  # fmt: skip
        try:
            done = f"select 1 from {HISTORY} where job_id = %s"
            await until(lambda: value(db, done, (stuck.id,)), within=20, what="its second run")
        finally:
            await runner.stop()
    assert history(db, stuck.id)["result"] == "second attempt"
    runs = rows(db, "select pid, attempt from public.stuck_runs order by attempt")
    assert runs == [{"pid": process.pid, "attempt": 1}, {"pid": os.getpid(), "attempt": 2}]


# --- Long jobs keep their locks ------------------------------------------------


@pytest.mark.db
@pytest.mark.parametrize("heartbeats", [True, False], ids=["heartbeat thread", "event loop"])
async def test_a_long_jobs_lock_is_refreshed_so_no_stale_sweep_releases_it(
    utils: WorkerUtils, db: str, heartbeats: bool
) -> None:
    """A job (and its named queue) locked five hours ago by a live pool is
    locked again, and the 4-hour sweep (Node's rule, and ours) spares it."""
    import psycopg

    from worker_cli.sql import compose
    from worker_cli.sql import fetch as fetch_sql

    job = await utils.add_job("long", {}, queue_name="q")
    started = asyncio.Event()
    release = asyncio.Event()
    runs = Counter[int]()

    async def long(payload: Any, helpers: Helpers) -> str:
        runs[helpers.job.id] += 1
        started.set()
        await release.wait()
        return "done"

    options = WorkerOptions(
        lock_refresh_age=timedelta(seconds=1),
        heartbeat_interval=0.1 if heartbeats else None,
        heartbeat_timeout=1,
    )
    pool = WorkerPool(db, make_task_list({"long": long}), options)
    running = asyncio.create_task(pool.run())
    queue_lock = "select locked_at from graphile_worker._private_job_queues where queue_name = 'q'"
    try:
        async with asyncio.timeout(30):
            await started.wait()
            rows(db, f"update {JOBS} set locked_at = now() - interval '5 hours'")
            rows(db, "update graphile_worker._private_job_queues set locked_at = now() - "
                     "interval '5 hours'")  # fmt: skip
            fresh = f"select locked_at > now() - interval '1 minute' from {JOBS} where id = %s"
            await until(lambda: value(db, fresh, (job.id,)), what="the job's lock refreshed")
            await until(lambda: value(db, queue_lock) > job_row(db, job.id)["created_at"])
            sweep = compose(fetch_sql.RELEASE_STALE_LOCKS, "graphile_worker")
            with psycopg.connect(db, autocommit=True) as conn:
                released = conn.execute(sweep, {"now": None, "lock_timeout": "4 hours"})
                assert released.fetchone() == (0, 0)
            assert job_row(db, job.id)["locked_by"] == pool.id
            release.set()
            await until(lambda: ended(db, job.id), what="the job's end")
    finally:
        release.set()
        pool.stop()
        await running
    assert runs == {job.id: 1}
    assert history(db, job.id)["result"] == "done"


# --- The README ----------------------------------------------------------------


@pytest.mark.db
def test_the_readmes_timeouts_example_runs_as_written(db: str, tmp_path: Path) -> None:
    import subprocess
    import sys

    from dbhelpers import cli_path
    from readme_blocks import app_env, blocks, write_files

    heading = "### Timeouts"
    files = write_files(heading, tmp_path)
    assert set(files) == {"tasks/render.py", "add_render.py"}
    assert set(write_files("### Results and history", tmp_path)) >= {"show_result.py"}
    [transcript] = blocks(heading, "text")
    lines = transcript.splitlines()
    env = app_env(db)

    def shell(line: str) -> subprocess.CompletedProcess[str]:
        command = line.removeprefix("$ ").split()
        command = [sys.executable, *command[1:]] if command[0] == "python" else command
        command = [cli_path(), *command[1:]] if command[0] == "graphile-worker" else command
        return subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
            check=False,
        )  # fmt: skip

    added = shell(lines[0])
    assert added.stdout.strip() == lines[1], added.stderr
    worked = shell(lines[2])
    assert worked.returncode == 0, worked.stderr
    shown = shell(lines[3])
    assert shown.stdout.strip() == lines[4], shown.stderr
