"""Plain ``def`` tasks in their slots' threads: each job once, at most -j at a
time, in queue order, each in a fresh context; abort_signal and a forced stop
still reach them."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import threading
import time
from typing import Any

import pytest
from dbhelpers import rows, value
from workers import Recorder, until

from worker_cli import Events, Helpers, WorkerUtils, run, run_once

pytestmark = pytest.mark.db

LEFT = "select count(*) from graphile_worker._private_jobs"


async def test_each_plain_job_runs_once_and_never_more_than_j_at_a_time(
    utils: WorkerUtils, db: str
) -> None:
    count = 400
    await utils.add_jobs([{"identifier": "plain", "payload": {"n": n}} for n in range(count)])
    lock = threading.Lock()
    ran: list[int] = []
    running = 0
    most = 0

    def plain(payload: Any, helpers: Helpers) -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.001)  # overlap with the other threads
        with lock:
            running -= 1
            ran.append(payload["n"])

    assert (
        await run_once(db, task_list={"plain": plain}, no_handle_signals=True, concurrency=4) == 0
    )
    assert sorted(ran) == list(range(count))
    assert most == 4
    assert value(db, LEFT) == 0


async def test_plain_and_async_jobs_run_in_queue_order_in_one_slot(
    utils: WorkerUtils, db: str
) -> None:
    # One slot: a thread that takes the jobs after its own must not skip an
    # async job, nor run a plain job of lower priority before it.
    kinds = ["plain", "plain", "async", "plain", "async", "async", "plain", "plain"]
    for n, kind in enumerate(kinds):
        await utils.add_job(kind, {"n": n}, priority=n)
    ran: list[int] = []

    def plain(payload: Any, helpers: Helpers) -> None:
        ran.append(payload["n"])

    async def async_(payload: Any, helpers: Helpers) -> None:
        ran.append(payload["n"])

    await run_once(
        db,
        task_list={"plain": plain, "async": async_},
        no_handle_signals=True,
        concurrency=1,
        local_queue_size=len(kinds),  # every job is in the local queue at once
        local_queue_horizon=math.inf,
    )
    assert ran == list(range(len(kinds)))


async def test_a_context_variable_set_by_one_job_is_not_seen_by_the_next(
    utils: WorkerUtils, db: str
) -> None:
    await utils.add_jobs([{"identifier": "plain", "payload": {"n": n}} for n in range(5)])
    var: contextvars.ContextVar[int] = contextvars.ContextVar("var")
    seen: list[int | None] = []

    def plain(payload: Any, helpers: Helpers) -> None:
        seen.append(var.get(None))
        var.set(payload["n"])

    await run_once(db, task_list={"plain": plain}, no_handle_signals=True, concurrency=1)
    assert seen == [None] * 5


async def test_the_abort_signal_reaches_a_plain_task(utils: WorkerUtils, db: str) -> None:
    await utils.add_job("plain", {})
    started = threading.Event()

    def plain(payload: Any, helpers: Helpers) -> str:
        started.set()
        while not helpers.abort_signal.is_set():
            time.sleep(0.01)
        return "stopped early"

    runner = await run(
        db, task_list={"plain": plain}, no_handle_signals=True, graceful_shutdown_timeout=0.2
    )
    await asyncio.to_thread(started.wait, 10)
    await asyncio.wait_for(runner.stop(), 10)
    assert value(db, LEFT) == 0  # it returned normally: success
    assert runner.exit_code == 0


async def test_a_forced_stop_fails_a_plain_job_that_does_not_return_and_nothing_after_it(
    utils: WorkerUtils, db: str
) -> None:
    await utils.add_job("stuck", {}, priority=0)
    await utils.add_job("plain", {}, priority=1)
    started, release = threading.Event(), threading.Event()
    ran_after: list[str] = []

    def stuck(payload: Any, helpers: Helpers) -> None:
        started.set()
        release.wait(30)  # ignores abort_signal

    def plain(payload: Any, helpers: Helpers) -> None:
        ran_after.append("plain")

    runner = await run(
        db,
        task_list={"stuck": stuck, "plain": plain},
        no_handle_signals=True,
        concurrency=1,
        graceful_shutdown_timeout=0.1,
        local_queue_size=5,
        local_queue_horizon=float("inf"),
    )
    await asyncio.to_thread(started.wait, 10)
    runner.pool.stop()
    runner.force_stop()
    await asyncio.wait_for(asyncio.shield(runner._task), 10)
    # The task returns only now: its success must not be written over the failure,
    # and its thread must not go on to the next job.
    release.set()
    await asyncio.sleep(0.2)
    jobs = rows(
        db,
        "select task_identifier, attempts, locked_by, last_error"
        " from graphile_worker.jobs order by priority",
    )
    assert [(j["task_identifier"], j["attempts"], j["locked_by"]) for j in jobs] == [
        ("stuck", 1, None),
        ("plain", 0, None),
    ]
    assert "stopped while the job was running" in jobs[0]["last_error"]
    assert ran_after == []


async def test_job_start_listeners_see_every_plain_job_start_before_it_runs(
    utils: WorkerUtils, db: str
) -> None:
    await utils.add_jobs([{"identifier": "plain", "payload": {"n": n}} for n in range(20)])
    events = Events()
    recorder = Recorder(events, "job:start", "job:success")
    order: list[tuple[str, int]] = []
    events.on("job:start", lambda data: order.append(("start", data["job"].payload["n"])))

    def plain(payload: Any, helpers: Helpers) -> None:
        order.append(("run", payload["n"]))

    await run_once(
        db, task_list={"plain": plain}, events=events, no_handle_signals=True, concurrency=1
    )
    assert len(recorder.of("job:start")) == len(recorder.of("job:success")) == 20
    assert order == [(step, n) for n in range(20) for step in ("start", "run")]


async def test_a_plain_task_raising_base_exceptions_fails_only_its_job(
    utils: WorkerUtils, db: str
) -> None:
    for error in ("exit", "interrupt", "ok"):
        await utils.add_job(error, {})

    def exit_(payload: Any, helpers: Helpers) -> None:
        raise SystemExit(3)

    def interrupt(payload: Any, helpers: Helpers) -> None:
        raise KeyboardInterrupt

    def ok(payload: Any, helpers: Helpers) -> None:
        pass

    tasks = {"exit": exit_, "interrupt": interrupt, "ok": ok}
    async with asyncio.timeout(20):  # a thread killed by the exception would hang its slot
        assert await run_once(db, task_list=tasks, no_handle_signals=True, concurrency=1) == 0
    await until(lambda: value(db, LEFT) == 2)
    assert sorted(
        r["last_error"] for r in rows(db, "select last_error from graphile_worker.jobs")
    ) == [
        "KeyboardInterrupt",
        "SystemExit: 3",
    ]


async def test_a_logging_filter_that_raises_loses_no_outcome(utils: WorkerUtils, db: str) -> None:
    # Enough jobs that the threads report several outcomes at once. One attempt
    # each: on a slow machine the drain outlasts the first retry's backoff
    # (2.7 s), and a failed job would run again within it.
    await utils.add_jobs(
        [{"identifier": "fails", "payload": {"n": n}, "max_attempts": 1} for n in range(100)]
    )
    await utils.add_jobs([{"identifier": "works", "payload": {"n": n}} for n in range(500)])

    def fails(payload: Any, helpers: Helpers) -> None:
        raise ValueError("no")

    def works(payload: Any, helpers: Helpers) -> None:
        pass

    def broken_filter(record: logging.LogRecord) -> bool:
        raise RuntimeError("a broken filter")

    outcome_logger = logging.getLogger("graphile_worker.worker")
    outcome_logger.addFilter(broken_filter)
    try:
        async with asyncio.timeout(20):
            code = await run_once(
                db, task_list={"fails": fails, "works": works}, no_handle_signals=True
            )
    finally:
        outcome_logger.removeFilter(broken_filter)
    assert code == 0
    left = rows(db, "select task_identifier, attempts, last_error from graphile_worker.jobs")
    assert (
        left == [{"task_identifier": "fails", "attempts": 1, "last_error": "ValueError: no"}] * 100
    )
