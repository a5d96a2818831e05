"""WorkerUtils: add and administer jobs from Python, without running a worker.

``make_worker_utils`` mirrors graphile-worker's ``makeWorkerUtils``::

    async with make_worker_utils(connection_string=URL) as utils:
        job = await utils.add_job("send_email", {"to": "a@b.c"}, queue_name="mail")

This module is the facade: the SQL is in :mod:`worker_cli.statements`, the
statements returning jobs are sent by :mod:`worker_cli.job_queries`, the held
connection is :mod:`worker_cli.held_connection`'s, and :mod:`worker_cli.cleanup`
and :mod:`worker_cli.schema` hold cleanup and schema probing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from typing import Any, LiteralString, overload

import psycopg
from psycopg_pool import AsyncConnectionPool

from . import statements
from .cleanup import CLEANUP_STATEMENTS, CleanupTask, check_cleanup_tasks, delete_unique_locks
from .config import load_dotenv_file, resolve_connection_string, resolve_schema
from .db import check_connection
from .errors import GraphileWorkerError, JobSpecError
from .held_connection import holding_connection, pool_connection
from .job import Job
from .job_queries import JobQueries, encode_specs, spec_record
from .job_spec import JobKeyMode, JobSpec, TaskSpec, encode_payload, validate_identifier
from .migrate import MigrationReport, migrate
from .schema import autocommit, unique_installed
from .trace_context import carry
from .unique import UniqueJobResult, UniqueRule, UniqueSpec, check_keys_payload, rules_for_specs

__all__ = [
    "CleanupTask",
    "WorkerUtils",
    "make_worker_utils",
    "quick_add_job",
    "sweep_unique_locks",
]

logger = logging.getLogger("graphile_worker")


class WorkerUtils:
    """Job administration over a connection pool; see :func:`make_worker_utils`."""

    def __init__(self, pool: AsyncConnectionPool[Any], schema: str) -> None:
        self.pool = pool
        self.schema = schema
        # Whether the unique-jobs table exists (None: not checked yet).
        self._unique_tables: bool | None = None

    def connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        """A connection from the pool; inside :meth:`holding_connection` on the same
        pool (the same asyncio task), the connection held there. Taking a second
        one could wait forever: tasks holding connections can exhaust the pool."""
        return pool_connection(self.pool)

    def holding_connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        """A connection for the block, which this pool's methods called inside it
        use too (so they also join any transaction open on it)."""
        return holding_connection(self.pool)

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
        unique: UniqueSpec,
    ) -> UniqueJobResult: ...

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
        unique: UniqueSpec | None = None,
    ) -> Job | UniqueJobResult:
        """Add one job (or update the pending job with the same ``job_key``).

        With ``unique`` (a :class:`UniqueRule` or a dict of its fields) the job
        is added only if no "same" job blocks it, and the result is a
        :class:`UniqueJobResult` whose ``conflict`` tells which happened.
        """
        validate_identifier(identifier)
        spec = TaskSpec(
            queue_name=queue_name,
            run_at=run_at,
            max_attempts=max_attempts,
            job_key=job_key,
            job_key_mode=job_key_mode,
            priority=priority,
            flags=flags,
        )
        spec.validate()
        params = {
            "identifier": identifier,
            "payload": encode_payload(payload),
            "queue_name": queue_name,
            "run_at": run_at,
            "max_attempts": max_attempts,
            "job_key": job_key,
            "priority": priority,
            "flags": list(flags) if flags is not None else None,
            "job_key_mode": job_key_mode or "replace",
        }
        if unique is None:
            statement, trace = carry(statements.add_job)
            rows = await self._fetch(statement, {**params, **trace})
            return rows[0]
        rule = UniqueRule.coerce(unique).to_json()
        check_keys_payload(rule, payload)
        params["unique_rule"] = json.dumps(rule)
        statement, trace = carry(statements.add_unique_job, unique=True)
        results = await self._fetch_unique(statement, {**params, **trace})
        return results[0]

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
        if unique is None:
            if not specs:
                return []
            async with self.connection() as conn:
                return await JobQueries(conn, self.schema).insert_jobs(
                    specs, job_key_preserve_run_at
                )
        records = [spec_record(raw, index) for index, raw in enumerate(specs)]
        rules = rules_for_specs(unique, [record["payload"] for record in records])
        if not records:
            return []
        return await self._fetch_unique(
            statements.add_unique_jobs,
            {
                "specs": encode_specs(records),
                "unique_rules": json.dumps(rules),
                "job_key_preserve_run_at": job_key_preserve_run_at,
            },
        )

    async def remove_job(self, job_key: str) -> Job | None:
        """Delete the pending job with this key; a running one is kept from retrying."""
        if not isinstance(job_key, str) or not job_key:
            raise JobSpecError("job_key", "must be a non-empty string")
        # A job an administrator removed no longer blocks its duplicates.
        statement = (
            statements.remove_job_releasing_unique_lock
            if await self._unique_installed()
            else statements.remove_job
        )
        rows = await self._fetch(statement, {"job_key": job_key})
        return rows[0] if rows else None

    async def complete_jobs(self, job_ids: Sequence[int]) -> list[Job]:
        """Mark jobs as done (delete them); locked jobs are skipped unless stale."""
        return await self._fetch(statements.complete_jobs, {"job_ids": list(job_ids)})

    async def permanently_fail_jobs(
        self, job_ids: Sequence[int], reason: str | None = None
    ) -> list[Job]:
        """Fail jobs for good, keeping them with ``reason`` as their last error."""
        return await self._fetch(
            statements.permanently_fail_jobs,
            {"job_ids": list(job_ids), "error_message": reason},
        )

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
        TaskSpec(run_at=run_at, priority=priority, max_attempts=max_attempts).validate()
        if attempts is not None and (isinstance(attempts, bool) or not 0 <= attempts <= 32767):
            raise JobSpecError("attempts", f"is {attempts}; it must be between 0 and 32767")
        return await self._fetch(
            statements.reschedule_jobs,
            {
                "job_ids": list(job_ids),
                "run_at": run_at,
                "priority": priority,
                "attempts": attempts,
                "max_attempts": max_attempts,
            },
        )

    async def force_unlock_workers(self, worker_ids: Sequence[str]) -> None:
        """Release every job and queue locked by these worker pools (crashed ones)."""
        await self._execute(statements.force_unlock_workers, {"worker_ids": list(worker_ids)})

    async def cleanup(
        self,
        tasks: Sequence[CleanupTask] = ("GC_JOB_QUEUES", "GC_UNIQUE_LOCKS"),
        *,
        task_identifiers_to_keep: Sequence[str] = (),
    ) -> None:
        """Delete unused queues, unused task identifiers, permanently failed jobs
        and/or expired uniqueness locks (``GC_UNIQUE_LOCKS``)."""
        check_cleanup_tasks(tasks)
        for name, statement in CLEANUP_STATEMENTS.items():
            if name not in tasks:
                continue
            if name == "GC_UNIQUE_LOCKS":
                await self.gc_unique_locks()
                continue
            if name == "DELETE_PERMAFAILED_JOBS" and await self._unique_installed():
                # A deleted job would otherwise look like a success to its lock.
                statement = statements.delete_permafailed_jobs_releasing_unique_locks
            await self._execute(statement, {"keep": list(task_identifiers_to_keep)})

    async def gc_unique_locks(self) -> int:
        """Delete the uniqueness locks that can never block again; return how many.

        The worker calls this from its periodic sweep; ``--cleanup
        GC_UNIQUE_LOCKS`` runs it once. A few hundred locks per transaction,
        until none is left (locks busy with a concurrent add are left for the
        next run). Nothing to do, and no error, on a schema without them.
        """
        if not await self._unique_installed():
            return 0
        async with self.pool.connection() as conn, autocommit(conn):
            return await delete_unique_locks(conn, self.schema)

    async def migrate(self) -> MigrationReport:
        """Install or upgrade the schema (see :func:`worker_cli.migrate.migrate`)."""
        async with self.pool.connection() as conn, autocommit(conn):
            try:
                return await migrate(conn, self.schema)
            finally:
                self._unique_tables = None

    async def _fetch(self, statement: LiteralString, params: Mapping[str, Any]) -> list[Job]:
        async with self.connection() as conn:
            return await JobQueries(conn, self.schema).jobs(statement, params)

    async def _fetch_unique(
        self, statement: LiteralString, params: Mapping[str, Any]
    ) -> list[UniqueJobResult]:
        async with self.connection() as conn:
            return await JobQueries(conn, self.schema).unique_results(statement, params)

    async def _execute(self, statement: LiteralString, params: Mapping[str, Any]) -> None:
        async with self.connection() as conn:
            await JobQueries(conn, self.schema).execute(statement, params)

    async def _unique_installed(self) -> bool:
        """Whether this schema has the unique-jobs table (checked once)."""
        if self._unique_tables is None:
            async with self.pool.connection() as conn:
                self._unique_tables = await unique_installed(conn, self.schema)
        return self._unique_tables


@asynccontextmanager
async def make_worker_utils(
    connection_string: str | None = None,
    *,
    schema: str | None = None,
    pool: AsyncConnectionPool[Any] | None = None,
    max_pool_size: int = 10,
    no_prepared_statements: bool = False,
) -> AsyncIterator[WorkerUtils]:
    """Open WorkerUtils on a new pool (closed on exit) or on ``pool`` (left open)."""
    schema_name = resolve_schema(schema)
    if pool is not None:
        yield WorkerUtils(pool, schema_name)
        return
    load_dotenv_file()
    conninfo = resolve_connection_string(connection_string)
    kwargs: dict[str, Any] = {"prepare_threshold": None} if no_prepared_statements else {}
    await check_connection(conninfo)
    new_pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        conninfo,
        min_size=1,
        max_size=max_pool_size,
        kwargs=kwargs,
        open=False,
        name="graphile-worker-utils",
    )
    await new_pool.open(wait=True)
    try:
        yield WorkerUtils(new_pool, schema_name)
    finally:
        await new_pool.close()


@overload
async def quick_add_job(
    identifier: str,
    payload: Any = None,
    *,
    connection_string: str | None = None,
    schema: str | None = None,
    unique: None = None,
    **options: Any,
) -> Job: ...


@overload
async def quick_add_job(
    identifier: str,
    payload: Any = None,
    *,
    connection_string: str | None = None,
    schema: str | None = None,
    unique: UniqueSpec,
    **options: Any,
) -> UniqueJobResult: ...


async def quick_add_job(
    identifier: str,
    payload: Any = None,
    *,
    connection_string: str | None = None,
    schema: str | None = None,
    unique: UniqueSpec | None = None,
    **options: Any,
) -> Job | UniqueJobResult:
    """Add one job with a short-lived connection; options as for ``add_job``."""
    async with make_worker_utils(connection_string, schema=schema, max_pool_size=1) as utils:
        if unique is None:
            job: Job = await utils.add_job(identifier, payload, **options)
            return job
        result: UniqueJobResult = await utils.add_job(identifier, payload, unique=unique, **options)
        return result


async def sweep_unique_locks(utils: WorkerUtils) -> None:
    """The worker's periodic sweep: delete expired locks; a failure is logged, not raised."""
    try:
        deleted = await utils.gc_unique_locks()
    except (psycopg.Error, GraphileWorkerError) as exc:
        logger.warning("Unique-job lock sweep failed: %s", exc)
        return
    if deleted:
        logger.info("Deleted %d expired unique-job lock(s)", deleted)
