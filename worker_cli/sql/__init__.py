"""Every SQL statement the package sends, in one place, each named for what it
does (issue 42). Schema DDL lives in ``migrations/*.sql``, not here.

One module per area: ``jobs`` (adding, removing, rescheduling jobs; unique
adds; a job's state), ``carried`` (what an add writes beside its jobs: trace
contexts, job options), ``fetch``, ``completion``, ``failure``, ``history``,
``cancel``, ``waiting``, ``cleanup``, ``cron``, ``heartbeats``, ``limits``,
``pauses``, ``admin``, ``status``, ``metrics``, ``clock``, ``listen``,
``dashboard``, ``django``, ``django_admin`` (the tables and functions the
Django admin's models name), ``migrations``.

Each statement is a template over the schema name, written whole; :func:`compose`
turns it into a ``psycopg.sql.Composed`` with the name quoted by
``sql.Identifier`` (the only use of ``psycopg.sql`` here: identifiers).

Layer: the bottom; it imports nothing from the package.
"""

from __future__ import annotations

from functools import cache
from typing import LiteralString

from psycopg import sql

__all__ = ["JOB_COLUMNS", "UNIQUE_RESULT_COLUMNS", "compose", "render"]

# The columns of a job row, in this order, as every statement returning jobs
# selects them: the first fields of job.Job, which reads them by position
# (tests/test_sql_home.py checks each such statement against it).
JOB_COLUMNS: tuple[LiteralString, ...] = (
    "id",
    "job_queue_id",
    "task_id",
    "payload",
    "priority",
    "run_at",
    "attempts",
    "max_attempts",
    "last_error",
    "created_at",
    "updated_at",
    "key",
    "locked_at",
    "locked_by",
    "revision",
    "flags",
    "is_available",
)

# The first columns of a unique add's result rows; the existing or new job's
# JOB_COLUMNS follow (all null when the existing job has already succeeded).
UNIQUE_RESULT_COLUMNS: tuple[LiteralString, ...] = (
    "job_id",
    "conflict",
    "conflict_state",
    "replaced",
)


@cache
def compose(statement: LiteralString, schema: str) -> sql.Composed:
    """Return ``statement`` with ``{schema}`` replaced by the quoted schema name.

    Cached: the worker composes the same few statements for every batch.
    """
    return sql.SQL(statement).format(schema=sql.Identifier(schema))


@cache
def render(statement: LiteralString, schema: str) -> str:
    """``statement`` with ``{schema}`` quoted, as text (for Django's cursor)."""
    return compose(statement, schema).as_string(None)
