"""WorkerUtils: add and administer jobs from Python, without running a worker.

``make_worker_utils`` mirrors graphile-worker's ``makeWorkerUtils``::

    async with make_worker_utils(connection_string=URL) as utils:
        job = await utils.add_job("send_email", {"to": "a@b.c"}, queue_name="mail")
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager, nullcontext
from contextvars import ContextVar
from datetime import datetime
from typing import Any, Literal, LiteralString, TypeAlias, overload

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from . import statements
from .config import load_dotenv_file, resolve_connection_string, resolve_schema
from .db import check_connection
from .errors import GraphileWorkerError, JobSpecError, SchemaNotInstalledError
from .job import Job, parse_payloads, read_payloads_raw
from .job_spec import JobKeyMode, JobSpec, TaskSpec, encode_payload, validate_identifier
from .migrate import MigrationReport, migrate
from .unique import UniqueJobResult, UniqueRule, UniqueRuleError, UniqueSpec, check_keys_payload

__all__ = [
    "CleanupTask",
    "WorkerUtils",
    "make_worker_utils",
    "quick_add_job",
    "sweep_unique_locks",
]

logger = logging.getLogger("graphile_worker")

CleanupTask: TypeAlias = Literal[
    "GC_TASK_IDENTIFIERS", "GC_JOB_QUEUES", "DELETE_PERMAFAILED_JOBS", "GC_UNIQUE_LOCKS"
]
_CLEANUP_STATEMENTS: dict[str, LiteralString] = {
    # Permafailed jobs first, so the queues and tasks they used can go too.
    "DELETE_PERMAFAILED_JOBS": statements.delete_permafailed_jobs,
    "GC_JOB_QUEUES": statements.gc_job_queues,
    "GC_TASK_IDENTIFIERS": statements.gc_task_identifiers,
    # Not a statement: see WorkerUtils.gc_unique_locks.
    "GC_UNIQUE_LOCKS": statements.gc_unique_locks,
}
#: Specs per statement when add_jobs pipelines a large batch (see
#: WorkerUtils._add_jobs_in_chunks); measured with tests/benchmark.py --extras.
_ADD_JOBS_CHUNK = 5000
#: Uniqueness locks deleted per transaction by gc_unique_locks.
_GC_UNIQUE_BATCH = 500

# What PostgreSQL says when the schema, or one of its objects, is not there.
_SCHEMA_MISSING = (
    pg_errors.UndefinedFunction,
    pg_errors.UndefinedTable,
    pg_errors.InvalidSchemaName,
)


class _Held:
    """A connection held by :meth:`WorkerUtils.holding_connection`, with its
    pool, while the block runs. Tasks spawned inside the block inherit the
    context variable pointing here; once the block has ended (and the
    connection has gone back to the pool), ``active`` tells them not to use it."""

    __slots__ = ("active", "conn", "pool")

    def __init__(self, pool: AsyncConnectionPool[Any], conn: psycopg.AsyncConnection[Any]) -> None:
        self.pool = pool
        self.conn = conn
        self.active = True


#: The connection a task holds in ``helpers.with_pg_client()``.
_held_connection: ContextVar[_Held] = ContextVar("graphile_worker_held_connection")


class WorkerUtils:
    """Job administration over a connection pool; see :func:`make_worker_utils`."""

    def __init__(self, pool: AsyncConnectionPool[Any], schema: str) -> None:
        self.pool = pool
        self.schema = schema
        # Whether the unique-jobs table exists (None: not checked yet).
        self._unique_tables: bool | None = None

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection from the pool; inside :meth:`holding_connection` on the same
        pool (the same asyncio task), the connection held there. Taking a second
        one could wait forever: tasks holding connections can exhaust the pool."""
        held = _held_connection.get(None)
        if held is not None and held.active and held.pool is self.pool:
            yield held.conn
            return
        async with self.pool.connection() as conn:
            yield conn

    @asynccontextmanager
    async def holding_connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection for the block, which this pool's methods called inside it
        use too (so they also join any transaction open on it)."""
        async with self.connection() as conn:
            held = _Held(self.pool, conn)
            token = _held_connection.set(held)
            try:
                yield conn
            finally:
                held.active = False
                _held_connection.reset(token)

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
            rows = await self._fetch(statements.add_job, params)
            return rows[0]
        rule = UniqueRule.coerce(unique).to_json()
        check_keys_payload(rule, payload)
        params["unique_rule"] = json.dumps(rule)
        results = await self._fetch_unique(statements.add_unique_job, params)
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
            return await self._add_jobs_in_chunks(specs, job_key_preserve_run_at)
        records = [_spec_record(raw, index) for index, raw in enumerate(specs)]
        rules = _unique_rules(unique, records)
        if not records:
            return []
        return await self._fetch_unique(
            statements.add_unique_jobs,
            {
                "specs": _encode_specs(records),
                "unique_rules": json.dumps(rules),
                "job_key_preserve_run_at": job_key_preserve_run_at,
            },
        )

    async def _add_jobs_in_chunks(
        self, specs: Sequence[JobSpec | Mapping[str, Any]], job_key_preserve_run_at: bool
    ) -> list[Job]:
        """``add_jobs``: one statement per chunk of specs, in one transaction.

        A large batch goes out in a pipeline: the database inserts one chunk
        while the next is checked and encoded. A bad spec in a later chunk
        rolls back the earlier ones, so the call stays all-or-nothing.
        """
        if not specs:
            return []
        statement = statements.compose(statements.add_jobs, self.schema)
        keys: dict[str, int] = {}
        size = _ADD_JOBS_CHUNK
        async with self.connection() as conn:
            try:
                async with (
                    conn.transaction(),
                    conn.pipeline() if len(specs) > size else nullcontext(),
                ):
                    cursors = []
                    for start in range(0, len(specs), size):
                        records = [
                            _spec_record(raw, index, keys)
                            for index, raw in enumerate(specs[start : start + size], start)
                        ]
                        cur = _raw_payload_cursor(conn)
                        await cur.execute(
                            statement,
                            {
                                "specs": _encode_specs(records, start),
                                "job_key_preserve_run_at": job_key_preserve_run_at,
                            },
                        )
                        cursors.append(cur)
                    rows = [row for cur in cursors for row in await cur.fetchall()]
                    return await self._jobs_from_rows(conn, rows)
            except _SCHEMA_MISSING as exc:
                raise self._not_installed(exc) from exc

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
        unknown = [task for task in tasks if task not in _CLEANUP_STATEMENTS]
        if unknown:
            raise ValueError(
                f"unknown cleanup task(s) {', '.join(unknown)}; "
                f"expected {', '.join(_CLEANUP_STATEMENTS)}"
            )
        for name, statement in _CLEANUP_STATEMENTS.items():
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
        query = statements.compose(statements.gc_unique_locks, self.schema)
        total = 0
        async with self.pool.connection() as conn, _autocommit(conn):
            while True:
                cur = await conn.execute(query, {"max_rows": _GC_UNIQUE_BATCH})
                row = await cur.fetchone()
                deleted = int(row[0]) if row else 0
                total += deleted
                if deleted < _GC_UNIQUE_BATCH:
                    return total

    async def migrate(self) -> MigrationReport:
        """Install or upgrade the schema (see :func:`worker_cli.migrate.migrate`)."""
        async with self.pool.connection() as conn, _autocommit(conn):
            try:
                return await migrate(conn, self.schema)
            finally:
                self._unique_tables = None

    async def _fetch(self, statement: LiteralString, params: Mapping[str, Any]) -> list[Job]:
        async with self.connection() as conn:
            try:
                cur = _raw_payload_cursor(conn)
                await cur.execute(statements.compose(statement, self.schema), params)
                return await self._jobs_from_rows(conn, await cur.fetchall())
            except _SCHEMA_MISSING as exc:
                raise self._not_installed(exc) from exc

    async def _jobs_from_rows(
        self, conn: psycopg.AsyncConnection[Any], rows: Sequence[Sequence[Any]]
    ) -> list[Job]:
        """Jobs from rows holding the columns of _private_jobs in Job's field order,
        read by a :func:`_raw_payload_cursor`."""
        if not rows:
            return []
        tasks, queues = await self._names(conn, rows)
        payloads = parse_payloads([row[3] for row in rows])
        return [
            Job._make((*row[:3], payload, *row[4:], tasks[row[2]], queues.get(row[1])))
            for row, payload in zip(rows, payloads, strict=True)
        ]

    async def _names(
        self, conn: psycopg.AsyncConnection[Any], rows: Sequence[Sequence[Any]]
    ) -> tuple[dict[int, str], dict[int | None, str]]:
        """The task identifiers and queue names of job rows (task_id, job_queue_id
        in the columns 2 and 1), by id."""
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
        return tasks, queues

    async def _fetch_unique(
        self, statement: LiteralString, params: Mapping[str, Any]
    ) -> list[UniqueJobResult]:
        # Rows are job_id, conflict, conflict_state, replaced, then the columns
        # of _private_jobs in Job's field order (all null for a job that has
        # already succeeded).
        async with self.connection() as conn:
            try:
                cur = await conn.execute(statements.compose(statement, self.schema), params)
                rows = await cur.fetchall()
                if not rows:
                    return []
                tasks, queues = await self._names(
                    conn, [row[4:] for row in rows if row[4] is not None]
                )
            except _SCHEMA_MISSING as exc:
                raise self._not_installed(exc) from exc
            except pg_errors.InvalidParameterValue as exc:
                # The SQL function's own check of a rule (Python checks first).
                field, _, reason = (exc.diag.message_primary or "").partition(": ")
                raise UniqueRuleError(field, reason) from exc
        return [
            UniqueJobResult(
                job=(
                    Job._make((*row[4:], tasks[row[6]], queues.get(row[5])))
                    if row[4] is not None
                    else None
                ),
                conflict=row[1],
                job_id=row[0],
                conflict_state=row[2],
                replaced=row[3],
            )
            for row in rows
        ]

    async def _unique_installed(self) -> bool:
        """Whether this schema has the unique-jobs table (Python migration 1)."""
        if self._unique_tables is None:
            name = sql.Identifier(self.schema, "_private_py_unique_locks")
            async with self.pool.connection() as conn:
                cur = await conn.execute(
                    "select to_regclass(%s) is not null", [name.as_string(conn)]
                )
                row = await cur.fetchone()
            self._unique_tables = bool(row and row[0])
        return self._unique_tables

    async def _execute(self, statement: LiteralString, params: Mapping[str, Any]) -> None:
        query = statements.compose(statement, self.schema)
        async with self.connection() as conn:
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
async def _autocommit(conn: psycopg.AsyncConnection[Any]) -> AsyncIterator[None]:
    """The block runs ``conn`` in autocommit mode; its previous mode is restored
    after, so a pooled connection goes back as it came (the worker's pool is
    in autocommit, an application's may not be)."""
    previous = conn.autocommit
    if not previous:
        await conn.set_autocommit(True)
    try:
        yield
    finally:
        if conn.autocommit != previous and not conn.closed and not conn.broken:
            await conn.set_autocommit(previous)


def _unique_rules(
    unique: UniqueSpec | Sequence[UniqueSpec | None], records: Sequence[Mapping[str, Any]]
) -> dict[str, Any] | list[dict[str, Any] | None]:
    """The rules of add_jobs as JSON: one object for all specs, or one per spec."""
    if isinstance(unique, UniqueRule | Mapping):
        rule = UniqueRule.coerce(unique).to_json()
        for index, record in enumerate(records):
            check_keys_payload(rule, record["payload"], field=f"specs[{index}].unique")
        return rule
    if isinstance(unique, str | bytes) or not isinstance(unique, Sequence):
        raise UniqueRuleError(
            "unique", "must be a rule (a UniqueRule or a dict) or a list with one per spec"
        )
    if len(unique) != len(records):
        raise UniqueRuleError(
            "unique", f"has {len(unique)} rules for {len(records)} specs; give one per spec"
        )
    rules: list[dict[str, Any] | None] = []
    for index, (item, record) in enumerate(zip(unique, records, strict=True)):
        if item is None:
            rules.append(None)
            continue
        rule = UniqueRule.coerce(item, field=f"unique[{index}]").to_json(field=f"unique[{index}]")
        check_keys_payload(rule, record["payload"], field=f"unique[{index}]")
        rules.append(rule)
    return rules


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


def _spec_record(
    raw: JobSpec | Mapping[str, Any], index: int, keys: dict[str, int] | None = None
) -> dict[str, Any]:
    """Spec number ``index`` of add_jobs, checked, as a ``job_spec`` JSON record.

    ``keys`` maps the job keys of the earlier specs to their index, to refuse
    a key given twice (add_jobs would otherwise fail on it in PostgreSQL).
    """
    spec = JobSpec.coerce(raw, index)
    try:
        spec.validate()
    except JobSpecError as exc:
        raise JobSpecError(f"specs[{index}].{exc.field}", exc.reason) from None
    if keys is not None and spec.job_key is not None:
        first = keys.setdefault(spec.job_key, index)
        if first != index:
            raise JobSpecError(f"specs[{index}].job_key", f"is also the job_key of specs[{first}]")
    return spec.to_json_record()


def _encode_specs(records: Sequence[dict[str, Any]], offset: int = 0) -> str:
    """Spec records as one JSON array; a payload that cannot be encoded is named
    by its index (``offset``: the index of ``records[0]`` in the call)."""
    try:
        return json.dumps(records, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError):
        for index, record in enumerate(records, offset):
            encode_payload(record["payload"], field=f"specs[{index}].payload")
        raise


def _raw_payload_cursor(conn: psycopg.AsyncConnection[Any]) -> psycopg.AsyncCursor[Any]:
    """A cursor whose rows hold payloads as text, for :meth:`WorkerUtils._jobs_from_rows`."""
    cur = conn.cursor()
    read_payloads_raw(cur)
    return cur


async def sweep_unique_locks(utils: WorkerUtils) -> None:
    """The worker's periodic sweep: delete expired locks; a failure is logged, not raised."""
    try:
        deleted = await utils.gc_unique_locks()
    except (psycopg.Error, GraphileWorkerError) as exc:
        logger.warning("Unique-job lock sweep failed: %s", exc)
        return
    if deleted:
        logger.info("Deleted %d expired unique-job lock(s)", deleted)
