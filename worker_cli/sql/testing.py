"""The statements of :mod:`worker_cli.testing` beyond the worker's own: the
jobs in the queue, for the assertions on what was added; the pytest
plugin's throwaway database and its emptying between tests."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

# The jobs in the queue (of one task, or all), oldest first: JOB_COLUMNS,
# then the task's identifier and the queue's name (worker_cli.jobs.job.Job's
# fields, in its order); at most %(limit)s.
ADDED_JOBS = """
  select j.id, j.job_queue_id, j.task_id, j.payload, j.priority, j.run_at, j.attempts,
    j.max_attempts, j.last_error, j.created_at, j.updated_at, j.key, j.locked_at,
    j.locked_by, j.revision, j.flags, j.is_available, t.identifier, q.queue_name
  from {schema}._private_jobs as j
  join {schema}._private_tasks as t on t.id = j.task_id
  left join {schema}._private_job_queues as q on q.id = j.job_queue_id
  where %(task)s::text is null or t.identifier = %(task)s::text
  order by j.id
  limit %(limit)s
"""

# The tables of the schema that hold a queue's state (everything but the
# migration ledgers and the task names), which the pytest plugin empties
# between tests.
QUEUE_TABLES = """
  select t.tablename from pg_tables as t
  where t.schemaname = %(schema)s
    and t.tablename <> '_private_tasks' and t.tablename not like '%%migrations'
  order by t.tablename
"""


def truncate(schema: str, tables: Sequence[str]) -> sql.Composed:
    """Empty ``tables`` of ``schema`` in one statement."""
    return sql.SQL("truncate {}").format(
        sql.SQL(", ").join(sql.Identifier(schema, table) for table in tables)
    )


def create_database(name: str) -> sql.Composed:
    """Create the database ``name``."""
    return sql.SQL("create database {}").format(sql.Identifier(name))


def drop_database(name: str) -> sql.Composed:
    """Drop the database ``name``, ending its sessions (PostgreSQL 13+)."""
    return sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name))
