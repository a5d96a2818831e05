"""WorkerUtils: add and administer jobs from Python, without running a worker.

``make_worker_utils`` mirrors graphile-worker's ``makeWorkerUtils``::

    async with make_worker_utils(connection_string=URL) as utils:
        job = await utils.add_job("send_email", {"to": "a@b.c"}, queue_name="mail")

:mod:`worker_cli.client.worker_utils` is the asyncio facade;
:mod:`worker_cli.client.sync_worker_utils` is its blocking twin, generated from it
by ``tools/async_to_sync.py``: the same methods, keyword arguments and return
types, name for name. The twin is for Django, Flask, scripts and a web
server's worker threads: no event loop is started, and one utilities object
may be used from any number of threads at once (its
``psycopg_pool.ConnectionPool`` hands each call a connection of its own; on a
given connection the calls take turns).

Neither holds any logic of its own: each method asks
:class:`~worker_cli.client.utils_plans.UtilsPlans` for a plan (the checked
arguments, the statements and the decoding of their rows, written once for
both) and runs it with its driver (:mod:`worker_cli.db.drivers`) on a
connection of its pool, or on the caller's connection (``connection=``), whose
transaction it joins. Only the choice of connection and the waiting
(:mod:`.async_waiting`) differ between the twins.
"""

from __future__ import annotations

import asyncio  # async-only
import logging  # async-only
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from datetime import datetime, timedelta
from typing import Any, TypeVar, Unpack, overload

import psycopg
from psycopg_pool import AsyncConnectionPool

from ..config.database import load_dotenv_file, resolve_connection_string, resolve_schema
from ..db import held_connection
from ..db.connections import check_connection, connect
from ..db.drivers import autocommit_mode_async, run_plan_async
from ..db.given_connection import check_given_connection, check_given_pool
from ..db.plan import Plan
from ..errors import ConfigurationError, GraphileWorkerError
from ..jobs.job import Job
from ..jobs.job_spec import AddJobOptions, JobKeyMode, JobSpec, TaskSpec
from ..jobs.job_state import AttemptError, JobLog, JobProgress, JobResult, JobState
from ..jobs.limit_spec import Limit, LimitInfo
from ..jobs.pause_spec import Pause
from ..jobs.payloads import NamedPayload, job_identity
from ..jobs.schedule import Schedule
from ..jobs.unique import UniqueJobResult, UniqueSpec
from ..jobs.workflow import Workflow
from ..jobs.workflow_state import AddedWorkflow, WorkflowInfo
from ..schema.channels import finished_channel
from ..schema.cleanup_tasks import CleanupTask
from ..schema.migrate import MigrationReport
from . import schedule_plans, workflow_plans

# sync-only: from .sync_waiting import SyncWaitListener, wait_blocking
from .async_waiting import AsyncWaitListener, wait_async  # async-only
from .job_waiting import Until, Waiting, check_wait
from .utils_plans import UtilsPlans
from .workflow_plans import (
    WorkflowNotFound,
    WorkflowWaitTimeout,
    check_workflow_id,
    check_workflow_wait,
)

__all__ = [
    "CleanupTask",
    "WorkerUtils",
    "make_worker_utils",
    "quick_add_job",
    "sweep_unique_locks",  # async-only
]

logger = logging.getLogger("graphile_worker")  # async-only

T = TypeVar("T")


class WorkerUtils:
    """Job administration over a connection pool, or over the caller's
    connection (``connection``); see :func:`make_worker_utils`. Safe to share
    between asyncio tasks."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Any] | None,
        schema: str,
        *,
        connection: psycopg.AsyncConnection[Any] | None = None,
        use_local_time: bool = False,
    ) -> None:
        if (pool is None) == (connection is None):
            raise TypeError("WorkerUtils needs a pool or a connection (one of them)")
        self._pool = pool
        self.schema = schema
        self._given = connection
        # One plan at a time on a given connection: a plan's savepoint must
        # not interleave with another's statements.
        self._given_lock = asyncio.Lock()
        self._plans = UtilsPlans(schema, use_local_time=use_local_time)
        # The LISTEN connection of wait_for_job (started at the first wait).
        self._listener: AsyncWaitListener | None = None
        # Held to start or stop the listener (threads share a SyncWorkerUtils).
        self._listener_lock = threading.Lock()

    async def close(self) -> None:
        """Stop what ``wait_for_job`` started (its LISTEN connection); the pool
        is left open. ``make_worker_utils`` calls it on exit."""
        with self._listener_lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            await listener.close()

    @property
    def use_local_time(self) -> bool:
        """Whether a job added without ``run_at`` gets this process's time (UTC)
        rather than the database's ``now()`` (graphile-worker's ``useNodeTime``)."""
        return self._plans.use_local_time

    @property
    def pool(self) -> AsyncConnectionPool[Any]:
        """The pool the utilities take connections from (none with ``connection=``)."""
        if self._pool is None:
            raise ConfigurationError("these WorkerUtils use the connection given, not a pool")
        return self._pool

    def connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        """A connection from the pool; inside :meth:`holding_connection` on the same
        pool (the same asyncio task), the connection held there. Taking a second
        one could wait forever: tasks holding connections can exhaust the pool.
        With ``connection=``, that connection. A connection of a pool the
        package opened goes back to it reset (what the block set is undone;
        see :mod:`worker_cli.db.held_connection`)."""
        if self._given is not None:
            return nullcontext(self._given)
        return held_connection.lent_connection(self.pool)

    def holding_connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        """A connection for the block, which this pool's methods called inside it
        use too (so they also join any transaction open on it). With
        ``connection=``, that connection."""
        if self._given is not None:
            return nullcontext(self._given)
        return held_connection.holding_connection(self.pool)

    @overload
    async def add_job(
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
        timeout: float | timedelta | None = None,  # noqa: ASYNC109 (the job's, not the call's)
        unique: None = None,
    ) -> Job: ...

    @overload
    async def add_job(
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
        timeout: float | timedelta | None = None,  # noqa: ASYNC109 (the job's, not the call's)
        unique: UniqueSpec,
    ) -> UniqueJobResult: ...

    # add_job(SendEmail(...)): the payload's class names its task (IDENTIFIER).
    @overload
    async def add_job(
        self, payload: NamedPayload, /, *, unique: None = None, **options: Unpack[AddJobOptions]
    ) -> Job: ...

    @overload
    async def add_job(
        self, payload: NamedPayload, /, *, unique: UniqueSpec, **options: Unpack[AddJobOptions]
    ) -> UniqueJobResult: ...

    async def add_job(
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
        timeout: float | timedelta | None = None,  # noqa: ASYNC109 (the job's, not the call's)
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
        return await self._run(self._plans.add_job(identifier, payload, options, unique))

    @overload
    async def add_jobs(
        self,
        specs: Sequence[JobSpec | Mapping[str, Any]],
        *,
        job_key_preserve_run_at: bool = False,
        unique: None = None,
    ) -> list[Job]: ...

    @overload
    async def add_jobs(
        self,
        specs: Sequence[JobSpec | Mapping[str, Any]],
        *,
        job_key_preserve_run_at: bool = False,
        unique: UniqueSpec | Sequence[UniqueSpec | None],
    ) -> list[UniqueJobResult]: ...

    async def add_jobs(
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
        return await self._run(plan)

    async def remove_job(self, job_key: str) -> Job | None:
        """Delete the pending job with this key; a running one is kept from retrying."""
        return await self._run(self._plans.remove_job(job_key))

    async def cancel_job(self, job_id: int, reason: str | None = None) -> JobState:
        """Cancel a job (README, "Cancel"); its state after the call:
        ``cancelled``, ``running`` (told), or that of a job already gone."""
        return (await self._run(self._plans.cancel_jobs([job_id], reason)))[job_id]  # type: ignore[no-any-return]

    async def cancel_jobs(
        self, job_ids: Sequence[int], reason: str | None = None
    ) -> dict[int, JobState]:
        """Cancel several jobs in one transaction (see :meth:`cancel_job`);
        each id with its state after the call."""
        return await self._run(self._plans.cancel_jobs(job_ids, reason))

    async def get_job_status(self, job_id: int) -> JobState:
        """The state of a job (see :data:`~worker_cli.jobs.job_state.JobState`):
        the word every command prints; ``paused`` for a job a pause holds
        (:meth:`get_job_result`'s ``paused_by`` says which)."""
        return (await self._run(self._plans.job_result(job_id))).state

    async def get_job_result(self, job_id: int) -> JobResult:
        """What is known of a job: its state, times, last error and, once it has
        succeeded, its result (``.result``; see :class:`JobResult`)."""
        return await self._run(self._plans.job_result(job_id))

    async def get_job_errors(self, job_id: int) -> list[AttemptError]:
        """Every failed attempt of a job that a Python worker recorded (kept 7
        days), oldest first; empty for a job that never failed on one."""
        return await self._run(self._plans.job_errors(job_id))

    async def get_job_logs(self, job_id: int) -> list[JobLog]:
        """The lines its task logged through ``helpers.logger`` in each kept
        attempt (``--job-logs``: failed attempts by default), oldest first;
        kept 7 days."""
        return await self._run(self._plans.job_logs(job_id))

    async def wait_for_job(
        self,
        job_id: int,
        timeout: float | None = None,  # noqa: ASYNC109 (the sync twin's argument)
        *,
        until: Until = "final",
        allow_in_task: bool = False,
        on_progress: Callable[[JobProgress], object] | None = None,
    ) -> JobResult:
        """Wait until the job is finished (``succeeded``, ``cancelled``, ``failed`` or
        ``unknown``; with ``until="attempt"`` also ``retrying``, or ``paused`` after a
        failed attempt) and return its record (as :meth:`get_job_result`). ``timeout``
        (seconds) raises :class:`WaitTimeout`, leaving the job alone. Refused inside a
        task of this process's worker unless ``allow_in_task``. ``on_progress``
        is called with each new progress of the job seen while waiting (it is
        read twice a second then). See
        :mod:`worker_cli.client.job_waiting` and the README."""
        check_wait(
            job_id, timeout, until, allow_in_task=allow_in_task, given=self._given is not None
        )
        with self._listener_lock:
            if self._listener is None:
                self._listener = AsyncWaitListener(self.pool, finished_channel(self.schema))
            listener = self._listener
        waiting = Waiting(job_id, timeout, until, on_progress=on_progress)
        return await wait_async(self.pool, self._plans, listener, waiting)

    async def add_schedule(
        self,
        identifier: str,
        pattern: str,
        task_identifier: str,
        payload: Mapping[str, Any] | None = None,
        *,
        tz: str | None = None,
        fill: timedelta | float | str | None = None,
        queue_name: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        job_key: str | None = None,
        paused: bool = False,
    ) -> Schedule:
        """Add a schedule to the database, or replace the one of this
        ``identifier`` (README, "Schedules in the database"): every Python
        worker fires it as a crontab line (``pattern``'s five fields, in
        ``tz``; ``fill``: the backfill period, a timedelta, seconds or a
        phrase like ``2d``), within a second or two, without a restart. An
        identifier a crontab item uses, a pattern that never fires, an
        unknown zone or a payload over 64 KiB is refused with one line
        naming the field, nothing written."""
        plan = schedule_plans.add_schedule(
            self.schema,
            identifier,
            pattern,
            task_identifier,
            payload,
            tz=tz,
            fill=fill,
            queue_name=queue_name,
            priority=priority,
            max_attempts=max_attempts,
            job_key=job_key,
            paused=paused,
        )
        return await self._run(plan)

    async def remove_schedule(self, identifier: str) -> bool:
        """Remove a schedule; whether there was one (its jobs already added stay)."""
        return await self._run(schedule_plans.remove_schedule(self.schema, identifier))

    async def pause_schedule(self, identifier: str) -> Schedule | None:
        """Pause a schedule: it adds no job until resumed (None: no such schedule)."""
        return await self._run(schedule_plans.pause_schedule(self.schema, identifier, True))

    async def resume_schedule(self, identifier: str) -> Schedule | None:
        """Resume a paused schedule from now on (the paused time is never
        backfilled); None: no such schedule."""
        return await self._run(schedule_plans.resume_schedule(self.schema, identifier))

    async def list_schedules(self) -> list[Schedule]:
        """Every schedule in the database, by identifier."""
        return await self._run(schedule_plans.list_schedules(self.schema))

    async def get_schedule(self, identifier: str) -> Schedule | None:
        """One schedule (None: no such schedule)."""
        return await self._run(schedule_plans.get_schedule(self.schema, identifier))

    async def add_workflow(self, workflow: Workflow) -> AddedWorkflow:
        """Add a workflow whole (README, "Workflows"): its steps, their links,
        and its root steps' jobs, in one transaction (the caller's with
        ``connection=``); refused whole, with one line naming the step, for
        anything :meth:`Workflow.check` or ``add_job`` would refuse."""
        return await self._run(workflow_plans.add_workflow(self.schema, workflow))

    async def get_workflow(self, workflow_id: int) -> WorkflowInfo | None:
        """A workflow's state, counts and steps by ref (None: no such
        workflow, or pruned)."""
        return await self._run(workflow_plans.get_workflow(self.schema, workflow_id))

    async def list_workflows(
        self, *, state: str | None = None, limit: int = 100, before: int | None = None
    ) -> list[WorkflowInfo]:
        """Workflows newest first (of one ``state``; ids below ``before``),
        without their steps."""
        return await self._run(workflow_plans.list_workflows(self.schema, state, limit, before))

    async def wait_for_workflow(
        self,
        workflow_id: int,
        timeout: float | None = None,  # noqa: ASYNC109 (the sync twin's argument)
        *,
        allow_in_task: bool = False,
    ) -> WorkflowInfo:
        """Wait until the workflow is final and return it (as
        :meth:`get_workflow`); ``timeout`` (seconds) raises
        :class:`WorkflowWaitTimeout`. Read again every 50 ms, growing to 1 s.
        Refused inside a task of this process's worker unless ``allow_in_task``."""
        check_workflow_wait(workflow_id, timeout, allow_in_task=allow_in_task)
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.05
        while True:
            info = await self.get_workflow(workflow_id)
            if info is None:
                raise WorkflowNotFound(workflow_id)
            if info.finished:
                return info
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WorkflowWaitTimeout(workflow_id, timeout or 0.0, info)
                pause = min(pause, left)
            await asyncio.sleep(pause)  # sync: time.sleep(pause)
            pause = min(pause * 2, 1.0)

    async def cancel_workflow(self, workflow_id: int, reason: str | None = None) -> str | None:
        """Cancel a workflow: no step of it starts any more, its waiting
        steps' jobs are cancelled, its running ones asked to stop (as
        :meth:`cancel_job`). Its state after the call (None: no such workflow)."""
        return await self._run(workflow_plans.cancel_workflow(self.schema, workflow_id, reason))

    async def retry_workflow(self, workflow_id: int) -> int | None:
        """Run a workflow's failed and cancelled steps again, and the steps
        after them; the others keep their outcomes and results. How many
        steps run again (None: no such workflow)."""
        return await self._run(workflow_plans.retry_workflow(self.schema, workflow_id))

    async def extend_workflow(
        self, workflow_id: int, from_ref: str, workflow: Workflow, hold_dependents: bool = False
    ) -> int:
        """Add the steps of ``workflow`` to a workflow, after its running step
        ``from_ref`` (what a step's ``helpers.add_steps`` does); how many."""
        check_workflow_id(workflow_id)
        plan = workflow_plans.extend_workflow(
            self.schema, workflow_id, from_ref, workflow, hold_dependents
        )
        return await self._run(plan)

    async def complete_jobs(self, job_ids: Sequence[int]) -> list[Job]:
        """Mark jobs as done (delete them); locked jobs are skipped unless stale."""
        return await self._run(self._plans.complete_jobs(job_ids))

    async def permanently_fail_jobs(
        self, job_ids: Sequence[int], reason: str | None = None
    ) -> list[Job]:
        """Fail jobs for good, keeping them with ``reason`` as their last error."""
        return await self._run(self._plans.permanently_fail_jobs(job_ids, reason))

    async def reschedule_jobs(
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
        return await self._run(plan)

    async def force_unlock_workers(self, worker_ids: Sequence[str]) -> None:
        """Release every job and queue locked by these worker pools (crashed ones)."""
        await self._run(self._plans.force_unlock_workers(worker_ids))

    async def pause(
        self,
        *,
        queue: str | None = None,
        task: str | None = None,
        until: datetime | timedelta | float | None = None,
        reason: str | None = None,
        hold_queue_lock: bool = False,
    ) -> Pause:
        """Pause a named queue or a task identifier (``*``: every queue, or
        every task) across every Python worker: their jobs do not start until
        :meth:`resume`, or ``until`` (an aware datetime, or how long: a
        timedelta or seconds). Running jobs finish; jobs can still be added.
        ``hold_queue_lock`` keeps Node workers off the queue too (README,
        "Pause and resume"). Pausing again replaces ``until``, ``reason`` and
        the hold. Returns the pause."""
        return await self._run(self._plans.pause(queue, task, until, reason, hold_queue_lock))

    async def resume(self, *, queue: str | None = None, task: str | None = None) -> bool:
        """End a pause (see :meth:`pause`); whether there was one."""
        return await self._run(self._plans.resume(queue, task))

    async def list_pauses(self) -> list[Pause]:
        """The pauses in force, by kind and name."""
        return await self._run(self._plans.list_pauses())

    async def set_limit(
        self,
        limit: Limit,
        *,
        queue: str | None = None,
        task: str | None = None,
        operation: str | None = None,
    ) -> LimitInfo:
        """Limit a task, a named queue, or an operation tasks do in their body
        (``helpers.limit``), across every Python worker (README, "Concurrency
        and rate limits"): ``Limit(max_running=..., max_starts=..., per=...,
        partition_by=...)``; replaces its limit if it had one, live. Returns
        the limit as stored, with its use."""
        return await self._run(self._plans.set_limit(limit, queue, task, operation))

    async def remove_limit(
        self, *, queue: str | None = None, task: str | None = None, operation: str | None = None
    ) -> bool:
        """Remove a task's, a queue's or an operation's limit; whether it had one."""
        return await self._run(self._plans.remove_limit(queue, task, operation))

    async def list_limits(self) -> list[LimitInfo]:
        """Every limit, with how much of it is in use now."""
        return await self._run(self._plans.list_limits())

    async def cleanup(
        self,
        tasks: Sequence[CleanupTask] = ("GC_JOB_QUEUES", "GC_UNIQUE_LOCKS"),
        *,
        task_identifiers_to_keep: Sequence[str] = (),
    ) -> None:
        """Delete unused queues, unused task identifiers, permanently failed jobs
        and/or expired uniqueness locks (``GC_UNIQUE_LOCKS``)."""
        plan = self._plans.cleanup(tasks, task_identifiers_to_keep=task_identifiers_to_keep)
        await self._run(plan, autocommit=True)

    async def gc_unique_locks(self) -> int:
        """Delete the uniqueness locks that can never block again; return how many.

        The worker calls this from its periodic sweep; ``--cleanup
        GC_UNIQUE_LOCKS`` runs it once. A few hundred locks per transaction,
        until none is left (locks busy with a concurrent add are left for the
        next run); with ``connection=`` in a transaction, all in that
        transaction. Nothing to do, and no error, on a schema without them.
        """
        return await self._run(self._plans.gc_unique_locks(), autocommit=True)

    async def migrate(self) -> MigrationReport:
        """Install or upgrade the schema (see :func:`worker_cli.schema.migrate.migrate`).

        Each revision is a transaction of its own; with ``connection=`` in a
        transaction, a savepoint of it: the schema is there once the caller
        commits, and gone if it rolls back.
        """
        return await self._run(self._plans.migrate(), autocommit=True)

    async def _run(self, plan: Plan[T], *, autocommit: bool = False) -> T:
        """Run ``plan`` on the caller's connection, or on one of the pool's (in
        autocommit mode if asked: a migration, batched deletes)."""
        if self._given is not None:
            async with self._given_lock:
                return await run_plan_async(self._given, plan, joined=True)
        if autocommit:
            async with self.pool.connection() as conn, autocommit_mode_async(conn):
                return await run_plan_async(conn, plan)
        async with held_connection.pool_connection(self.pool) as conn:
            return await run_plan_async(conn, plan)


@asynccontextmanager
async def make_worker_utils(
    connection_string: str | None = None,
    *,
    schema: str | None = None,
    pool: AsyncConnectionPool[Any] | None = None,
    connection: psycopg.AsyncConnection[Any] | None = None,
    max_pool_size: int = 10,
    no_prepared_statements: bool = False,
    use_local_time: bool = False,
) -> AsyncIterator[WorkerUtils]:
    """Open WorkerUtils on a new pool (closed on exit), on ``pool`` (left open),
    or on ``connection``: that psycopg ``AsyncConnection`` as it is, joining
    its open transaction; it is never committed, rolled back, closed or
    switched to another autocommit mode (see the README, "Your connection,
    your transaction"). ``use_local_time``: jobs added without ``run_at`` get
    this process's time."""
    schema_name = resolve_schema(schema)
    if connection is not None:
        check_given_connection(
            connection,
            factory="make_worker_utils",
            expected=psycopg.AsyncConnection,
            pool=pool,
            connection_string=connection_string,
        )
        yield WorkerUtils(None, schema_name, connection=connection, use_local_time=use_local_time)
        return
    if pool is not None:
        check_given_pool(pool, factory="make_worker_utils", expected=AsyncConnectionPool)
        utils = WorkerUtils(pool, schema_name, use_local_time=use_local_time)
        try:
            yield utils
        finally:
            await utils.close()
        return
    load_dotenv_file()
    conninfo = resolve_connection_string(connection_string)
    kwargs: dict[str, Any] = {"prepare_threshold": None} if no_prepared_statements else {}
    await check_connection(conninfo)
    new_pool: AsyncConnectionPool[Any] = held_connection.own_pool(
        AsyncConnectionPool(
            conninfo,
            min_size=1,
            max_size=max_pool_size,
            kwargs=kwargs,
            open=False,
            name="graphile-worker-utils",
        )
    )
    await new_pool.open(wait=True)
    utils = WorkerUtils(new_pool, schema_name, use_local_time=use_local_time)
    try:
        yield utils
    finally:
        try:
            await utils.close()
        finally:
            await new_pool.close()


@overload
async def quick_add_job(
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
async def quick_add_job(
    identifier: str | NamedPayload,
    payload: Any = None,
    *,
    connection_string: str | None = None,
    schema: str | None = None,
    use_local_time: bool = False,
    unique: UniqueSpec,
    **options: Any,
) -> UniqueJobResult: ...


async def quick_add_job(
    identifier: str | NamedPayload,
    payload: Any = None,
    *,
    connection_string: str | None = None,
    schema: str | None = None,
    use_local_time: bool = False,
    unique: UniqueSpec | None = None,
    **options: Any,
) -> Job | UniqueJobResult:
    """Add one job with a short-lived connection; options as for ``add_job``;
    ``use_local_time`` as for :func:`make_worker_utils`."""
    identifier, payload = job_identity(identifier, payload)
    load_dotenv_file()
    conninfo = resolve_connection_string(connection_string)
    async with await connect(conninfo, autocommit=True) as conn:
        utils = WorkerUtils(
            None, resolve_schema(schema), connection=conn, use_local_time=use_local_time
        )
        if unique is None:
            job: Job = await utils.add_job(identifier, payload, **options)
            return job
        result: UniqueJobResult = await utils.add_job(identifier, payload, unique=unique, **options)
        return result


# async-only: begin
async def sweep_unique_locks(utils: WorkerUtils) -> None:
    """The worker's periodic sweep: delete expired locks; a failure is logged, not raised."""
    try:
        deleted = await utils.gc_unique_locks()
    except (psycopg.Error, GraphileWorkerError) as exc:
        logger.warning("Unique-job lock sweep failed: %s", exc)
        return
    if deleted:
        logger.info("Deleted %d expired unique-job lock(s)", deleted)


# async-only: end
