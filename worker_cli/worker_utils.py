"""WorkerUtils: add and administer jobs from Python, without running a worker.

``make_worker_utils`` mirrors graphile-worker's ``makeWorkerUtils``::

    async with make_worker_utils(connection_string=URL) as utils:
        job = await utils.add_job("send_email", {"to": "a@b.c"}, queue_name="mail")
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, Literal, LiteralString, TypeAlias

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import AsyncConnectionPool

from . import statements
from .connection import (
    check_connection,
    load_dotenv_file,
    resolve_connection_string,
    resolve_schema,
)
from .errors import JobSpecError, SchemaNotInstalledError
from .job import Job
from .job_spec import JobKeyMode, JobSpec, TaskSpec, encode_payload, validate_identifier
from .migrate import MigrationReport, migrate

__all__ = ["CleanupTask", "WorkerUtils", "make_worker_utils", "quick_add_job"]

CleanupTask: TypeAlias = Literal["GC_TASK_IDENTIFIERS", "GC_JOB_QUEUES", "DELETE_PERMAFAILED_JOBS"]
_CLEANUP_STATEMENTS: dict[str, LiteralString] = {
    # Permafailed jobs first, so the queues and tasks they used can go too.
    "DELETE_PERMAFAILED_JOBS": statements.delete_permafailed_jobs,
    "GC_JOB_QUEUES": statements.gc_job_queues,
    "GC_TASK_IDENTIFIERS": statements.gc_task_identifiers,
}

# What PostgreSQL says when the schema, or one of its objects, is not there.
_SCHEMA_MISSING = (
    pg_errors.UndefinedFunction,
    pg_errors.UndefinedTable,
    pg_errors.InvalidSchemaName,
)


class WorkerUtils:
    """Job administration over a connection pool; see :func:`make_worker_utils`."""

    def __init__(self, pool: AsyncConnectionPool[Any], schema: str) -> None:
        self.pool = pool
        self.schema = schema

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
    ) -> Job:
        """Add one job (or update the pending job with the same ``job_key``)."""
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
        rows = await self._fetch(statements.add_job, params)
        return rows[0]

    async def add_jobs(
        self,
        specs: Sequence[JobSpec | Mapping[str, Any]],
        *,
        job_key_preserve_run_at: bool = False,
    ) -> list[Job]:
        """Add many jobs in one statement; results are not in the order of ``specs``."""
        records = []
        for index, raw in enumerate(specs):
            spec = JobSpec.coerce(raw, index)
            try:
                spec.validate()
            except JobSpecError as exc:
                raise JobSpecError(f"specs[{index}].{exc.field}", exc.reason) from None
            records.append(spec.to_json_record())
        if not records:
            return []
        try:
            specs_json = json.dumps(records, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError):
            for index, record in enumerate(records):
                encode_payload(record["payload"], field=f"specs[{index}].payload")
            raise
        return await self._fetch(
            statements.add_jobs,
            {"specs": specs_json, "job_key_preserve_run_at": job_key_preserve_run_at},
        )

    async def remove_job(self, job_key: str) -> Job | None:
        """Delete the pending job with this key; a running one is kept from retrying."""
        if not isinstance(job_key, str) or not job_key:
            raise JobSpecError("job_key", "must be a non-empty string")
        rows = await self._fetch(statements.remove_job, {"job_key": job_key})
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
        tasks: Sequence[CleanupTask] = ("GC_JOB_QUEUES",),
        *,
        task_identifiers_to_keep: Sequence[str] = (),
    ) -> None:
        """Delete unused queues, unused task identifiers and/or permanently failed jobs."""
        unknown = [task for task in tasks if task not in _CLEANUP_STATEMENTS]
        if unknown:
            raise ValueError(
                f"unknown cleanup task(s) {', '.join(unknown)}; "
                f"expected {', '.join(_CLEANUP_STATEMENTS)}"
            )
        for name, statement in _CLEANUP_STATEMENTS.items():
            if name in tasks:
                await self._execute(statement, {"keep": list(task_identifiers_to_keep)})

    async def migrate(self) -> MigrationReport:
        """Install or upgrade the schema (see :func:`worker_cli.migrate.migrate`)."""
        async with self.pool.connection() as conn:
            await conn.set_autocommit(True)
            try:
                return await migrate(conn, self.schema)
            finally:
                await conn.set_autocommit(False)

    async def _fetch(self, statement: LiteralString, params: Mapping[str, Any]) -> list[Job]:
        async with self.pool.connection() as conn:
            try:
                # Rows are the columns of _private_jobs, in Job's field order.
                cur = await conn.execute(statements.compose(statement, self.schema), params)
                rows = await cur.fetchall()
                if not rows:
                    return []
                names = await conn.execute(
                    statements.compose(statements.job_names, self.schema),
                    {
                        "task_ids": list({row[2] for row in rows}),
                        "queue_ids": list({row[1] for row in rows} - {None}),
                    },
                )
                tasks: dict[int, str] = {}
                queues: dict[int | None, str] = {}
                async for kind, id_, name in names:
                    (tasks if kind == "task" else queues)[id_] = name
            except _SCHEMA_MISSING as exc:
                raise self._not_installed(exc) from exc
        return [Job._make((*row, tasks[row[2]], queues.get(row[1]))) for row in rows]

    async def _execute(self, statement: LiteralString, params: Mapping[str, Any]) -> None:
        query = statements.compose(statement, self.schema)
        async with self.pool.connection() as conn:
            try:
                await conn.execute(query, params)
            except _SCHEMA_MISSING as exc:
                raise self._not_installed(exc) from exc

    def _not_installed(self, exc: psycopg.Error) -> SchemaNotInstalledError:
        return SchemaNotInstalledError(
            f"the graphile-worker schema {self.schema!r} is not installed in this database "
            f"({exc.diag.message_primary}); run `graphile-worker --schema-only` or "
            "`await utils.migrate()` first"
        )


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


async def quick_add_job(
    identifier: str,
    payload: Any = None,
    *,
    connection_string: str | None = None,
    schema: str | None = None,
    **options: Any,
) -> Job:
    """Add one job with a short-lived connection; options as for ``add_job``."""
    async with make_worker_utils(connection_string, schema=schema, max_pool_size=1) as utils:
        return await utils.add_job(identifier, payload, **options)
