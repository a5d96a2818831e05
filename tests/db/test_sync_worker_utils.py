"""SyncWorkerUtils: the blocking twin of WorkerUtils, used as sync code uses it.

Every method runs in plain functions (no event loop anywhere), from several
threads at once, and the twin's API is checked to mirror the async one name
for name.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import typing
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from dbhelpers import rows, value
from psycopg_pool import AsyncConnectionPool, ConnectionPool

import worker_cli
from worker_cli import (
    ConfigurationError,
    DatabaseConnectionError,
    JobSpecError,
    SchemaNotInstalledError,
    SyncWorkerUtils,
    UniqueJobResult,
    WorkerUtils,
    make_sync_worker_utils,
    make_worker_utils,
    quick_add_job,
    quick_add_job_sync,
)

JOBS = "graphile_worker._private_jobs"

# How the async API's annotations read in the sync twin.
_SYNC_NAMES = {
    "AsyncConnectionPool": "ConnectionPool",
    "psycopg.AsyncConnection": "psycopg.Connection",
    "AbstractAsyncContextManager": "AbstractContextManager",
    "AsyncIterator": "Iterator",
    "WorkerUtils": "SyncWorkerUtils",
}


def _as_sync(annotation: Any) -> Any:
    if not isinstance(annotation, str):
        return annotation
    for async_name, sync_name in _SYNC_NAMES.items():
        annotation = annotation.replace(async_name, sync_name)
    return annotation.replace("SyncSyncWorkerUtils", "SyncWorkerUtils")


def _signature(function: Callable[..., Any], *, translate: bool) -> list[tuple[Any, ...]]:
    """Parameters (name, kind, default, annotation) and the return annotation."""
    sig = inspect.signature(function)
    convert = _as_sync if translate else (lambda annotation: annotation)
    params = [(p.name, p.kind, p.default, convert(p.annotation)) for p in sig.parameters.values()]
    return [*params, ("return", convert(sig.return_annotation))]


def _public(cls: type) -> set[str]:
    return {name for name in vars(cls) if not name.startswith("_")}


@pytest.mark.unit
def test_the_sync_twin_mirrors_the_async_api_name_for_name() -> None:
    assert _public(SyncWorkerUtils) == _public(WorkerUtils)
    for name in sorted(_public(WorkerUtils)):
        async_member = inspect.getattr_static(WorkerUtils, name)
        sync_member = inspect.getattr_static(SyncWorkerUtils, name)
        if isinstance(async_member, property):
            assert isinstance(sync_member, property), name
            async_member, sync_member = async_member.fget, sync_member.fget
        assert inspect.iscoroutinefunction(sync_member) is False, name
        assert _signature(sync_member, translate=False) == _signature(
            async_member, translate=True
        ), name
        async_overloads = typing.get_overloads(async_member)
        sync_overloads = typing.get_overloads(sync_member)
        assert [_signature(f, translate=False) for f in sync_overloads] == [
            _signature(f, translate=True) for f in async_overloads
        ], name
    assert inspect.iscoroutinefunction(WorkerUtils.add_job)
    for async_function, sync_function in (
        (make_worker_utils, make_sync_worker_utils),
        (quick_add_job, quick_add_job_sync),
    ):
        assert _signature(sync_function, translate=False) == _signature(
            async_function, translate=True
        ), sync_function.__name__
    assert {"SyncWorkerUtils", "make_sync_worker_utils", "quick_add_job_sync"} <= set(
        worker_cli.__all__
    )


@pytest.mark.db
def test_every_method_in_plain_sync_code(empty_db: str) -> None:
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()  # no event loop anywhere
    with make_sync_worker_utils(connection_string=empty_db) as utils:
        report = utils.migrate()
        assert report.previous_revision is None and report.revision == 20
        assert utils.migrate().applied == ()

        when = datetime(2030, 1, 2, tzinfo=UTC)
        job = utils.add_job(
            "send_email",
            {"to": "a@b.c"},
            queue_name="mail",
            run_at=when,
            max_attempts=3,
            job_key="k1",
            priority=2,
            flags=["slow"],
        )
        assert (job.task_identifier, job.payload, job.queue_name, job.run_at) == (
            "send_email",
            {"to": "a@b.c"},
            "mail",
            when,
        )
        assert (job.max_attempts, job.key, job.priority, job.flags) == (3, "k1", 2, {"slow": True})

        first = utils.add_job("sync_address", {"user": 7}, unique={"period": 600})
        again = utils.add_job("sync_address", {"user": 7}, unique={"period": 600})
        assert isinstance(first, UniqueJobResult) and not first.conflict
        assert again.conflict and again.job_id == first.job_id

        batch = utils.add_jobs([{"identifier": "resize", "payload": {"n": n}} for n in range(3)])
        assert sorted(j.payload["n"] for j in batch) == [0, 1, 2]
        results = utils.add_jobs(
            [{"identifier": "resize", "payload": {"n": 0}}], unique={"period": 60}
        )
        assert [r.conflict for r in results] == [False]

        [rescheduled] = utils.reschedule_jobs([batch[0].id], priority=9, attempts=1)
        assert (rescheduled.priority, rescheduled.attempts) == (9, 1)
        [failed] = utils.permanently_fail_jobs([batch[1].id], "given up")
        assert failed.last_error == "given up"
        [completed] = utils.complete_jobs([batch[2].id])
        assert completed.id == batch[2].id
        removed = utils.remove_job("k1")
        assert removed is not None and removed.id == job.id
        assert utils.remove_job("k1") is None

        rows(empty_db, f"update {JOBS} set locked_at = now(), locked_by = 'pool-dead'")
        utils.force_unlock_workers(["pool-dead"])
        assert value(empty_db, f"select count(*) from {JOBS} where locked_by is not null") == 0

        utils.cleanup(["DELETE_PERMAFAILED_JOBS", "GC_JOB_QUEUES", "GC_TASK_IDENTIFIERS"])
        assert value(empty_db, f"select count(*) from {JOBS} where id = %s", (failed.id,)) == 0
        rows(empty_db, f"delete from {JOBS}")
        rows(empty_db, "update graphile_worker._private_py_unique_locks set expires_at = now()")
        assert utils.gc_unique_locks() == 2  # sync_address and resize


@pytest.mark.db
def test_errors_are_the_async_ones(empty_db: str, db: str) -> None:
    with make_sync_worker_utils(connection_string=db) as utils:
        with pytest.raises(JobSpecError, match=r"^job_key: is 513 characters long"):
            utils.add_job("t", job_key="k" * 513)
        with pytest.raises(JobSpecError, match=r"^specs\[1\]\.identifier: must not be empty"):
            utils.add_jobs([{"identifier": "t"}, {"identifier": ""}])
        with pytest.raises(ValueError, match="unknown cleanup task"):
            utils.cleanup(["GC_EVERYTHING"])  # type: ignore[list-item]
        assert value(db, f"select count(*) from {JOBS}") == 0
    with (
        make_sync_worker_utils(connection_string=empty_db) as utils,
        pytest.raises(SchemaNotInstalledError, match=r"utils\.migrate\(\)"),
    ):
        utils.add_job("t")
    with (
        pytest.raises(DatabaseConnectionError, match="could not connect"),
        make_sync_worker_utils(connection_string=db.replace("/gwtest_", "/no_such_db_")),
    ):
        pass


@pytest.mark.db
def test_threads_add_jobs_at_once(db: str) -> None:
    """A web server's worker threads share one SyncWorkerUtils (and its pool)."""
    threads, each = 8, 25
    start = threading.Barrier(threads)
    added: list[list[int]] = [[] for _ in range(threads)]
    unique: list[UniqueJobResult] = []
    with make_sync_worker_utils(connection_string=db, max_pool_size=4) as utils:

        def request(n: int) -> None:
            start.wait()
            for i in range(each):
                added[n].append(utils.add_job("t", {"thread": n, "i": i}).id)
            added[n].extend(job.id for job in utils.add_jobs([{"identifier": "t"}] * 2))
            unique.append(utils.add_job("once", {"same": True}, unique={"period": 60}))

        workers = [threading.Thread(target=request, args=(n,)) for n in range(threads)]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
    all_ids = [job_id for ids in added for job_id in ids]
    assert len(all_ids) == len(set(all_ids)) == threads * (each + 2)
    payloads = rows(
        db,
        f"select payload from {JOBS} where task_id = (select id from "
        "graphile_worker._private_tasks where identifier = 't')",
    )
    assert sorted(
        (p["payload"]["thread"], p["payload"]["i"]) for p in payloads if p["payload"]
    ) == [(n, i) for n in range(threads) for i in range(each)]
    assert sorted(result.conflict for result in unique) == [False] + [True] * (threads - 1)
    assert len({result.job_id for result in unique}) == 1


@pytest.mark.db
def test_holding_connection_joins_the_block_per_thread(db: str) -> None:
    with make_sync_worker_utils(connection_string=db, max_pool_size=2) as utils:
        with utils.holding_connection() as conn:
            inside = utils.add_job("t", {"in": "block"})
            # Another thread does not get the held connection (nor its transaction).
            other: list[int] = []
            thread = threading.Thread(target=lambda: other.append(utils.add_job("u").id))
            thread.start()
            thread.join()
            conn.rollback()
        assert value(db, f"select count(*) from {JOBS} where id = %s", (inside.id,)) == 0
        assert value(db, f"select count(*) from {JOBS} where id = %s", (other[0],)) == 1


@pytest.mark.db
def test_a_given_pool_is_left_open(db: str) -> None:
    with ConnectionPool(db, min_size=1, max_size=2) as pool:
        with make_sync_worker_utils(pool=pool) as utils:
            utils.add_job("t")
        assert not pool.closed
        with make_sync_worker_utils(pool=pool) as utils:
            assert utils.pool is pool
            assert utils.add_job("t").id > 0


@pytest.mark.unit
def test_a_pool_of_the_wrong_kind_is_refused() -> None:
    async_pool: AsyncConnectionPool[Any] = AsyncConnectionPool("", open=False)
    with (
        pytest.raises(ConfigurationError, match=r"expects a psycopg_pool\.ConnectionPool"),
        make_sync_worker_utils(pool=async_pool),  # type: ignore[arg-type]
    ):
        pass


@pytest.mark.db
def test_quick_add_job_sync_reads_database_url(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", db)
    job = quick_add_job_sync("hello", {"name": "sync"}, run_at=None, priority=3)
    assert (job.task_identifier, job.payload, job.priority) == ("hello", {"name": "sync"}, 3)
    result = quick_add_job_sync("hello", {"n": 1}, unique={"period": 60})
    assert not result.conflict
    assert value(db, f"select count(*) from {JOBS}") == 2
    # The connection it opened is closed again.
    assert (
        value(
            db,
            "select count(*) from pg_stat_activity where datname = current_database() "
            "and pid <> pg_backend_pid()",
        )
        == 0
    )
