"""The SQL statements this package sends, each named after what it does.

Every statement is a template over the schema name; :func:`compose` turns it
into a ``psycopg.sql.Composed`` with the name quoted by ``sql.Identifier``.
Schema DDL lives in ``migrations/*.sql``, not here.
"""

from __future__ import annotations

from typing import LiteralString

from psycopg import sql

__all__ = ["compose"]

# The functions return _private_jobs rows; job_names then looks up the task
# identifiers and queue names behind them. It must be a separate statement: a
# task or queue the function creates is invisible to the statement calling it.
job_names = """
  select 'task' as kind, t.id, t.identifier as name
  from {schema}._private_tasks as t
  where t.id = any(%(task_ids)s::int[])
  union all
  select 'queue', q.id, q.queue_name
  from {schema}._private_job_queues as q
  where q.id = any(%(queue_ids)s::int[])
"""


def _returning_jobs(call: LiteralString) -> LiteralString:
    return "select j.* from " + call + " as j"


add_job = _returning_jobs(
    """{schema}.add_job(
      identifier => %(identifier)s,
      payload => %(payload)s::json,
      queue_name => %(queue_name)s,
      run_at => %(run_at)s,
      max_attempts => %(max_attempts)s,
      job_key => %(job_key)s,
      priority => %(priority)s,
      flags => %(flags)s::text[],
      job_key_mode => %(job_key_mode)s
    )"""
)

# The specs travel as one JSON array and become job_spec[] in the server.
add_jobs = _returning_jobs(
    """{schema}.add_jobs(
      array(
        select spec
        from json_populate_recordset(null::{schema}.job_spec, %(specs)s::json) as spec
      ),
      %(job_key_preserve_run_at)s
    )"""
)

remove_job = _returning_jobs("{schema}.remove_job(%(job_key)s)") + " where j.id is not null"

complete_jobs = _returning_jobs("{schema}.complete_jobs(%(job_ids)s::bigint[])")

permanently_fail_jobs = _returning_jobs(
    "{schema}.permanently_fail_jobs(%(job_ids)s::bigint[], %(error_message)s)"
)

reschedule_jobs = _returning_jobs(
    """{schema}.reschedule_jobs(
      %(job_ids)s::bigint[],
      run_at => %(run_at)s,
      priority => %(priority)s,
      attempts => %(attempts)s,
      max_attempts => %(max_attempts)s
    )"""
)

force_unlock_workers = "select {schema}.force_unlock_workers(%(worker_ids)s::text[])"

# Cleanup: forget task identifiers no job uses (except those to keep).
gc_task_identifiers = """
  delete from {schema}._private_tasks as t
  where not exists (select 1 from {schema}._private_jobs as j where j.task_id = t.id)
    and t.identifier <> all(%(keep)s::text[])
"""

# Cleanup: forget unlocked queues no job is in.
gc_job_queues = """
  delete from {schema}._private_job_queues as q
  where q.locked_at is null
    and not exists (select 1 from {schema}._private_jobs as j where j.job_queue_id = q.id)
"""

# Cleanup: delete permanently failed jobs that nobody holds.
delete_permafailed_jobs = """
  delete from {schema}._private_jobs as j
  where j.attempts >= j.max_attempts and j.locked_at is null
"""


def compose(statement: LiteralString, schema: str) -> sql.Composed:
    """Return ``statement`` with ``{schema}`` replaced by the quoted schema name."""
    return sql.SQL(statement).format(schema=sql.Identifier(schema))
