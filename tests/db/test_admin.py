"""complete / permanently fail / reschedule / force unlock / cleanup, and locks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from dbhelpers import rows, value

from worker_cli import WorkerUtils

pytestmark = pytest.mark.db


FRESH_LOCK = timedelta(minutes=5)
STALE_LOCK = timedelta(hours=4, minutes=1)


async def three_jobs(utils: WorkerUtils, db: str) -> tuple[int, int, int]:
    """An unlocked job, one locked 5 minutes ago and one locked over 4 hours ago."""
    jobs = [await utils.add_job("t", {"n": n}, queue_name=f"q{n}") for n in range(3)]
    for job, age in zip(jobs[1:], (FRESH_LOCK, STALE_LOCK), strict=True):
        rows(
            db,
            "update graphile_worker._private_jobs set locked_at = now() - %s, "
            "locked_by = 'pool-x', attempts = 1 where id = %s",
            (age, job.id),
        )
    free, fresh, stale = (job.id for job in jobs)
    return free, fresh, stale


def ids(db: str) -> set[int]:
    return {r["id"] for r in rows(db, "select id from graphile_worker._private_jobs")}


async def test_complete_jobs_skips_freshly_locked_jobs(utils: WorkerUtils, db: str) -> None:
    free, fresh, stale = await three_jobs(utils, db)
    done = await utils.complete_jobs([free, fresh, stale])
    assert {job.id for job in done} == {free, stale}
    assert ids(db) == {fresh}
    assert {job.task_identifier for job in done} == {"t"}


async def test_permanently_fail_jobs_honours_locks(utils: WorkerUtils, db: str) -> None:
    free, fresh, stale = await three_jobs(utils, db)
    failed = await utils.permanently_fail_jobs([free, fresh, stale], "no longer needed")
    assert {job.id for job in failed} == {free, stale}
    by_id = {r["id"]: r for r in rows(db, "select * from graphile_worker._private_jobs")}
    for job_id in (free, stale):
        assert by_id[job_id]["attempts"] == by_id[job_id]["max_attempts"]
        assert by_id[job_id]["last_error"] == "no longer needed"
        assert by_id[job_id]["is_available"] is False
    assert by_id[fresh]["attempts"] == 1 and by_id[fresh]["last_error"] is None
    [default] = await utils.permanently_fail_jobs([free])
    assert default.last_error == "Manually marked as failed"


async def test_reschedule_jobs_changes_only_given_fields(utils: WorkerUtils, db: str) -> None:
    free, fresh, stale = await three_jobs(utils, db)
    when = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    changed = await utils.reschedule_jobs([free, fresh, stale], run_at=when, attempts=0)
    assert {job.id for job in changed} == {free, stale}
    for job in changed:
        assert (job.run_at, job.attempts, job.priority, job.max_attempts) == (when, 0, 0, 25)
    [job] = await utils.reschedule_jobs([free], priority=7, max_attempts=3)
    assert (job.run_at, job.priority, job.max_attempts) == (when, 7, 3)
    assert (
        value(db, "select run_at from graphile_worker._private_jobs where id = %s", (fresh,))
        != when
    )


async def test_admin_functions_set_updated_at(utils: WorkerUtils, db: str) -> None:
    job = await utils.add_job("t", {})
    rows(db, "update graphile_worker._private_jobs set updated_at = now() - interval '1 day'")
    [rescheduled] = await utils.reschedule_jobs([job.id], priority=1)
    assert rescheduled.updated_at > job.updated_at - timedelta(hours=1)


async def test_force_unlock_workers_frees_jobs_and_queues(utils: WorkerUtils, db: str) -> None:
    job = await utils.add_job("t", {}, queue_name="serial")
    other = await utils.add_job("t", {}, queue_name="other")
    for table, pool in (("_private_jobs", "pool-dead"), ("_private_job_queues", "pool-dead")):
        rows(db, f"update graphile_worker.{table} set locked_at = now(), locked_by = %s", (pool,))
    rows(
        db,
        "update graphile_worker._private_jobs set locked_by = 'pool-alive' where id = %s",
        (other.id,),
    )
    await utils.force_unlock_workers(["pool-dead"])
    locks = {
        r["id"]: r["locked_by"]
        for r in rows(db, "select id, locked_by from graphile_worker._private_jobs")
    }
    assert locks == {job.id: None, other.id: "pool-alive"}
    assert (
        value(
            db,
            "select count(*) from graphile_worker._private_job_queues where locked_by is not null",
        )
        == 0
    )


async def test_cleanup_tasks(utils: WorkerUtils, db: str) -> None:
    kept = await utils.add_job("in_use", {}, queue_name="busy_queue")
    dead = await utils.add_job("failed_task", {}, queue_name="dead_queue")
    await utils.permanently_fail_jobs([dead.id])
    done = await utils.add_job("finished_task", {}, queue_name="empty_queue")
    await utils.complete_jobs([done.id])
    await utils.complete_jobs([(await utils.add_job("keep_me", {})).id])
    locked = await utils.add_job("t", {}, queue_name="locked_queue")
    await utils.complete_jobs([locked.id])
    rows(
        db,
        "update graphile_worker._private_job_queues set locked_at = now(), locked_by = 'pool-x' "
        "where queue_name = 'locked_queue'",
    )

    await utils.cleanup(["GC_JOB_QUEUES"])
    queues = {
        r["queue_name"]
        for r in rows(db, "select queue_name from graphile_worker._private_job_queues")
    }
    assert queues == {"busy_queue", "dead_queue", "locked_queue"}

    await utils.cleanup(
        ["DELETE_PERMAFAILED_JOBS", "GC_JOB_QUEUES", "GC_TASK_IDENTIFIERS"],
        task_identifiers_to_keep=["keep_me"],
    )
    assert ids(db) == {kept.id}
    tasks = {
        r["identifier"] for r in rows(db, "select identifier from graphile_worker._private_tasks")
    }
    assert tasks == {"in_use", "keep_me"}
    queues = {
        r["queue_name"]
        for r in rows(db, "select queue_name from graphile_worker._private_job_queues")
    }
    assert queues == {"busy_queue", "locked_queue"}


async def test_cleanup_rejects_unknown_task_names(utils: WorkerUtils) -> None:
    with pytest.raises(ValueError, match=r"unknown cleanup task.*GC_EVERYTHING"):
        await utils.cleanup(["GC_EVERYTHING"])  # type: ignore[list-item]
