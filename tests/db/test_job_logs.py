"""A job's own logs (``--job-logs``; migrations/py/000027.sql): the lines a
task logs through ``helpers.logger`` during an attempt are kept for a failed
attempt by default (written by the failure statement: a success writes
nothing), for every attempt with ``all``, never with ``off``; bounded per
attempt (the oldest lines dropped, with a marker), whatever the task logs;
async and plain tasks alike; pruned after 7 days."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest
from dbhelpers import rows, value

from worker_cli import Helpers, WorkerUtils, run, run_once
from worker_cli.tasks.attempt_log import BYTES_MAX, LINES_MAX
from worker_cli.worker.background.pruner import HistoryPruner

pytestmark = pytest.mark.db

LOGS = "graphile_worker._private_py_job_logs"


async def drain(db: str, tasks: dict[str, Any], **options: Any) -> None:
    async with asyncio.timeout(120):
        assert await run_once(db, task_list=tasks, no_handle_signals=True, **options) == 0


async def chatty(payload: Any, helpers: Helpers) -> None:
    helpers.logger.debug("not kept: debug is not printed here")
    helpers.logger.info("fetching %s", payload["what"])
    helpers.logger.warning("slow answer <b>%d</b>", 3)
    if payload.get("fail"):
        try:
            raise KeyError("inner")
        except KeyError:
            helpers.logger.exception("gave up")
        raise RuntimeError("failed")


def plain_chatty(payload: Any, helpers: Helpers) -> None:
    helpers.logger.info("from a thread: %s", threading.current_thread() is threading.main_thread())
    raise ValueError("plain failed")


async def test_a_failed_attempt_keeps_its_lines_and_a_success_writes_nothing(
    db: str, utils: WorkerUtils
) -> None:
    logging.getLogger("graphile_worker.job").setLevel(logging.INFO)
    failed = await utils.add_job("chatty", {"what": "orders", "fail": True}, max_attempts=2)
    succeeded = await utils.add_job("chatty", {"what": "users"})
    plain = await utils.add_job("plain_chatty", {}, max_attempts=1)
    await drain(db, {"chatty": chatty, "plain_chatty": plain_chatty})
    logs = await utils.get_job_logs(failed.id)
    assert [(log.attempt, log.outcome, log.dropped) for log in logs] == [(1, "failed", 0)]
    messages = [line.split(" ", 2)[2] for line in logs[0].lines[:3]]
    assert messages == ["fetching orders", "slow answer <b>3</b>", "gave up"]
    assert [line.split(" ", 2)[1] for line in logs[0].lines[:3]] == ["INFO", "WARNING", "ERROR"]
    assert "KeyError: 'inner'" in "\n".join(logs[0].lines)  # the exception's traceback
    assert await utils.get_job_logs(succeeded.id) == []
    assert value(db, f"select count(*) from {LOGS} where job_id = %s", (succeeded.id,)) == 0
    (plain_log,) = await utils.get_job_logs(plain.id)
    assert plain_log.lines[0].endswith("INFO from a thread: False")
    assert logs[0].as_dict()["outcome"] == "failed"


async def test_job_logs_all_keeps_successes_and_off_keeps_nothing(
    db: str, utils: WorkerUtils
) -> None:
    first = await utils.add_job("chatty", {"what": "a"})
    await drain(db, {"chatty": chatty}, job_logs="all")
    (log,) = await utils.get_job_logs(first.id)
    assert (log.outcome, log.attempt) == ("succeeded", 1)
    assert log.lines[0].endswith("INFO fetching a")

    second = await utils.add_job("chatty", {"what": "b", "fail": True}, max_attempts=1)
    await drain(db, {"chatty": chatty}, job_logs="off")
    assert await utils.get_job_logs(second.id) == []
    assert (await utils.get_job_errors(second.id))[0].error == "RuntimeError: failed"


async def test_a_million_lines_keep_the_last_thousand_and_slow_no_other_job(
    db: str, utils: WorkerUtils
) -> None:
    # The output handler sees none of them (level above), so the run
    # measures the capture alone.
    job_logger = logging.getLogger("graphile_worker.job")
    job_logger.setLevel(logging.CRITICAL)
    others_done: list[float] = []
    started = time.monotonic()

    def flood(payload: Any, helpers: Helpers) -> None:
        for i in range(payload["lines"]):
            helpers.logger.warning("line %d", i)
        raise RuntimeError("flooded")

    async def quick(payload: Any, helpers: Helpers) -> None:
        others_done.append(time.monotonic() - started)

    try:
        flooded = await utils.add_job("flood", {"lines": 1_000_000}, max_attempts=1)
        for _ in range(20):
            await utils.add_job("quick", {})
        await drain(db, {"flood": flood, "quick": quick}, concurrency=2)
    finally:
        job_logger.setLevel(logging.NOTSET)
    (log,) = await utils.get_job_logs(flooded.id)
    assert len(log.lines) == LINES_MAX + 1  # the newest, after the marker
    assert log.dropped == 1_000_000 - LINES_MAX
    assert log.lines[0].startswith(f"[{log.dropped} earlier line(s) dropped")
    assert log.lines[-1].endswith("WARNING line 999999")
    assert len("\n".join(log.lines)) <= BYTES_MAX + 200
    # The other jobs ran beside it, on the other slot, while it logged.
    assert len(others_done) == 20
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 1


async def test_long_lines_are_cut_and_the_size_is_bounded(db: str, utils: WorkerUtils) -> None:
    async def wide(payload: Any, helpers: Helpers) -> None:
        for i in range(100):
            helpers.logger.info("%d %s", i, "x" * 10_000)
        helpers.logger.info("nul \x00 and lone \udc80")
        raise RuntimeError("wide")

    job = await utils.add_job("wide", {}, max_attempts=1)
    await drain(db, {"wide": wide})
    (log,) = await utils.get_job_logs(job.id)
    assert log.dropped > 0
    assert len("\n".join(log.lines)) <= BYTES_MAX + 200
    assert all(len(line) <= 4100 for line in log.lines)
    assert log.lines[-1].endswith("nul \\x00 and lone \\udc80")


async def test_a_cancelled_attempt_keeps_its_lines_as_cancelled(
    db: str, utils: WorkerUtils
) -> None:
    started = asyncio.Event()

    async def waits(payload: Any, helpers: Helpers) -> None:
        helpers.logger.info("waiting for ever")
        started.set()
        await asyncio.sleep(60)

    job = await utils.add_job("waits", {})
    # A running worker (not --once) hears the cancel at once (its listener).
    runner = await run(db, task_list={"waits": waits}, no_handle_signals=True)
    try:
        async with asyncio.timeout(30):
            await started.wait()
            await utils.cancel_job(job.id, "not needed")
            record = await utils.wait_for_job(job.id)
    finally:
        await runner.stop()
    assert record.state == "cancelled"
    (log,) = await utils.get_job_logs(job.id)
    assert log.outcome == "cancelled"
    assert log.lines[0].endswith("INFO waiting for ever")


async def test_logs_older_than_seven_days_are_pruned(db: str, utils: WorkerUtils) -> None:
    rows(
        db,
        f"insert into {LOGS} (job_id, attempt, outcome, lines, logged_at) values "
        "(1, 1, 'failed', 'old', now() - interval '8 days'), "
        "(2, 1, 'failed', 'recent', now() - interval '6 days')",
    )
    rows(
        db,
        "insert into graphile_worker._private_py_job_progress (job_id, done, updated_at) values "
        "(1, 0.5, now() - interval '8 days'), (2, 0.5, now())",
    )
    pruner = HistoryPruner(utils, schema="graphile_worker", interval=(60, 120))
    assert await pruner.prune_job_logs() == 2
    assert value(db, f"select array_agg(lines) from {LOGS}") == ["recent"]
    assert value(db, "select array_agg(job_id) from graphile_worker._private_py_job_progress") == [
        2
    ]
