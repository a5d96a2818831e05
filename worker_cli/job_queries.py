"""Sending the statements that add, change or return jobs, and decoding their rows.

The job functions return ``_private_jobs`` rows; the ``job_names`` statement then looks
up their task identifiers and queue names (a task or queue the function
created is invisible to the statement that called it), and
:func:`~worker_cli.job.decode_jobs` builds the jobs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from typing import Any, LiteralString

import psycopg
from psycopg import errors as pg_errors

from . import statements
from .errors import JobSpecError
from .job import Job, decode_jobs, read_payloads_raw, task_and_queue_ids
from .job_spec import JobSpec, encode_payload
from .schema import schema_required
from .trace_context import carry
from .unique import JOB_COLUMNS_FROM, UniqueJobResult, UniqueRuleError, results_from_rows

__all__ = ["JobQueries", "encode_specs", "spec_record"]

#: Specs per statement when add_jobs pipelines a large batch (see
#: JobQueries.insert_jobs); measured with tests/benchmark.py --extras.
ADD_JOBS_CHUNK = 5000


class JobQueries:
    """The statements about jobs, sent on ``conn`` for ``schema``; errors meaning
    the schema is missing become :class:`~worker_cli.errors.SchemaNotInstalledError`."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], schema: str) -> None:
        self.conn = conn
        self.schema = schema

    async def execute(self, statement: LiteralString, params: Mapping[str, Any]) -> None:
        """Run one statement that returns nothing we read."""
        with schema_required(self.schema):
            await self.conn.execute(statements.compose(statement, self.schema), params)

    async def jobs(self, statement: LiteralString, params: Mapping[str, Any]) -> list[Job]:
        """The jobs returned by one statement (its rows: statements.JOB_COLUMNS)."""
        with schema_required(self.schema):
            return await self._jobs(await self._rows(statement, params))

    async def unique_results(
        self, statement: LiteralString, params: Mapping[str, Any]
    ) -> list[UniqueJobResult]:
        """The results of ``add_unique_job(s)``, in the order of their rows."""
        with schema_required(self.schema):
            try:
                rows = await self._rows(statement, params)
                if not rows:
                    return []
                tasks, queues = await self._names(rows, first=JOB_COLUMNS_FROM)
            except pg_errors.InvalidParameterValue as exc:
                # The SQL function's own check of a rule (Python checks first).
                field, _, reason = (exc.diag.message_primary or "").partition(": ")
                raise UniqueRuleError(field, reason) from exc
        return results_from_rows(rows, tasks, queues)

    async def insert_jobs(
        self, specs: Sequence[JobSpec | Mapping[str, Any]], job_key_preserve_run_at: bool
    ) -> list[Job]:
        """``add_jobs``: one statement per chunk of specs, in one transaction.

        A large batch goes out in a pipeline: the database inserts one chunk
        while the next is checked and encoded. A bad spec in a later chunk
        rolls back the earlier ones, so the call stays all-or-nothing.
        """
        conn = self.conn
        add_jobs, trace = carry(statements.add_jobs)
        statement = statements.compose(add_jobs, self.schema)
        keys: dict[str, int] = {}
        size = ADD_JOBS_CHUNK
        with schema_required(self.schema):
            async with (
                conn.transaction(),
                conn.pipeline() if len(specs) > size else nullcontext(),
            ):
                cursors = []
                for start in range(0, len(specs), size):
                    records = [
                        spec_record(raw, index, keys)
                        for index, raw in enumerate(specs[start : start + size], start)
                    ]
                    cur = _raw_payload_cursor(conn)
                    await cur.execute(
                        statement,
                        {
                            "specs": encode_specs(records, start),
                            "job_key_preserve_run_at": job_key_preserve_run_at,
                            **trace,
                        },
                    )
                    cursors.append(cur)
                return await self._jobs([row for cur in cursors for row in await cur.fetchall()])

    async def _rows(self, statement: LiteralString, params: Mapping[str, Any]) -> list[Any]:
        cur = _raw_payload_cursor(self.conn)
        await cur.execute(statements.compose(statement, self.schema), params)
        return await cur.fetchall()

    async def _jobs(self, rows: Sequence[Sequence[Any]]) -> list[Job]:
        """Jobs from rows of statements.JOB_COLUMNS read by a :func:`_raw_payload_cursor`."""
        if not rows:
            return []
        tasks, queues = await self._names(rows)
        return decode_jobs(rows, tasks, queues)

    async def _names(
        self, rows: Sequence[Sequence[Any]], *, first: int = 0
    ) -> tuple[dict[int, str], dict[int, str]]:
        """The task identifiers and queue names of job rows (see
        :func:`~worker_cli.job.task_and_queue_ids`), by id."""
        task_ids, queue_ids = task_and_queue_ids(rows, first=first)
        names = await self.conn.execute(
            statements.compose(statements.job_names, self.schema),
            {"task_ids": task_ids, "queue_ids": queue_ids},
        )
        tasks: dict[int, str] = {}
        queues: dict[int, str] = {}
        async for kind, id_, name in names:
            (tasks if kind == "task" else queues)[id_] = name
        return tasks, queues


def _raw_payload_cursor(conn: psycopg.AsyncConnection[Any]) -> psycopg.AsyncCursor[Any]:
    """A cursor whose rows hold payloads as text, for :func:`~worker_cli.job.decode_jobs`."""
    cur = conn.cursor()
    read_payloads_raw(cur)
    return cur


def spec_record(
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


def encode_specs(records: Sequence[dict[str, Any]], offset: int = 0) -> str:
    """Spec records as one JSON array; a payload that cannot be encoded is named
    by its index (``offset``: the index of ``records[0]`` in the call)."""
    try:
        return json.dumps(records, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError):
        for index, record in enumerate(records, offset):
            encode_payload(record["payload"], field=f"specs[{index}].payload")
        raise
