"""Poison jobs and poison tasks: no single job or task may hold up, strand or
re-run another job, or keep the worker from stopping.

Each test mixes one kind of bad job into innocent ones and checks what a user
sees: every innocent job ran exactly once and its row is gone, the bad job
failed on its own with a clear ``last_error``, nothing stays locked, and the
worker stopped when told.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections import Counter
from typing import Any

import pytest
from dbhelpers import rows, value
from psycopg_pool import AsyncConnectionPool
from workers import worker

from worker_cli import Cancel, Helpers, RetryPolicy, Snooze, WorkerUtils, run_once, task_options
from worker_cli.jobs.last_error import describe
from worker_cli.worker.pipeline.outcome import Failure
from worker_cli.worker.pipeline.result_writer import ResultWriter

pytestmark = pytest.mark.db

#: Seconds within which a drain of a handful of jobs must be over (a bound
#: that only a stuck worker reaches).
WITHIN = 20.0


def add(db: str, sql_args: str) -> int:
    """Add a job through SQL's add_job (as a trigger or Node would); its id."""
    job_id = value(db, f"select id from graphile_worker.add_job({sql_args})")
    assert isinstance(job_id, int)
    return job_id


def left(db: str) -> list[dict[str, Any]]:
    return rows(
        db,
        "select j.id, t.identifier as task_identifier, j.payload::text as payload, j.attempts, "
        "j.max_attempts, j.last_error, j.locked_by, j.locked_at "
        "from graphile_worker._private_jobs as j "
        "join graphile_worker._private_tasks as t on t.id = j.task_id order by j.id",
    )


async def drain(db: str, tasks: dict[str, Any], **options: Any) -> int:
    """``run_once`` with a bound: a worker that never stops fails the test."""
    options.setdefault("no_handle_signals", True)
    async with asyncio.timeout(WITHIN):
        return await run_once(db, task_list=tasks, **options)


def innocent(ran: Counter[int]) -> Any:
    async def task(payload: Any, helpers: Helpers) -> None:
        ran[helpers.job.id] += 1

    return task


# --- 1. results PostgreSQL would refuse ---------------------------------------------


async def test_a_batch_jobs_failed_items_go_back_as_they_were_stored(db: str) -> None:
    # 1e400 is JSON that PostgreSQL stores as written; Python reads it as
    # float('inf'), which json.dumps writes as Infinity: not JSON.
    batch = add(db, "'batch', '[1e400, 2, 0.10, {\"a\": 1e400}]'::json, max_attempts := 3")
    ran: Counter[int] = Counter()
    others = [add(db, f"'good', '{{\"n\": {n}}}'") for n in range(5)]

    async def batch_task(payload: list[Any], helpers: Helpers) -> list[Any]:
        return [ValueError("first"), None, ValueError("third"), ValueError("fourth")]

    assert await drain(db, {"batch": batch_task, "good": innocent(ran)}) == 0
    assert ran == Counter(others)
    [row] = left(db)
    assert row["id"] == batch and row["locked_by"] is None and row["attempts"] == 1
    # The failed items exactly as they were added: no number rewritten.
    assert row["payload"] == '[1e400, 0.10, {"a": 1e400}]'
    assert "Batch failures (3 of 4 items)" in row["last_error"]


async def test_a_result_postgres_refuses_fails_that_job_alone(db: str, caplog: Any) -> None:
    # A user's trigger refuses one job's failure: a real refusal by the server.
    rows(
        db,
        """
        create function public.refuse_poison() returns trigger language plpgsql as $$
        begin
          if new.last_error like '%poison-pill%' then
            raise exception 'this error message is refused';
          end if;
          return new;
        end $$;
        create trigger refuse_poison before update on graphile_worker._private_jobs
        for each row execute function public.refuse_poison();
        """,
    )
    poison = add(db, "'poison', '{}'::json, max_attempts := 5")
    ran: Counter[int] = Counter()
    others = [add(db, f"'good', '{{\"n\": {n}}}', queue_name := 'q{n % 2}'") for n in range(6)]

    async def poison_task(payload: Any, helpers: Helpers) -> None:
        raise ValueError("poison-pill")

    with caplog.at_level(logging.WARNING, logger="graphile_worker"):
        assert await drain(db, {"poison": poison_task, "good": innocent(ran)}) == 0
    assert ran == Counter(others)
    [row] = left(db)
    assert row["id"] == poison and row["locked_by"] is None
    # Failed for good (reschedule_jobs revives it), saying why.
    assert row["attempts"] == row["max_attempts"] == 5
    assert row["last_error"].startswith("the worker could not record this job's failure")
    assert "this error message is refused" in row["last_error"]
    assert (
        value(
            db,
            "select count(*) from graphile_worker._private_job_queues where locked_by is not null",
        )
        == 0
    )
    assert any(
        "could not record" in r.getMessage() and str(poison) in r.getMessage()
        for r in caplog.records
    )


async def test_a_success_postgres_refuses_to_record_fails_that_job_alone(db: str) -> None:
    rows(
        db,
        """
        create function public.keep_row() returns trigger language plpgsql as $$
        begin
          if old.payload::text like '%keep-me%' then
            raise exception 'this job may not be deleted';
          end if;
          return old;
        end $$;
        create trigger keep_row before delete on graphile_worker._private_jobs
        for each row execute function public.keep_row();
        """,
    )
    kept = add(db, "'good', '{\"keep-me\": true}'::json")
    ran: Counter[int] = Counter()
    others = [add(db, f"'good', '{{\"n\": {n}}}'") for n in range(5)]
    assert await drain(db, {"good": innocent(ran)}) == 0
    assert ran == Counter([kept, *others])
    [row] = left(db)
    assert row["id"] == kept and row["locked_by"] is None
    assert row["attempts"] == row["max_attempts"]
    assert row["last_error"].startswith("the worker could not record this job's success")


async def test_a_huge_error_message_is_stored_cut_short(db: str) -> None:
    job = add(db, "'huge', '{}'::json")

    def huge(payload: Any, helpers: Helpers) -> None:
        raise ValueError("x" * 5_000_000 + "\x00")

    assert await drain(db, {"huge": huge}) == 0
    [row] = left(db)
    assert row["id"] == job and row["locked_by"] is None
    assert row["last_error"].startswith("ValueError: xxx")
    assert len(row["last_error"]) < 70_000
    assert row["last_error"].endswith("... (cut short: 5000013 characters in all)")


# --- 2. rows the fetcher cannot read ------------------------------------------------


#: JSON PostgreSQL accepts and no Python can read: nested deeper than Python's
#: json reads (3.11 and 3.12 stop near 1,000 levels, 3.13 at 9,999), within what
#: PostgreSQL's json takes with its default 2 MB stack (about 14,000).
UNREADABLE_PAYLOADS = {
    "deep": "(repeat('[', 12000) || repeat(']', 12000))::json",
    "digits": "('[' || repeat('7', 5000) || ']')::json",
}


@pytest.mark.parametrize("kind", sorted(UNREADABLE_PAYLOADS))
async def test_a_payload_python_cannot_read_fails_its_job_alone(db: str, kind: str) -> None:
    ran: Counter[int] = Counter()
    before = [add(db, f"'good', '{{\"n\": {n}}}'") for n in range(3)]
    bad = add(db, f"'good', {UNREADABLE_PAYLOADS[kind]}, max_attempts := 4")
    after = [add(db, f"'good', '{{\"n\": {n}}}', queue_name := 'q'") for n in range(3)]
    assert await drain(db, {"good": innocent(ran)}) == 0
    assert ran == Counter(before + after)
    [row] = left(db)
    assert row["id"] == bad and row["locked_by"] is None
    # No retry can read it either: failed for good at once.
    assert row["attempts"] == row["max_attempts"] == 4
    assert row["last_error"].startswith("UnreadableJobError: payload: cannot be read")
    assert (
        value(
            db,
            "select count(*) from graphile_worker._private_job_queues where locked_by is not null",
        )
        == 0
    )


@pytest.mark.parametrize("kind", sorted(UNREADABLE_PAYLOADS))
async def test_an_unreadable_payload_under_a_limit_fails_its_job_alone(db: str, kind: str) -> None:
    """The same through the fetch of limited jobs (py_fetch_limited_jobs), with
    a limit partitioned by a payload field the poison payload cannot give."""
    rows(
        db,
        "select graphile_worker.py_set_limit('task', 'good', max_running => 5, "
        "max_starts => 1000, period => '1 second', partition_by => 'n')",
    )
    ran: Counter[int] = Counter()
    before = [add(db, f"'good', '{{\"n\": {n}}}'") for n in range(3)]
    bad = add(db, f"'good', {UNREADABLE_PAYLOADS[kind]}, max_attempts := 4")
    after = [add(db, f"'good', '{{\"n\": {n}}}', queue_name := 'q'") for n in range(3)]
    assert await drain(db, {"good": innocent(ran)}) == 0
    assert ran == Counter(before + after)
    [row] = left(db)
    assert row["id"] == bad and row["locked_by"] is None
    assert row["attempts"] == row["max_attempts"] == 4
    assert row["last_error"].startswith("UnreadableJobError: payload: cannot be read")


@pytest.mark.parametrize("run_at", ["-infinity", "0044-03-15 BC"])
async def test_a_job_due_before_year_1_runs(db: str, run_at: str) -> None:
    ran: Counter[int] = Counter()
    jobs = [add(db, f"'good', '{{\"n\": {n}}}'") for n in range(3)]
    early = add(db, f"'good', '{{}}'::json, run_at := '{run_at}'")
    seen: list[Any] = []

    async def task(payload: Any, helpers: Helpers) -> None:
        ran[helpers.job.id] += 1
        if helpers.job.id == early:
            seen.append(helpers.job.run_at)

    assert await drain(db, {"good": task}) == 0
    assert ran == Counter([*jobs, early])
    assert left(db) == []
    # The earliest time Python has, in UTC.
    assert [str(t) for t in seen] == ["0001-01-01 00:00:00+00:00"]


# --- 3. a task raising CancelledError ----------------------------------------------------


async def test_a_task_raising_cancelled_error_fails_only_its_job(db: str) -> None:
    bad = [add(db, "'cancelled', '{}'::json, priority := -1") for _ in range(4)]
    ran: Counter[int] = Counter()
    good = [add(db, f"'good', '{{\"n\": {n}}}'") for n in range(6)]

    async def cancelled(payload: Any, helpers: Helpers) -> None:
        sub = asyncio.ensure_future(asyncio.sleep(10))
        asyncio.get_running_loop().call_soon(sub.cancel)
        await sub  # someone cancelled the sub-task: CancelledError here

    assert await drain(db, {"cancelled": cancelled, "good": innocent(ran)}, concurrency=4) == 0
    assert ran == Counter(good)
    failed = left(db)
    assert [row["id"] for row in failed] == bad
    assert {row["last_error"] for row in failed} == {"CancelledError"}
    assert {row["locked_by"] for row in failed} == {None}


async def test_a_stop_still_ends_a_task_awaiting_for_ever(db: str) -> None:
    """The worker's own cancellation (a forced stop) is not mistaken for the task's."""
    add(db, "'forever', '{}'::json")
    started = asyncio.Event()

    async def forever(payload: Any, helpers: Helpers) -> None:
        started.set()
        await asyncio.Event().wait()

    async with asyncio.timeout(WITHIN):
        async with worker(db, {"forever": forever}, graceful_shutdown_timeout=0.1) as runner:
            await started.wait()
            runner.force_stop()
            await runner
    [row] = left(db)
    assert row["last_error"] == "RuntimeError: the worker was stopped while the job was running"


# --- 4. a forked child must never carry on as the worker --------------------------------


async def test_a_forked_child_that_exits_never_runs_worker_code(db: str) -> None:
    ran: Counter[int] = Counter()
    fork = add(db, "'fork', '{}'::json")
    good = [add(db, f"'good', '{{\"n\": {n}}}'") for n in range(3)]
    statuses: list[int] = []

    def fork_task(payload: Any, helpers: Helpers) -> None:
        pid = os.fork()
        if pid == 0:
            raise SystemExit(7)  # the child "exits", as sys.exit(7) would
        _, status = os.waitpid(pid, 0)  # a child that carried on would never end
        statuses.append(os.waitstatus_to_exitcode(status))

    async with asyncio.timeout(WITHIN):
        # waitpid blocks the task's thread, never the loop.
        assert await drain(db, {"fork": fork_task, "good": innocent(ran)}) == 0
    assert statuses == [7]
    assert ran == Counter(good)
    assert left(db) == []
    assert fork not in ran


async def test_a_forked_child_that_returns_exits_with_0(db: str) -> None:
    add(db, "'fork', '{}'::json")
    statuses: list[int] = []

    def fork_task(payload: Any, helpers: Helpers) -> None:
        pid = os.fork()
        if pid == 0:
            return  # the child returns from the task
        _, status = os.waitpid(pid, 0)
        statuses.append(os.waitstatus_to_exitcode(status))

    assert await drain(db, {"fork": fork_task}) == 0
    assert statuses == [0]
    assert left(db) == []


# --- 6. weak points ----------------------------------------------------------------------


async def test_a_returned_coroutine_is_awaited(db: str) -> None:
    add(db, "'plain', '{}'::json")
    add(db, "'nested', '{}'::json")
    awaited: list[str] = []

    async def later(name: str) -> None:
        await asyncio.sleep(0)
        awaited.append(name)

    def plain(payload: Any, helpers: Helpers) -> Any:
        return later("plain")  # a plain def returning a coroutine

    async def nested(payload: Any, helpers: Helpers) -> Any:
        return later("nested")

    assert await drain(db, {"plain": plain, "nested": nested}) == 0
    assert sorted(awaited) == ["nested", "plain"]
    assert left(db) == []


async def test_a_returned_coroutine_that_raises_fails_the_job(db: str) -> None:
    add(db, "'plain', '{}'::json")

    async def boom() -> None:
        raise ValueError("raised by the returned coroutine")

    def plain(payload: Any, helpers: Helpers) -> Any:
        return boom()

    assert await drain(db, {"plain": plain}) == 0
    [row] = left(db)
    assert row["last_error"] == "ValueError: raised by the returned coroutine"


async def test_a_task_blocking_the_event_loop_is_named(db: str, caplog: Any) -> None:
    job = add(db, "'blocker', '{}'::json")

    async def blocker(payload: Any, helpers: Helpers) -> None:
        import time

        time.sleep(1.6)  # noqa: ASYNC251  (the point: it blocks every job of the worker)

    with caplog.at_level(logging.WARNING, logger="graphile_worker"):
        assert await drain(db, {"blocker": blocker}) == 0
    warnings = [r.getMessage() for r in caplog.records if "event loop" in r.getMessage()]
    assert warnings, "no warning about the blocked event loop"
    assert f"job {job} (blocker" in warnings[0]


async def test_a_nul_in_an_error_goes_escaped_into_the_log(utils: WorkerUtils, db: str) -> None:
    await utils.add_job("nul", {})
    handler_lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            handler_lines.append(self.format(record))

    from worker_cli.observe.log_output import TEXT_FORMAT

    handler = Collect()
    handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    log = logging.getLogger("graphile_worker")
    log.addHandler(handler)
    try:

        def nul(payload: Any, helpers: Helpers) -> None:
            raise ValueError("before\x00after")

        assert await drain(db, {"nul": nul}) == 0
    finally:
        log.removeHandler(handler)
    text = "\n".join(handler_lines)
    assert "before\\x00after" in text
    assert "\x00" not in text


LEFT_THREAD_TASK = """\
import threading


async def task(payload, helpers):
    # Started from the event loop's thread: not a daemon thread.
    threading.Thread(target=threading.Event().wait, name="left-behind").start()
"""


def test_a_thread_left_running_by_a_task_neither_keeps_the_worker_nor_goes_unnamed(
    db: str, tmp_path: Any
) -> None:
    from dbhelpers import run_cli

    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "leaves.py").write_text(LEFT_THREAD_TASK)
    add(db, "'leaves', '{}'::json")
    done = run_cli("-c", db, "--once", cwd=tmp_path, timeout=WITHIN)
    assert done.returncode == 0, done.stderr
    assert "Thread(s) 'left-behind', left running by a task, did not end" in done.stderr
    assert left(db) == []


# --- 5. what runs on a job's behalf after its task ---------------------------------------
# (issue 41: its outcome's classification, its result's encoding, its cancel
# reason, its retry policy's backoff; tests/db/test_job_boundary.py runs every
# such seam with every kind of exception, in a worker process.)

HISTORY = "graphile_worker._private_py_job_history"


def style(function: Any, plain: bool) -> Any:
    """``function`` (an ``async def`` task) as a plain ``def`` task if ``plain``."""
    if not plain:
        return function

    def plain_task(payload: Any, helpers: Helpers) -> Any:
        return asyncio.run(function(payload, helpers))

    return plain_task


class SnoozeWithoutInit(Snooze):
    def __init__(self) -> None:  # never calls Snooze.__init__: no .seconds
        pass


class CancelWithoutInit(Cancel):
    def __init__(self) -> None:  # no .reason
        pass


@pytest.mark.parametrize("plain", [False, True], ids=["async", "plain"])
@pytest.mark.parametrize("signal", [SnoozeWithoutInit, CancelWithoutInit])
async def test_a_task_signal_without_its_init_fails_its_job_alone(
    db: str, signal: type[BaseException], plain: bool
) -> None:
    bad = add(db, "'bad', '{}'::json, max_attempts := 3")
    ran: Counter[int] = Counter()
    good = [add(db, f"'good', '{{\"n\": {n}}}'") for n in range(4)]

    async def bad_task(payload: Any, helpers: Helpers) -> None:
        raise signal()

    assert await drain(db, {"bad": style(bad_task, plain), "good": innocent(ran)}) == 0
    assert ran == Counter(good)
    [row] = left(db)
    assert row["id"] == bad and row["locked_by"] is None and row["attempts"] == 1
    name = signal.__name__
    assert row["last_error"].startswith(f"{name}; then the worker could not act on the {name}")
    assert "AttributeError" in row["last_error"]


class ItemsRaise(dict[str, Any]):
    def __init__(self, error: BaseException) -> None:
        super().__init__(a=1)
        self.error = error

    def items(self) -> Any:
        raise self.error


@pytest.mark.parametrize("plain", [False, True], ids=["async", "plain"])
@pytest.mark.parametrize("error", [KeyError("boom"), SystemExit(3)], ids=["KeyError", "SystemExit"])
async def test_a_result_whose_encoding_raises_leaves_the_success_without_it(
    db: str, error: BaseException, plain: bool
) -> None:
    job = add(db, "'odd', '{}'::json")
    ran: Counter[int] = Counter()
    good = [add(db, f"'good', '{{\"n\": {n}}}'") for n in range(4)]

    async def odd(payload: Any, helpers: Helpers) -> Any:
        return ItemsRaise(error)

    assert await drain(db, {"odd": style(odd, plain), "good": innocent(ran)}) == 0
    assert ran == Counter(good)
    assert left(db) == []
    [kept] = rows(
        db, f"select state, result, result_error from {HISTORY} where job_id = %s", (job,)
    )
    assert kept["state"] == "succeeded" and kept["result"] is None
    assert kept["result_error"] == f"not JSON: {describe(error)}"


@pytest.mark.parametrize(
    ("reason", "stored"),
    [
        (ValueError("card declined"), "ValueError: card declined"),
        ({"code": 7}, "{'code': 7}"),
        ("nul\x00here", "nul\\x00here"),
        ("lone \ud800 surrogate", "lone \\ud800 surrogate"),
    ],
    ids=["exception", "dict", "nul", "surrogate"],
)
async def test_a_cancel_reason_psycopg_cannot_send_is_stored_as_text(
    db: str, reason: Any, stored: str
) -> None:
    job = add(db, "'cancels', '{}'::json")
    ran: Counter[int] = Counter()
    good = [add(db, f"'good', '{{\"n\": {n}}}'") for n in range(4)]

    async def cancels(payload: Any, helpers: Helpers) -> None:
        raise Cancel(reason)

    assert await drain(db, {"cancels": cancels, "good": innocent(ran)}) == 0
    assert ran == Counter(good)
    assert left(db) == []
    [record] = rows(db, f"select state, cancel_reason from {HISTORY} where job_id = %s", (job,))
    assert record == {"state": "cancelled", "cancel_reason": stored}


@pytest.mark.parametrize(
    "error",
    [SystemExit(2), asyncio.CancelledError(), KeyError("k")],
    ids=["SystemExit", "CancelledError", "KeyError"],
)
async def test_a_backoff_raising_anything_falls_back_to_graphile_workers(
    db: str, error: BaseException
) -> None:
    def backoff(job: Any, exc: BaseException) -> float:
        raise error

    @task_options(retry=RetryPolicy(backoff=backoff))
    async def flaky(payload: Any, helpers: Helpers) -> None:
        raise ValueError("flaky")

    job = add(db, "'flaky', '{}'::json, max_attempts := 3")
    ran: Counter[int] = Counter()
    good = [add(db, f"'good', '{{\"n\": {n}}}'") for n in range(4)]
    assert await drain(db, {"flaky": flaky, "good": innocent(ran)}) == 0
    assert ran == Counter(good)
    [row] = left(db)
    assert row["id"] == job and row["locked_by"] is None and row["attempts"] == 1
    assert row["last_error"] == "ValueError: flaky"
    # graphile-worker's own backoff: exp(1) s after the attempt.
    delay = value(db, "select extract(epoch from run_at - now()) from graphile_worker.jobs")
    assert 0 < delay <= math.exp(1)


@pytest.mark.parametrize(
    "reason", ["nul\x00", "lone \ud800", ValueError("not text")], ids=["nul", "surrogate", "object"]
)
async def test_a_value_the_client_library_refuses_fails_its_job_alone(
    utils: WorkerUtils, db: str, reason: Any
) -> None:
    """The result writer's own isolation, below the Settler's checks: a cancel
    reason psycopg refuses to send (it never reaches the server, so it has no
    SQLSTATE) fails its job for good; the rest of the batch is written."""
    jobs = await utils.add_jobs([{"identifier": "t", "payload": {"n": n}} for n in range(5)])
    rows(
        db,
        "update graphile_worker._private_jobs set locked_by = 'pool-w', locked_at = now(),"
        " attempts = 1 returning 1",
    )
    bad = Failure(jobs[2], "worker-1", Cancel("x"), "Cancel: x")
    bad.permanent = bad.cancel = True
    bad.cancel_reason = reason  # as if unchecked
    others = [Failure(job, "worker-1", ValueError("boom"), "ValueError: boom") for job in jobs]
    del others[2]
    async with AsyncConnectionPool(db, min_size=1, max_size=2) as pool:
        writer = ResultWriter(pool, schema="graphile_worker", pool_id="pool-w", history=None)
        async with asyncio.timeout(WITHIN):
            await writer.write([], [*others[:2], bad, *others[2:]])
    states = {
        row["id"]: row
        for row in rows(
            db,
            "select id, attempts, max_attempts, last_error, locked_by "
            "from graphile_worker._private_jobs",
        )
    }
    assert {job_id: row["locked_by"] for job_id, row in states.items()} == dict.fromkeys(
        [job.id for job in jobs], None
    )
    for failure in others:
        assert states[failure.job.id]["last_error"] == "ValueError: boom"
        assert states[failure.job.id]["attempts"] == 1
    refused = states[jobs[2].id]
    assert refused["attempts"] == refused["max_attempts"]
    assert refused["last_error"].startswith(
        "the worker could not record this job's failure: it could not be sent to PostgreSQL ("
    )
