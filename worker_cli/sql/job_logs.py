"""The statements of jobs' own logs (``_private_py_job_logs``,
migrations/py/000027.sql): the lines a task logged through ``helpers.logger``
during an attempt. A failed attempt's are written by the failure statement
(:data:`~worker_cli.sql.failure.FAIL_BATCH`); with ``--job-logs all`` a
success's by :data:`RECORD_SUCCESS_LOGS`, in the success's transaction."""

from __future__ import annotations

# The logs of succeeded attempts (job_logs = all).
RECORD_SUCCESS_LOGS = """
  insert into {schema}._private_py_job_logs (job_id, attempt, outcome, lines, dropped)
  select l.job_id, l.attempt, 'succeeded', l.lines, l.dropped
  from unnest(
    %(job_ids)s::bigint[], %(attempts)s::int[], %(lines)s::text[], %(dropped)s::int[]
  ) as l(job_id, attempt, lines, dropped)
"""

# A job's kept logs, oldest attempt first (JobLog's fields, in order).
JOB_LOGS = """
  select l.attempt, l.outcome, l.logged_at, l.lines, l.dropped
  from {schema}._private_py_job_logs as l
  where l.job_id = %(job_id)s::bigint
  order by l.id
"""

# Delete the logs older than 7 days, oldest first, in a bounded batch (as the
# attempt errors they are kept beside): rows deleted, rows read.
PRUNE_JOB_LOGS = """
  with oldest as (
    select l.id, l.logged_at
    from {schema}._private_py_job_logs as l
    order by l.id
    limit %(limit)s
  ),
  pruned as (
    delete from {schema}._private_py_job_logs as l
    where l.id in (select o.id from oldest as o where o.logged_at < now() - interval '7 days')
    returning 1
  )
  select (select count(*) from pruned), (select count(*) from oldest)
"""
