"""The guarantees of fetching ahead (the local queue) and batched results."""

from __future__ import annotations

import asyncio
import math
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dbhelpers import rows, value

from worker_cli import Helpers, Runner, WorkerUtils, run, run_once
from worker_cli.config.options import WorkerOptions
from worker_cli.sql import compose
from worker_cli.sql import fetch as fetch_sql
from worker_cli.worker.pipeline.fetcher import Fetcher

pytestmark = pytest.mark.db


async def test_priorities_are_respected_within_a_batch(utils: WorkerUtils, db: str) -> None:
    rng = random.Random(7)
    priorities = [rng.randint(-5, 5) for _ in range(60)]
    await utils.add_jobs(
        [{"identifier": "t", "payload": {"n": n}, "priority": p} for n, p in enumerate(priorities)]
    )
    ran: list[int] = []

    async def t(payload: dict[str, int], helpers: Helpers) -> None:
        ran.append(helpers.job.priority)

    # One slot and a local queue big enough to fetch everything in one batch.
    await run_once(
        db,
        task_list={"t": t},
        no_handle_signals=True,
        concurrency=1,
        local_queue_size=100,
        local_queue_horizon=math.inf,
    )
    assert ran == sorted(priorities)


async def test_a_fetch_never_locks_a_job_of_a_named_queue_it_does_not_hold(
    utils: WorkerUtils, db: str
) -> None:
    """Another fetch holding queue q must find every job of q unlocked.

    If a fetch locked job rows of q while another fetch held q, that fetch
    (skipping locked rows, as every fetch does) would take the second job of
    q before the first: q would run out of order.
    """
    await utils.add_jobs(
        [{"identifier": "t", "payload": {"n": n}, "queue_name": "q"} for n in range(5)]
        + [{"identifier": "t", "payload": {"n": n}} for n in range(5, 8)]
    )
    task_id = value(db, "select id from graphile_worker._private_tasks where identifier = 't'")
    with psycopg.connect(db) as holder, psycopg.connect(db) as fetcher:
        # A concurrent fetch, caught after it locked queue q.
        holder.execute(
            "select id from graphile_worker._private_job_queues where queue_name = 'q' for update"
        )
        fetched = fetcher.execute(
            compose(fetch_sql.GET_JOBS, "graphile_worker"),
            {"task_ids": [task_id], "forbidden_flags": None, "limit": 10, "pool_id": "p"},
        ).fetchall()
        # This fetch took the queue-less jobs only, and left q's rows alone.
        assert [row[1] for row in fetched] == [None, None, None]
        free = holder.execute(
            "select (payload->>'n')::int from graphile_worker._private_jobs "
            "where job_queue_id is not null order by id for update skip locked"
        ).fetchall()
        assert [n for (n,) in free] == [0, 1, 2, 3, 4]


CRASHING_WORKER = """
import asyncio, sys
from worker_cli import run
from worker_cli.worker.pipeline.fetcher import Fetcher
from worker_cli.worker.background.listener import Listener

# One line each time the fetcher decides how many jobs to fetch ("plan 0": none),
# and each time a notification comes in.
plan, notified = Fetcher._plan, Listener._notified


def reported_plan(self):
    count = plan(self)
    print("plan", count, flush=True)
    return count


def reported_notification(self, channel, payload):
    print("notified", channel, flush=True)
    notified(self, channel, payload)


Fetcher._plan, Listener._notified = reported_plan, reported_notification


async def slow(payload, helpers):
    await asyncio.sleep(60)

async def main():
    runner = await run(sys.argv[1], task_list={"slow": slow}, concurrency=3,
                       local_queue_size=7, local_queue_horizon=float("inf"))
    await runner

asyncio.run(main())
"""


def test_a_crashed_worker_holds_no_more_than_its_local_queue(db: str, tmp_path: Path) -> None:
    rows(
        db,
        "select graphile_worker.add_jobs(array(select"
        " ('slow', null, null, null, null, null, null, null)::graphile_worker.job_spec"
        " from generate_series(1, 50)))",
    )
    script = tmp_path / "worker.py"
    script.write_text(CRASHING_WORKER)
    proc = subprocess.Popen(
        [sys.executable, str(script), db],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def read(stream: Any) -> None:
        for line in stream:
            lines.put(line.strip())
        lines.put(None)

    threading.Thread(target=read, args=(proc.stdout,), daemon=True).start()

    def next_line(what: str) -> str:
        try:
            line = lines.get(timeout=30)
        except queue.Empty:
            raise AssertionError(f"timed out waiting for {what}") from None
        assert line is not None, proc.stderr.read() if proc.stderr else ""
        return line

    locked = "select count(*) from graphile_worker._private_jobs where locked_by is not null"
    try:
        # The fetcher fetches (3 running + 7 ahead), then decides to fetch
        # nothing more: any further fetch would have come before that decision.
        while (line := next_line("the fetcher to settle")) != "plan 0":
            assert value(db, locked) <= 10, line  # what the fetches before it locked
        assert value(db, locked) == 10
        # News of a new job makes it decide again: still nothing.
        rows(db, "select graphile_worker.add_job('slow')")
        while next_line("the notification") != "notified jobs:insert":
            pass
        while not (line := next_line("a decision after the notification")).startswith("plan"):
            pass
        assert line == "plan 0"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert value(db, locked) == 10  # 3 running + 7 fetched ahead, of 51
    # Attempts were counted only for those ten.
    assert value(db, "select count(*) from graphile_worker._private_jobs where attempts > 0") == 10


async def test_slow_jobs_are_not_hoarded_by_one_worker(utils: WorkerUtils, db: str) -> None:
    await utils.add_jobs([{"identifier": "slow", "payload": {"n": n}} for n in range(24)])
    ran_by: dict[str, int] = {}
    both_running = asyncio.Event()

    async def slow(payload: Any, helpers: Helpers) -> None:
        ran_by[helpers.job.locked_by or ""] = ran_by.get(helpers.job.locked_by or "", 0) + 1
        # No job ends before the second worker is up, however long its start takes.
        await both_running.wait()
        await asyncio.sleep(0.1)

    # Two workers with default settings: the first to start must not take the lot.
    first = await run(db, task_list={"slow": slow}, no_handle_signals=True, concurrency=2)
    second = await run(db, task_list={"slow": slow}, no_handle_signals=True, concurrency=2)
    both_running.set()
    deadline = time.monotonic() + 30
    while value(db, "select count(*) from graphile_worker._private_jobs") > 0:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    await first.stop()
    await second.stop()
    assert sum(ran_by.values()) == 24
    # Both workers ran jobs (two pool ids), and each a fair share (12 if perfectly even).
    assert len(ran_by) == 2 and set(ran_by) == {first.pool.id, second.pool.id}, ran_by
    assert min(ran_by.values()) >= 8, ran_by


async def _wait_until(condition: Any, within: float = 10) -> float:
    """Poll ``condition()`` until true; returns the time it took."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < within, "condition not met in time"
        await asyncio.sleep(0.01)
    return time.monotonic() - start


def _job_count(db: str, task: str) -> int:
    return int(
        value(
            db,
            "select count(*) from graphile_worker.jobs where task_identifier = %s",
            (task,),
        )
    )


@asynccontextmanager
async def _worker_kept_busy(
    utils: WorkerUtils, db: str, tasks: dict[str, Any], concurrency: int
) -> AsyncIterator[tuple[Runner, asyncio.Event]]:
    """A worker whose results may wait 5 s to be batched, kept busy by a running
    'slow' job until the event it yields is set."""
    release = asyncio.Event()

    async def slow(payload: Any, helpers: Helpers) -> None:
        await release.wait()

    await utils.add_job("slow")
    runner = await run(
        db,
        task_list={"slow": slow, **tasks},
        no_handle_signals=True,
        concurrency=concurrency,
        complete_job_batch_delay=5.0,
    )
    locked = "select count(*) from graphile_worker.jobs where locked_at is not null"
    try:
        await _wait_until(lambda: value(db, locked) == 1)
        yield runner, release
    finally:
        release.set()
        await runner.stop()


async def test_a_busy_pool_writes_a_result_after_the_batch_delay_and_at_stop(
    utils: WorkerUtils, db: str
) -> None:
    """While another job runs, a finished job's result waits (up to the batch
    delay) for others to join its write; a stop writes it without waiting."""
    finished = asyncio.Event()

    async def fast(payload: Any, helpers: Helpers) -> None:
        finished.set()

    async with _worker_kept_busy(utils, db, {"fast": fast}, 2) as (runner, release):
        await utils.add_job("fast")
        await asyncio.wait_for(finished.wait(), 10)
        await asyncio.sleep(0.3)
        assert _job_count(db, "fast") == 1  # finished, its result still waiting
        stopping = asyncio.ensure_future(runner.stop())
        # Written at once, while the slow job is still running.
        assert await _wait_until(lambda: _job_count(db, "fast") == 0) < 2.5
        assert _job_count(db, "slow") == 1
        release.set()
        await stopping
    assert _job_count(db, "slow") == 0


async def test_an_idle_pool_writes_a_result_at_once(utils: WorkerUtils, db: str) -> None:
    finished = asyncio.Event()

    async def fast(payload: Any, helpers: Helpers) -> None:
        finished.set()

    runner = await run(
        db, task_list={"fast": fast}, no_handle_signals=True, complete_job_batch_delay=5.0
    )
    try:
        await utils.add_job("fast")
        await asyncio.wait_for(finished.wait(), 10)
        # Nothing else runs or waits: no reason to hold the result back.
        assert await _wait_until(lambda: _job_count(db, "fast") == 0) < 2.5
    finally:
        await runner.stop()


async def test_a_named_queue_job_result_is_not_held_back(utils: WorkerUtils, db: str) -> None:
    """A named queue stays locked until its running job's result is written:
    that write does not wait for the batch delay, or the queue would run one
    job per delay."""
    ran: list[int] = []

    async def queued(payload: dict[str, int], helpers: Helpers) -> None:
        ran.append(payload["n"])

    async with _worker_kept_busy(utils, db, {"queued": queued}, 3):
        await utils.add_jobs(
            [{"identifier": "queued", "payload": {"n": n}, "queue_name": "q"} for n in range(3)]
        )
        # Three jobs one after another in the queue, while the pool stays busy.
        assert await _wait_until(lambda: _job_count(db, "queued") == 0) < 4
        assert ran == [0, 1, 2]


async def test_a_backlog_is_fetched_in_full_batches_within_a_few_fetches(
    utils: WorkerUtils, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fetching ahead follows the rate jobs finish at: a backlog of fast jobs
    must reach fetches of the whole local queue quickly, not after thousands
    of jobs fetched a dozen at a time. What "the whole" is depends on the
    machine (rate x the default horizon, 500 ms: a loaded machine finishing
    400 trivial jobs a second rightly holds 200 ahead), so the bound is the
    drain's own rate's."""
    rows(
        db,
        "select graphile_worker.add_jobs(array(select"
        " ('noop', null, null, null, null, null, null, null)::graphile_worker.job_spec"
        " from generate_series(1, 5000)))",
    )
    limits: list[int] = []
    fetch = Fetcher.fetch

    async def counting_fetch(self: Fetcher, limit: int) -> int:
        limits.append(limit)
        return await fetch(self, limit)

    monkeypatch.setattr(Fetcher, "fetch", counting_fetch)

    async def noop(payload: Any, helpers: Helpers) -> None:
        pass

    started = time.monotonic()
    await run_once(
        db, task_list={"noop": noop}, no_handle_signals=True, concurrency=10, local_queue_size=500
    )
    rate = 5000 / (time.monotonic() - started)
    assert value(db, "select count(*) from graphile_worker.jobs") == 0
    # A fetch asks for the idle slots plus up to 500 ahead (rate x horizon),
    # less what is buffered: within 15 fetches, at least half of that.
    target = min(500, rate * WorkerOptions().local_queue_horizon)
    assert max(limits[:15]) >= target / 2, (limits[:15], round(rate))


def _at_each_locking_commit(name: str, body: str) -> str:
    """SQL: a deferred constraint trigger ``name`` that runs ``body`` (plpgsql)
    at the commit of every transaction that locked a job."""
    return f"""
      create function {name}() returns trigger language plpgsql as $$
      begin
        {body}
        return null;
      end $$;
      create constraint trigger {name}
        after update on graphile_worker._private_jobs
        deferrable initially deferred
        for each row when (new.locked_by is not null)
        execute function {name}();
    """


# Refuses the first such commit (a sequence, so the refusal itself is not
# rolled back).
REFUSE_FIRST_LOCKING_COMMIT = "create sequence test_locking_commits;" + _at_each_locking_commit(
    "test_refuse_first_locking_commit",
    "if nextval('test_locking_commits') = 1 then raise exception 'commit refused by the test'; "
    "end if;",
)

# Kills the session of the first such commit in the middle of it: the
# connection drops and the locks roll back.
KILL_FIRST_LOCKING_COMMIT = "create sequence test_locking_commits;" + _at_each_locking_commit(
    "test_kill_first_locking_commit",
    "if nextval('test_locking_commits') = 1 then "
    "perform pg_terminate_backend(pg_backend_pid()); perform pg_sleep(10); end if;",
)


@pytest.mark.parametrize("fault", ["refused", "killed"])
async def test_a_fetch_whose_commit_fails_starts_no_job(
    utils: WorkerUtils, db: str, caplog: pytest.LogCaptureFixture, fault: str
) -> None:
    """If a fetch's commit fails (refused, or its connection killed in the middle
    of it), its locks roll back and any other worker may take the jobs: none of
    them may run then. The fetch is retried, and each job runs once, its row
    locked by its pool while it runs."""
    rows(db, REFUSE_FIRST_LOCKING_COMMIT if fault == "refused" else KILL_FIRST_LOCKING_COMMIT)
    await utils.add_jobs([{"identifier": "t", "payload": {"n": n}} for n in range(3)])
    ran: list[tuple[int, str | None]] = []

    async def t(payload: dict[str, int], helpers: Helpers) -> None:
        # What any other worker sees of this job's row while it runs.
        [row] = await helpers.query(
            "select locked_by from graphile_worker._private_jobs where id = %s", (helpers.job.id,)
        )
        ran.append((payload["n"], helpers.job.locked_by, row["locked_by"]))

    caplog.set_level("INFO")
    await run_once(db, task_list={"t": t}, no_handle_signals=True, concurrency=2)
    # The fault happened: the first locking commit failed (one row seen by the
    # trigger, 1), then each job's lock committed once (2, 3, 4).
    assert value(db, "select nextval('test_locking_commits')") == 5
    # Each once, its row locked by the pool that ran it (checked here, not in
    # the task, where a failed assertion would only fail the job).
    assert sorted(n for n, _, _ in ran) == [0, 1, 2], ran
    assert all(mine is not None and seen == mine for _, mine, seen in ran), ran
    assert value(db, "select count(*) from graphile_worker.jobs") == 0
    assert any("Failed to fetch jobs" in r.getMessage() for r in caplog.records)


async def test_a_named_queue_job_never_starts_before_its_lock_is_committed(
    utils: WorkerUtils, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    rows(db, REFUSE_FIRST_LOCKING_COMMIT)
    await utils.add_job("t", {"n": 0}, queue_name="serial", priority=-1)
    await utils.add_job("t", {"n": 1})
    ran: list[int] = []

    async def t(payload: dict[str, int], helpers: Helpers) -> None:
        ran.append(payload["n"])

    caplog.set_level("INFO")
    await run_once(db, task_list={"t": t}, no_handle_signals=True, concurrency=2)
    # The fault happened: the first locking commit was refused (one row seen
    # by the trigger, 1), then each job's lock committed once (2, 3).
    assert value(db, "select nextval('test_locking_commits')") == 4
    assert any("Failed to fetch jobs" in r.getMessage() for r in caplog.records)
    # The first job in order is in a named queue: nothing started before the
    # (refused) commit, and each job ran once after the fetch was retried.
    assert sorted(ran) == [0, 1]


# Makes every such commit take 0.3 s, and records when it ends (database time;
# committed with the fetch).
SLOW_LOCKING_COMMIT = "create table test_commit_ends (at float8);" + _at_each_locking_commit(
    "test_slow_locking_commit",
    "perform pg_sleep(0.3); "
    "insert into test_commit_ends values (extract(epoch from clock_timestamp()));",
)


async def test_a_job_starts_only_after_its_lock_is_committed(utils: WorkerUtils, db: str) -> None:
    """An idle worker's job starts once the fetch that locked it has committed,
    never while that commit is on its way (it could still fail)."""
    rows(db, SLOW_LOCKING_COMMIT)
    await utils.add_job("t")
    started: list[float] = []

    async def t(payload: Any, helpers: Helpers) -> None:
        started.append(time.time())  # the task's first statement, before any query

    await run_once(db, task_list={"t": t}, no_handle_signals=True)
    [commit_end] = [r["at"] for r in rows(db, "select at from test_commit_ends")]
    assert started[0] >= commit_end, started[0] - commit_end


async def test_a_job_failing_right_after_its_fetch_commits_has_its_failure_recorded(
    utils: WorkerUtils, db: str
) -> None:
    """A failure is written only where this pool holds the lock: a job failing
    at once must find its row locked by its pool."""
    rows(db, SLOW_LOCKING_COMMIT)
    await utils.add_job("fails")

    async def fails(payload: Any, helpers: Helpers) -> None:
        raise RuntimeError("boom")

    await run_once(db, task_list={"fails": fails}, no_handle_signals=True)
    [job] = rows(db, "select attempts, last_error, locked_at from graphile_worker._private_jobs")
    assert job == {"attempts": 1, "last_error": "RuntimeError: boom", "locked_at": None}


async def test_a_task_sees_its_own_job_locked(utils: WorkerUtils, db: str) -> None:
    """A task's helpers see its row locked by its pool (a unique job added with
    ``until="start"`` reads that state)."""
    rows(db, SLOW_LOCKING_COMMIT)
    await utils.add_job("look")
    seen: dict[str, Any] = {}

    async def look(payload: Any, helpers: Helpers) -> None:
        [seen["row"]] = await helpers.query(
            "select locked_by, attempts from graphile_worker._private_jobs where id = %s",
            (helpers.job.id,),
        )
        seen["pool"] = helpers.job.locked_by

    await run_once(db, task_list={"look": look}, no_handle_signals=True)
    assert seen["row"] == {"locked_by": seen["pool"], "attempts": 1}
