"""Per-task retry policy (``@task_options(retry=RetryPolicy(...))``) and what a
task raises to decide for itself: ``Snooze``, ``Discard``, ``Cancel``."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from dbhelpers import rows, value

from worker_cli import (
    Cancel,
    Discard,
    Helpers,
    RetryPolicy,
    Snooze,
    WorkerUtils,
    run_once,
    task_options,
)
from worker_cli.jobs.job import Job

JOBS = "graphile_worker._private_jobs"
OPTIONS = "graphile_worker._private_py_job_options"
HISTORY = "graphile_worker._private_py_job_history"


def job_after(attempts: int = 1, max_attempts: int = 25) -> Job:
    """A job as a failed attempt leaves it (attempts counted at the fetch)."""
    now = datetime.now(UTC)
    return Job(
        id=1,
        job_queue_id=None,
        task_id=1,
        payload={},
        priority=0,
        run_at=now,
        attempts=attempts,
        max_attempts=max_attempts,
        last_error=None,
        created_at=now,
        updated_at=now,
        key=None,
        locked_at=now,
        locked_by="pool",
        revision=0,
        flags=None,
        is_available=False,
        task_identifier="t",
        queue_name=None,
    )


# --- the policy itself (no database) ----------------------------------------------


@pytest.mark.unit
def test_named_backoffs_capped_and_jittered() -> None:
    exponential = RetryPolicy(backoff="exponential", delay=2, max_delay=timedelta(seconds=30))
    assert [exponential.delay_for(job_after(n), RuntimeError()) for n in (1, 2, 3, 4, 5)] == [
        2,
        4,
        8,
        16,
        30,
    ]
    linear = RetryPolicy(backoff="linear", delay=10)
    assert [linear.delay_for(job_after(n), RuntimeError()) for n in (1, 2, 3)] == [10, 20, 30]
    assert RetryPolicy(backoff="constant", delay=60).delay_for(job_after(7), RuntimeError()) == 60
    assert RetryPolicy().delay_for(job_after(), RuntimeError()) is None  # graphile-worker's
    jittered = RetryPolicy(backoff="constant", delay=100, jitter=0.1)
    delays = {jittered.delay_for(job_after(), RuntimeError()) for _ in range(200)}
    assert all(d is not None and 90 <= d <= 110 for d in delays) and len(delays) > 100

    def by_error(job: Job, error: BaseException) -> timedelta:
        return timedelta(minutes=5 if isinstance(error, TimeoutError) else 1)

    custom = RetryPolicy(backoff=by_error)
    assert custom.delay_for(job_after(), TimeoutError()) == 300
    assert custom.delay_for(job_after(), RuntimeError()) == 60


@pytest.mark.unit
def test_which_errors_are_retried() -> None:
    policy = RetryPolicy(retry_on=(OSError,), dont_retry_on=(FileNotFoundError,))
    assert policy.retries(ConnectionError())  # an OSError
    assert not policy.retries(FileNotFoundError())  # dont_retry_on wins
    assert not policy.retries(ValueError())
    assert RetryPolicy(dont_retry_on=ValueError).retries(KeyError())  # a class alone is fine
    assert not RetryPolicy(dont_retry_on=ValueError).retries(ValueError())
    assert RetryPolicy(max_attempts=3).last_attempt(job_after(3))
    assert not RetryPolicy(max_attempts=3).last_attempt(job_after(2))


@pytest.mark.unit
@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"max_attempts": 0}, "max_attempts must be a whole number from 1"),
        ({"backoff": "fibonacci"}, "backoff must be 'exponential', 'linear', 'constant'"),
        ({"delay": -1}, "delay must be from"),
        ({"delay": float("nan")}, "delay must be seconds"),
        ({"max_delay": timedelta(days=400)}, "max_delay must be from"),
        ({"jitter": 2}, "jitter must be from 0 to 1"),
        ({"retry_on": ("ValueError",)}, "retry_on must be a tuple of exception classes"),
        ({"max_snoozes": -1}, "max_snoozes must be a whole number from 0"),
        # A bool is an int to Python, not a number of attempts (True would be 1).
        ({"max_attempts": True}, "max_attempts must be a whole number from 1 to 32767, not True"),
        ({"max_attempts": False}, "max_attempts must be a whole number from 1 to 32767, not False"),
        ({"max_snoozes": True}, "max_snoozes must be a whole number from 0, not True"),
        ({"max_snoozes": False}, "max_snoozes must be a whole number from 0, not False"),
        ({"jitter": True}, "jitter must be from 0 to 1, not True"),
        ({"delay": True}, "delay must be seconds"),
        ({"max_delay": True}, "max_delay must be seconds"),
    ],
)
def test_a_bad_policy_is_one_clear_error(kwargs: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        RetryPolicy(**kwargs)
    with pytest.raises(ValueError, match="retry must be a RetryPolicy"):
        task_options(retry={"max_attempts": 3})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Snooze must be seconds"):
        Snooze("soon")  # type: ignore[arg-type]


# --- in the worker ---------------------------------------------------------------------


async def drain(db: str, tasks: dict[str, Any]) -> None:
    async with asyncio.timeout(30):
        assert await run_once(db, task_list=tasks, no_handle_signals=True) == 0


def job_row(db: str, job_id: int) -> dict[str, Any]:
    [row] = rows(
        db,
        f"select *, extract(epoch from run_at - updated_at)::float8 as delay from {JOBS} "
        "where id = %s",
        (job_id,),
    )
    return row


def due_now(db: str, job_id: int) -> None:
    rows(db, f"update {JOBS} set run_at = now() where id = %s", (job_id,))


@pytest.mark.db
async def test_without_a_policy_the_backoff_is_graphile_workers(
    utils: WorkerUtils, db: str
) -> None:
    job = await utils.add_job("flaky", {})

    async def flaky(payload: Any, helpers: Helpers) -> None:
        raise RuntimeError("down")

    await drain(db, {"flaky": flaky})
    row = job_row(db, job.id)
    assert row["attempts"] == 1 and row["last_error"].startswith("RuntimeError: down")
    assert abs(row["delay"] - 2.718) < 0.5  # exp(1) seconds


@pytest.mark.db
async def test_a_constant_backoff_sets_the_next_attempt(utils: WorkerUtils, db: str) -> None:
    job = await utils.add_job("partner", {})

    @task_options(retry=RetryPolicy(backoff="constant", delay=60))
    async def partner(payload: Any, helpers: Helpers) -> None:
        raise ConnectionError("partner busy")

    await drain(db, {"partner": partner})
    row = job_row(db, job.id)
    assert (row["attempts"], row["max_attempts"], row["locked_by"]) == (1, 25, None)
    assert abs(row["delay"] - 60) < 1.0
    assert row["last_error"].startswith("ConnectionError: partner busy")


@pytest.mark.db
async def test_an_error_the_policy_does_not_retry_fails_the_job_for_good(
    utils: WorkerUtils, db: str
) -> None:
    bad, other = await utils.add_job("parse", {"n": "x"}), await utils.add_job("parse", {"n": 1})

    @task_options(retry=RetryPolicy(retry_on=(ConnectionError,), dont_retry_on=(ValueError,)))
    async def parse(payload: dict[str, Any], helpers: Helpers) -> None:
        if payload["n"] == "x":
            raise ValueError("not a number")
        raise KeyError("missing")  # not in retry_on either

    await drain(db, {"parse": parse})
    for job in (bad, other):
        row = job_row(db, job.id)
        assert (row["attempts"], row["max_attempts"]) == (25, 25)
        assert await utils.get_job_status(job.id) == "failed"
    assert job_row(db, bad.id)["last_error"].startswith("ValueError: not a number")


@pytest.mark.db
async def test_the_policys_max_attempts_lowers_the_jobs(utils: WorkerUtils, db: str) -> None:
    job = await utils.add_job("twice", {})
    runs: list[int] = []

    @task_options(retry=RetryPolicy(max_attempts=2, backoff="constant", delay=0.001))
    async def twice(payload: Any, helpers: Helpers) -> None:
        runs.append(helpers.job.attempts)
        raise RuntimeError("again")

    await drain(db, {"twice": twice})  # the retry is due at once: the same drain runs it
    assert runs == [1, 2]
    row = job_row(db, job.id)
    assert (row["attempts"], row["max_attempts"]) == (25, 25)  # failed for good at 2
    assert await utils.get_job_status(job.id) == "failed"


@pytest.mark.db
async def test_a_failing_backoff_function_falls_back_to_graphile_workers(
    utils: WorkerUtils, db: str, caplog: Any
) -> None:
    job = await utils.add_job("odd", {})

    def broken(job: Job, error: BaseException) -> float:
        raise ZeroDivisionError("oops")

    @task_options(retry=RetryPolicy(backoff=broken))
    async def odd(payload: Any, helpers: Helpers) -> None:
        raise RuntimeError("down")

    with caplog.at_level(logging.WARNING, logger="graphile_worker"):
        await drain(db, {"odd": odd})
    assert any("its retry policy's backoff failed" in r.getMessage() for r in caplog.records)
    assert abs(job_row(db, job.id)["delay"] - 2.718) < 0.5


@pytest.mark.db
async def test_snooze_runs_the_job_again_later_without_spending_an_attempt(
    utils: WorkerUtils, db: str
) -> None:
    job = await utils.add_job("poll", {}, max_attempts=1)
    runs: list[int] = []

    @task_options(retry=RetryPolicy(max_snoozes=2))
    async def poll(payload: Any, helpers: Helpers) -> None:
        runs.append(helpers.job.attempts)
        raise Snooze(timedelta(minutes=2))

    await drain(db, {"poll": poll})
    row = job_row(db, job.id)
    # One attempt allowed, yet not failed: the attempt was given back.
    assert (row["attempts"], row["last_error"], row["locked_by"]) == (0, None, None)
    assert abs(row["delay"] - 120) < 1.0
    assert value(db, f"select snoozes from {OPTIONS} where job_id = %s", (job.id,)) == 1
    assert await utils.get_job_status(job.id) == "scheduled"
    due_now(db, job.id)
    await drain(db, {"poll": poll})
    assert value(db, f"select snoozes from {OPTIONS} where job_id = %s", (job.id,)) == 2
    assert job_row(db, job.id)["attempts"] == 0
    due_now(db, job.id)
    await drain(db, {"poll": poll})  # a third snooze: over max_snoozes, a failure
    row = job_row(db, job.id)
    assert row["attempts"] == 1 and await utils.get_job_status(job.id) == "failed"
    assert row["last_error"] == "Snooze: snoozed 2 times already (max_snoozes)"
    assert runs == [1, 1, 1]


@pytest.mark.db
async def test_discard_fails_the_job_for_good_and_reschedule_revives_it(
    utils: WorkerUtils, db: str, caplog: Any
) -> None:
    job = await utils.add_job("importer", {"file": "a.csv"})

    async def importer(payload: Any, helpers: Helpers) -> None:
        raise Discard("a.csv is not a CSV file")

    await drain(db, {"importer": importer})
    row = job_row(db, job.id)
    assert (row["attempts"], row["max_attempts"]) == (25, 25)
    assert row["last_error"].startswith("Discard: a.csv is not a CSV file")
    # A Discard is the task's decision, no bug: one WARNING line, no traceback.
    [line] = [r for r in caplog.records if r.name == "graphile_worker.worker"]
    assert (line.levelname, line.exc_info, line.exc_text) == ("WARNING", None, None)
    assert line.getMessage().startswith(f"Job {job.id} (importer, ")
    assert line.getMessage().endswith(
        "discarded by its task (a.csv is not a CSV file): failed permanently "
        "(no retry; `graphile-worker retry` revives it)"
    )
    assert await utils.get_job_status(job.id) == "failed"
    await utils.reschedule_jobs([job.id], attempts=0, run_at=datetime.now(UTC))
    assert await utils.get_job_status(job.id) == "waiting"


@pytest.mark.db
async def test_cancel_from_inside_records_the_job_as_cancelled(
    utils: WorkerUtils, db: str, caplog: Any
) -> None:
    caplog.set_level(logging.INFO, logger="graphile_worker")
    job = await utils.add_job("charge", {"order": 7})
    runs: list[int] = []

    async def charge(payload: Any, helpers: Helpers) -> None:
        runs.append(helpers.job.id)
        raise Cancel("order 7 was refunded")

    await drain(db, {"charge": charge})
    assert runs == [job.id]  # never retried
    assert value(db, f"select count(*) from {JOBS}") == 0
    record = await utils.get_job_result(job.id)
    assert (record.state, record.cancel_reason) == ("cancelled", "order 7 was refunded")
    [line] = [r for r in caplog.records if r.name == "graphile_worker.worker"]
    assert (line.levelname, line.exc_info, line.exc_text) == ("INFO", None, None)
    assert line.getMessage().startswith(f"Job {job.id} (charge, ")
    assert line.getMessage().endswith(
        "cancelled by its task (order 7 was refunded): recorded as cancelled (no retry)"
    )


@pytest.mark.db
def test_the_readmes_flow_control_example_runs_as_written(db: str, tmp_path: Any) -> None:
    from readme_blocks import run_transcript, write_files

    heading = "### Retry policy, snooze, discard and cancel"
    assert set(write_files(heading, tmp_path)) == {
        "tasks/sync_partner.py",
        "add_sync.py",
        "show_job.py",
    }
    outputs, expected = run_transcript(heading, db, tmp_path)
    assert outputs == expected
