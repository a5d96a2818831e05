"""A job's progress (``helpers.progress``; migrations/py/000027.sql): kept
beside the job, across retries and once it has finished; written coalesced
(a task calling it in a tight loop costs a few writes a second, never a
write per call); read by ``get_job_result``, ``wait_for_job(on_progress=)``;
a refused write loses that job's report alone; bad arguments raise naming
the argument."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from dbhelpers import rows, value

from worker_cli import Helpers, WorkerUtils, run, run_once
from worker_cli.jobs.job_state import JobProgress

pytestmark = pytest.mark.db

PROGRESS = "graphile_worker._private_py_job_progress"

# Counts every row the worker writes to the progress table (a test's own trigger).
COUNT_WRITES = f"""
  create table public.progress_writes (job_id bigint, at timestamptz default clock_timestamp());
  create function public.count_progress_write() returns trigger language plpgsql as $$
  begin
    insert into public.progress_writes (job_id) values (new.job_id);
    return null;
  end $$;
  create trigger count_writes after insert or update on {PROGRESS}
    for each row execute function public.count_progress_write();
"""


async def drain(db: str, tasks: dict[str, Any], **options: Any) -> None:
    async with asyncio.timeout(60):
        assert await run_once(db, task_list=tasks, no_handle_signals=True, **options) == 0


async def test_a_tight_loop_of_reports_is_written_a_few_times_a_second(
    db: str, utils: WorkerUtils
) -> None:
    rows(db, COUNT_WRITES)
    seen: list[JobProgress | None] = []

    async def looping(payload: Any, helpers: Helpers) -> None:
        started = time.monotonic()
        calls = 0
        while time.monotonic() - started < 1.6:
            calls += 1
            if payload["fraction"]:
                helpers.progress(calls % 100 / 100, message=f"call {calls}")
            else:
                helpers.progress(calls, 10**9, f"call {calls}")
            await asyncio.sleep(0)
        if payload["fraction"]:
            helpers.progress(1.0, message="done")
        else:
            helpers.progress(10**9, 10**9, "done")

    def plain(payload: Any, helpers: Helpers) -> None:
        started = time.monotonic()
        while time.monotonic() - started < 1.6:
            helpers.progress(0.25, message="thread")
        helpers.progress(7, 7, "all of it")

    jobs = [
        await utils.add_job("looping", {"fraction": False}),
        await utils.add_job("looping", {"fraction": True}),
        await utils.add_job("plain", {}),
    ]

    async def watch() -> None:
        while True:
            seen.append((await utils.get_job_result(jobs[0].id)).progress)
            await asyncio.sleep(0.1)

    watcher = asyncio.create_task(watch())
    try:
        await drain(db, {"looping": looping, "plain": plain}, concurrency=3)
    finally:
        watcher.cancel()
    # Read while it ran: the reports arrived as it worked.
    assert any(p is not None and p.message != "done" for p in seen)
    writes = value(db, "select count(*) from public.progress_writes")
    # 1.6 s at one write every 0.5 s per job, and the last report: about 4
    # a job, never one per call (the tasks made hundreds of thousands).
    assert 3 <= writes <= 3 * 6, writes
    first, second, third = [(await utils.get_job_result(j.id)) for j in jobs]
    assert first.state == "succeeded"
    assert first.progress is not None
    assert (first.progress.done, first.progress.total, first.progress.message) == (
        10**9,
        10**9,
        "done",
    )
    assert str(first.progress) == "1e+09/1e+09 (100%) done"
    assert second.progress is not None and second.progress.fraction == 1.0
    assert third.progress is not None and str(third.progress) == "7/7 (100%) all of it"
    assert first.as_dict()["progress"]["message"] == "done"


async def test_progress_is_kept_across_retries_and_with_the_history(
    db: str, utils: WorkerUtils
) -> None:
    async def flaky(payload: Any, helpers: Helpers) -> None:
        if helpers.job.attempts == 1:
            helpers.progress(3, 10, "before the failure")
            await asyncio.sleep(0.7)  # written by the writer's tick
            raise RuntimeError("first attempt fails")

    job = await utils.add_job("flaky", {}, max_attempts=2)
    await drain(db, {"flaky": flaky})
    record = await utils.get_job_result(job.id)
    assert record.state == "retrying"
    assert record.progress is not None and record.progress.message == "before the failure"
    rows(db, "update graphile_worker._private_jobs set run_at = now()")
    await drain(db, {"flaky": flaky})
    record = await utils.get_job_result(job.id)
    assert record.state == "succeeded"  # from the history, with the progress of attempt 1
    assert record.progress is not None and (record.progress.done, record.progress.total) == (3, 10)


async def test_wait_for_job_tells_its_caller_each_new_progress(db: str, utils: WorkerUtils) -> None:
    # Each step waits until the caller was told of it (no timing assumed).
    acks = [asyncio.Event() for _ in range(3)]

    async def stepped(payload: Any, helpers: Helpers) -> None:
        for step in range(1, 4):
            helpers.progress(step, 3, f"step {step}")
            await acks[step - 1].wait()

    job = await utils.add_job("stepped", {})
    runner = await run(db, task_list={"stepped": stepped}, no_handle_signals=True)
    told: list[str] = []
    try:

        def on_progress(progress: JobProgress) -> None:
            told.append(progress.message or "")
            acks[int(progress.done) - 1].set()

        async with asyncio.timeout(30):
            record = await utils.wait_for_job(job.id, on_progress=on_progress)
    finally:
        for ack in acks:
            ack.set()
        await runner.stop()
    assert record.state == "succeeded"
    assert told == ["step 1", "step 2", "step 3"]


async def test_a_refused_progress_write_loses_that_jobs_report_alone(
    db: str, utils: WorkerUtils
) -> None:
    # A user's trigger refusing one job's progress: the other's is written,
    # and both jobs succeed.
    rows(
        db,
        f"""
        create function public.refuse_progress() returns trigger language plpgsql as $$
        begin
          if new.message = 'poison' then raise exception 'no progress for you'; end if;
          return new;
        end $$;
        create trigger refuse before insert or update on {PROGRESS}
          for each row execute function public.refuse_progress();
        """,
    )
    both = threading.Barrier(2)

    def reporter(payload: Any, helpers: Helpers) -> None:
        both.wait(timeout=10)  # the two reports are written by one tick
        helpers.progress(1, 2, payload["message"])
        time.sleep(0.8)

    good = await utils.add_job("reporter", {"message": "fine"})
    bad = await utils.add_job("reporter", {"message": "poison"})
    await drain(db, {"reporter": reporter}, concurrency=2)
    assert (await utils.get_job_status(good.id)) == "succeeded"
    assert (await utils.get_job_status(bad.id)) == "succeeded"
    assert value(db, f"select message from {PROGRESS} where job_id = %s", (good.id,)) == "fine"
    assert value(db, f"select count(*) from {PROGRESS} where job_id = %s", (bad.id,)) == 0


async def test_bad_progress_arguments_raise_naming_the_argument(
    db: str, utils: WorkerUtils
) -> None:
    errors: list[str] = []

    async def checks(payload: Any, helpers: Helpers) -> None:
        for args in (
            (2,),  # a fraction over 1
            (-1, 10),
            (float("nan"),),
            (1, float("inf")),
            (10**400, 10),
            (True,),
            ("3", 10),
        ):
            try:
                helpers.progress(*args)
            except ValueError as exc:
                errors.append(str(exc).split(" ")[0])
        try:
            helpers.progress(1, 2, 3)  # type: ignore[arg-type]
        except ValueError as exc:
            errors.append(str(exc).split(" ")[0])
        helpers.progress(1, 2, "x" * 5000 + "\x00")  # cut, and storable

    job = await utils.add_job("checks", {})
    await drain(db, {"checks": checks})
    assert errors == ["done", "done", "done", "total", "done", "done", "done", "message"]
    record = await utils.get_job_result(job.id)
    assert record.state == "succeeded"
    assert record.progress is not None and len(record.progress.message or "") == 1000
