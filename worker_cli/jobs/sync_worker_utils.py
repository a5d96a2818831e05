"""SyncWorkerUtils: the blocking twin of WorkerUtils, for code without an event loop.

``make_sync_worker_utils`` mirrors ``make_worker_utils`` name for name (the same
methods, keyword arguments and return types, a context manager)::

    with make_sync_worker_utils(connection_string=URL) as utils:
        job = utils.add_job("send_email", {"to": "a@b.c"}, queue_name="mail")

For Django, Flask, scripts and a web server's worker threads: no event loop is
started, and one SyncWorkerUtils may be used from any number of threads at
once (its ``psycopg_pool.ConnectionPool`` hands each call a connection of its
own; on a given connection the calls take turns). With ``connection=`` it uses
the caller's psycopg ``Connection`` as it is, inside the caller's transaction.

Like :mod:`worker_cli.jobs.worker_utils`, it holds no logic of its own: each method
runs the plan of :class:`~worker_cli.jobs.utils_plans.UtilsPlans` with the blocking
driver (:func:`worker_cli.db.drivers.run_plan`), so both twins check, encode and
send exactly the same things.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import datetime, timedelta
from typing import Any, TypeVar, Unpack, overload

import psycopg
from psycopg_pool import ConnectionPool

from ..config.database import load_dotenv_file, resolve_connection_string, resolve_schema
from ..db.connections import check_connection_sync, connect_sync
from ..db.drivers import autocommit_mode, run_plan
from ..db.given_connection import check_given_connection, check_given_pool
from ..db.held_connection import (
    own_pool,
    sync_holding_connection,
    sync_lent_connection,
    sync_pool_connection,
)
from ..db.plan import Plan
from ..errors import ConfigurationError
from ..schema.channels import finished_channel
from ..schema.cleanup import CleanupTask
from ..schema.migrate import MigrationReport
from .flow_control import SyncFlowControl
from .job import Job
from .job_records import SyncJobRecords
from .job_spec import AddJobOptions, JobKeyMode, JobSpec, TaskSpec
from .payloads import NamedPayload, job_identity
from .results import JobResult, JobState
from .sync_waiting import SyncWaitListener, wait_blocking
from .unique import UniqueJobResult, UniqueSpec
from .utils_plans import UtilsPlans
from .waiting import Until, Waiting, check_wait

__all__ = ["SyncWorkerUtils", "make_sync_worker_utils", "quick_add_job_sync"]

T = TypeVar("T")


class SyncWorkerUtils(SyncFlowControl, SyncJobRecords):
    """:class:`~worker_cli.jobs.worker_utils.WorkerUtils`, blocking: job administration
    over a ``psycopg_pool.ConnectionPool``, or over the caller's connection
    (``connection``); see :func:`make_sync_worker_utils`. Safe to share
    between threads."""

    def __init__(
        self,
        pool: ConnectionPool[Any] | None,
        schema: str,
        *,
        connection: psycopg.Connection[Any] | None = None,
        use_local_time: bool = False,
    ) -> None:
        if (pool is None) == (connection is None):
            raise TypeError("SyncWorkerUtils needs a pool or a connection (one of them)")
        self._pool = pool
        self.schema = schema
        self._given = connection
        # One plan at a time on a given connection (if threads share it): a
        # plan's savepoint must not interleave with another's statements.
        self._given_lock = threading.Lock()
        self._plans = UtilsPlans(schema, use_local_time=use_local_time)
        # The LISTEN thread of wait_for_job (started at the first wait).
        self._listener: SyncWaitListener | None = None
        self._listener_lock = threading.Lock()

    def close(self) -> None:
        """Stop what ``wait_for_job`` started (its LISTEN thread and connection);
        the pool is left open. ``make_sync_worker_utils`` calls it on exit."""
        with self._listener_lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()

    @property
    def use_local_time(self) -> bool:
        """Whether a job added without ``run_at`` gets this process's time (UTC)
        rather than the database's ``now()`` (graphile-worker's ``useNodeTime``)."""
        return self._plans.use_local_time

    @property
    def pool(self) -> ConnectionPool[Any]:
        """The pool the utilities take connections from (none with ``connection=``)."""
        if self._pool is None:
            raise ConfigurationError("these SyncWorkerUtils use the connection given, not a pool")
        return self._pool

    def connection(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        """A connection from the pool; inside :meth:`holding_connection` on the same
        pool (the same thread), the connection held there. Taking a second
        one could wait forever: tasks holding connections can exhaust the pool.
        With ``connection=``, that connection. A connection of a pool the
        package opened goes back to it reset (what the block set is undone;
        see :mod:`worker_cli.db.held_connection`)."""
        if self._given is not None:
            return nullcontext(self._given)
        return sync_lent_connection(self.pool)

    def holding_connection(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        """A connection for the block, which this pool's methods called inside it
        use too (so they also join any transaction open on it). With
        ``connection=``, that connection."""
        if self._given is not None:
            return nullcontext(self._given)
        return sync_holding_connection(self.pool)

    @overload
    def add_job(
        self,
        identifier: str,
        payload: Any = None,
        *,
        queue_name: str | None = None,
        run_at: datetime | None = None,
        max_attempts: int | None = None,
        job_key: str | None = None,
        job_key_mode: JobKeyMode | None = None,
        priority: int | None = None,
        flags: Sequence[str] | None = None,
        timeout: float | timedelta | None = None,
        unique: None = None,
    ) -> Job: ...

    @overload
    def add_job(
        self,
        identifier: str,
        payload: Any = None,
        *,
        queue_name: str | None = None,
        run_at: datetime | None = None,
        max_attempts: int | None = None,
        job_key: str | None = None,
        job_key_mode: JobKeyMode | None = None,
        priority: int | None = None,
        flags: Sequence[str] | None = None,
        timeout: float | timedelta | None = None,
        unique: UniqueSpec,
    ) -> UniqueJobResult: ...

    # add_job(SendEmail(...)): the payload's class names its task (IDENTIFIER).
    @overload
    def add_job(
        self, payload: NamedPayload, /, *, unique: None = None, **options: Unpack[AddJobOptions]
    ) -> Job: ...

    @overload
    def add_job(
        self, payload: NamedPayload, /, *, unique: UniqueSpec, **options: Unpack[AddJobOptions]
    ) -> UniqueJobResult: ...

    def add_job(
        self,
        identifier: str | NamedPayload,
        payload: Any = None,
        *,
        queue_name: str | None = None,
        run_at: datetime | None = None,
        max_attempts: int | None = None,
        job_key: str | None = None,
        job_key_mode: JobKeyMode | None = None,
        priority: int | None = None,
        flags: Sequence[str] | None = None,
        timeout: float | timedelta | None = None,
        unique: UniqueSpec | None = None,
    ) -> Job | UniqueJobResult:
        """Add one job (or update the pending job with the same ``job_key``).

        With ``unique`` (a :class:`UniqueRule` or a dict of its fields) the job
        is added only if no "same" job blocks it, and the result is a
        :class:`UniqueJobResult` whose ``conflict`` tells which happened.

        The payload may be a dataclass instance or a pydantic model; one whose
        class names its task (``IDENTIFIER``) needs no identifier.
        """
        options = TaskSpec(
            queue_name=queue_name,
            run_at=run_at,
            max_attempts=max_attempts,
            job_key=job_key,
            job_key_mode=job_key_mode,
            priority=priority,
            flags=flags,
            timeout=timeout,
        )
        return self._run(self._plans.add_job(identifier, payload, options, unique))

    @overload
    def add_jobs(
        self,
        specs: Sequence[JobSpec | Mapping[str, Any]],
        *,
        job_key_preserve_run_at: bool = False,
        unique: None = None,
    ) -> list[Job]: ...

    @overload
    def add_jobs(
        self,
        specs: Sequence[JobSpec | Mapping[str, Any]],
        *,
        job_key_preserve_run_at: bool = False,
        unique: UniqueSpec | Sequence[UniqueSpec | None],
    ) -> list[UniqueJobResult]: ...

    def add_jobs(
        self,
        specs: Sequence[JobSpec | Mapping[str, Any]],
        *,
        job_key_preserve_run_at: bool = False,
        unique: UniqueSpec | Sequence[UniqueSpec | None] | None = None,
    ) -> list[Job] | list[UniqueJobResult]:
        """Add many jobs, all or none; results are not in the order of ``specs``.

        Ids follow the order of ``specs``. Two specs with one ``job_key`` are
        refused (JobSpecError); PostgreSQL refuses them in Node's add_jobs too.

        With ``unique`` (one rule for every spec, or a list with one rule or
        None per spec) the specs are added one after the other, each compared
        with the existing jobs and the earlier specs, and the results are
        :class:`UniqueJobResult` in the order of ``specs``.
        """
        plan = self._plans.add_jobs(
            specs, job_key_preserve_run_at=job_key_preserve_run_at, unique=unique
        )
        return self._run(plan)

    def remove_job(self, job_key: str) -> Job | None:
        """Delete the pending job with this key; a running one is kept from retrying."""
        return self._run(self._plans.remove_job(job_key))

    def cancel_job(self, job_id: int, reason: str | None = None) -> JobState:
        """Cancel a job (README, "Cancel"); its state after the call:
        ``cancelled``, ``running`` (told), or that of a job already gone."""
        return (self._run(self._plans.cancel_jobs([job_id], reason)))[job_id]  # type: ignore[no-any-return]

    def cancel_jobs(self, job_ids: Sequence[int], reason: str | None = None) -> dict[int, JobState]:
        """Cancel several jobs in one transaction (see :meth:`cancel_job`);
        each id with its state after the call."""
        return self._run(self._plans.cancel_jobs(job_ids, reason))

    def wait_for_job(
        self,
        job_id: int,
        timeout: float | None = None,
        *,
        until: Until = "final",
        allow_in_task: bool = False,
    ) -> JobResult:
        """Block until the job is finished, and return its record; see
        :meth:`WorkerUtils.wait_for_job <worker_cli.jobs.worker_utils.WorkerUtils.wait_for_job>`
        (the same arguments and rules)."""
        check_wait(
            job_id, timeout, until, allow_in_task=allow_in_task, given=self._given is not None
        )
        with self._listener_lock:
            if self._listener is None:
                self._listener = SyncWaitListener(self.pool, finished_channel(self.schema))
            listener = self._listener
        return wait_blocking(self.pool, self._plans, listener, Waiting(job_id, timeout, until))

    def complete_jobs(self, job_ids: Sequence[int]) -> list[Job]:
        """Mark jobs as done (delete them); locked jobs are skipped unless stale."""
        return self._run(self._plans.complete_jobs(job_ids))

    def permanently_fail_jobs(self, job_ids: Sequence[int], reason: str | None = None) -> list[Job]:
        """Fail jobs for good, keeping them with ``reason`` as their last error."""
        return self._run(self._plans.permanently_fail_jobs(job_ids, reason))

    def reschedule_jobs(
        self,
        job_ids: Sequence[int],
        *,
        run_at: datetime | None = None,
        priority: int | None = None,
        attempts: int | None = None,
        max_attempts: int | None = None,
    ) -> list[Job]:
        """Change the given fields of jobs; fields left as None are kept."""
        plan = self._plans.reschedule_jobs(
            job_ids, run_at=run_at, priority=priority, attempts=attempts, max_attempts=max_attempts
        )
        return self._run(plan)

    def force_unlock_workers(self, worker_ids: Sequence[str]) -> None:
        """Release every job and queue locked by these worker pools (crashed ones)."""
        self._run(self._plans.force_unlock_workers(worker_ids))

    def cleanup(
        self,
        tasks: Sequence[CleanupTask] = ("GC_JOB_QUEUES", "GC_UNIQUE_LOCKS"),
        *,
        task_identifiers_to_keep: Sequence[str] = (),
    ) -> None:
        """Delete unused queues, unused task identifiers, permanently failed jobs
        and/or expired uniqueness locks (``GC_UNIQUE_LOCKS``)."""
        plan = self._plans.cleanup(tasks, task_identifiers_to_keep=task_identifiers_to_keep)
        self._run(plan, autocommit=True)

    def gc_unique_locks(self) -> int:
        """Delete the uniqueness locks that can never block again; return how many.

        The worker calls this from its periodic sweep; ``--cleanup
        GC_UNIQUE_LOCKS`` runs it once. A few hundred locks per transaction,
        until none is left (locks busy with a concurrent add are left for the
        next run); with ``connection=`` in a transaction, all in that
        transaction. Nothing to do, and no error, on a schema without them.
        """
        return self._run(self._plans.gc_unique_locks(), autocommit=True)

    def migrate(self) -> MigrationReport:
        """Install or upgrade the schema (see :mod:`worker_cli.schema.migrate`).

        Each revision is a transaction of its own; with ``connection=`` in a
        transaction, a savepoint of it: the schema is there once the caller
        commits, and gone if it rolls back.
        """
        return self._run(self._plans.migrate(), autocommit=True)

    def _run(self, plan: Plan[T], *, autocommit: bool = False) -> T:
        """Run ``plan`` on the caller's connection, or on one of the pool's (in
        autocommit mode if asked: a migration, batched deletes)."""
        if self._given is not None:
            with self._given_lock:
                return run_plan(self._given, plan, joined=True)
        if autocommit:
            with self.pool.connection() as conn, autocommit_mode(conn):
                return run_plan(conn, plan)
        with sync_pool_connection(self.pool) as conn:
            return run_plan(conn, plan)


@contextmanager
def make_sync_worker_utils(
    connection_string: str | None = None,
    *,
    schema: str | None = None,
    pool: ConnectionPool[Any] | None = None,
    connection: psycopg.Connection[Any] | None = None,
    max_pool_size: int = 10,
    no_prepared_statements: bool = False,
    use_local_time: bool = False,
) -> Iterator[SyncWorkerUtils]:
    """Open SyncWorkerUtils on a new ``psycopg_pool.ConnectionPool`` (closed on
    exit), on ``pool`` (left open), or on ``connection``: that psycopg
    ``Connection`` as it is, joining
    its open transaction; it is never committed, rolled back, closed or
    switched to another autocommit mode (see the README, "Your connection,
    your transaction"). ``use_local_time``: jobs added without ``run_at`` get
    this process's time."""
    schema_name = resolve_schema(schema)
    if connection is not None:
        check_given_connection(
            connection,
            factory="make_sync_worker_utils",
            expected=psycopg.Connection,
            pool=pool,
            connection_string=connection_string,
        )
        yield SyncWorkerUtils(
            None, schema_name, connection=connection, use_local_time=use_local_time
        )
        return
    if pool is not None:
        check_given_pool(pool, factory="make_sync_worker_utils", expected=ConnectionPool)
        utils = SyncWorkerUtils(pool, schema_name, use_local_time=use_local_time)
        try:
            yield utils
        finally:
            utils.close()
        return
    load_dotenv_file()
    conninfo = resolve_connection_string(connection_string)
    kwargs: dict[str, Any] = {"prepare_threshold": None} if no_prepared_statements else {}
    check_connection_sync(conninfo)
    new_pool: ConnectionPool[Any] = own_pool(
        ConnectionPool(
            conninfo,
            min_size=1,
            max_size=max_pool_size,
            kwargs=kwargs,
            open=False,
            name="graphile-worker-sync-utils",
        )
    )
    new_pool.open(wait=True)
    utils = SyncWorkerUtils(new_pool, schema_name, use_local_time=use_local_time)
    try:
        yield utils
    finally:
        try:
            utils.close()
        finally:
            new_pool.close()


@overload
def quick_add_job_sync(
    identifier: str | NamedPayload,
    payload: Any = None,
    *,
    connection_string: str | None = None,
    schema: str | None = None,
    use_local_time: bool = False,
    unique: None = None,
    **options: Any,
) -> Job: ...


@overload
def quick_add_job_sync(
    identifier: str | NamedPayload,
    payload: Any = None,
    *,
    connection_string: str | None = None,
    schema: str | None = None,
    use_local_time: bool = False,
    unique: UniqueSpec,
    **options: Any,
) -> UniqueJobResult: ...


def quick_add_job_sync(
    identifier: str | NamedPayload,
    payload: Any = None,
    *,
    connection_string: str | None = None,
    schema: str | None = None,
    use_local_time: bool = False,
    unique: UniqueSpec | None = None,
    **options: Any,
) -> Job | UniqueJobResult:
    """:func:`~worker_cli.jobs.worker_utils.quick_add_job`, blocking: add one job with
    a short-lived connection; options as for ``add_job``; ``use_local_time``
    as for :func:`make_sync_worker_utils`."""
    identifier, payload = job_identity(identifier, payload)
    load_dotenv_file()
    conninfo = resolve_connection_string(connection_string)
    with connect_sync(conninfo, autocommit=True) as conn:
        utils = SyncWorkerUtils(
            None, resolve_schema(schema), connection=conn, use_local_time=use_local_time
        )
        if unique is None:
            job: Job = utils.add_job(identifier, payload, **options)
            return job
        result: UniqueJobResult = utils.add_job(identifier, payload, unique=unique, **options)
        return result
