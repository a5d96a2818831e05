"""The read-only statements of the operators' views: ``graphile-worker status``
and the ``--once`` progress line (templates over the schema name, composed
with :func:`worker_cli.schema.statements.compose`, as every other statement)."""

from __future__ import annotations

from typing import LiteralString

# Due, unlocked jobs of the given tasks, counted up to %(cap)s rows (the
# --once progress line; the jobs' main index holds exactly the available ones).
progress_remaining = """
  select count(*) from (
    select 1
    from {schema}._private_jobs as j
    where j.is_available = true
      and j.run_at <= now()
      and j.task_id in (
        select t.id from {schema}._private_tasks as t
        where t.identifier = any(%(identifiers)s::text[])
      )
    limit %(cap)s
  ) as due
"""

# Whether the schema holds graphile-worker's jobs and migrations tables (the
# schema name is a bound parameter here: a value, not an identifier).
status_installed = """
  select to_regclass(format('%%I._private_jobs', %(schema)s::text)) is not null
    and to_regclass(format('%%I.migrations', %(schema)s::text)) is not null
"""

status_revision = "select max(id) from {schema}.migrations"

# The jobs of a group (rows aliased j) in each state, in this order: waiting
# (due now), scheduled (run_at in the future), locked (being run, or held by a
# crashed worker), permanently failed (attempts used up); every job is in
# exactly one of them. Then retrying: the waiting and scheduled jobs that have
# been attempted before. The metrics' queue depth counts the same.
STATE_COUNTS: LiteralString = """
    count(*) filter (
      where j.locked_at is null and j.attempts < j.max_attempts and j.run_at <= now()
    ),
    count(*) filter (
      where j.locked_at is null and j.attempts < j.max_attempts and j.run_at > now()
    ),
    count(*) filter (where j.locked_at is not null),
    count(*) filter (where j.locked_at is null and j.attempts >= j.max_attempts),
    count(*) filter (
      where j.locked_at is null and j.attempts < j.max_attempts and j.attempts > 0
    )"""

# The jobs in each state (STATE_COUNTS) by task and named queue; status.py
# adds the groups up. now() is the transaction's start, so all the status
# statements (run in one read-only repeatable-read transaction) agree.
status_counts = (
    """
  select
    t.identifier,
    q.queue_name,
    count(*),"""
    + STATE_COUNTS
    + """
  from {schema}._private_jobs as j
  join {schema}._private_tasks as t on t.id = j.task_id
  left join {schema}._private_job_queues as q on q.id = j.job_queue_id
  group by t.identifier, q.queue_name
"""
)

# The job that has been due the longest without being taken, and for how many
# seconds (null for a run_at of -infinity: PostgreSQL before 17 cannot subtract
# it, and no age would mean anything).
status_oldest_waiting = """
  select j.id, t.identifier, q.queue_name, j.run_at,
    case when isfinite(j.run_at) then extract(epoch from now() - j.run_at) end
  from {schema}._private_jobs as j
  join {schema}._private_tasks as t on t.id = j.task_id
  left join {schema}._private_job_queues as q on q.id = j.job_queue_id
  where j.locked_at is null and j.attempts < j.max_attempts and j.run_at <= now()
  order by j.run_at, j.id
  limit 1
"""

# Named queues that are locked (one of their jobs is running), with the holder.
status_locked_queues = """
  select q.queue_name, q.locked_by,
    case when isfinite(q.locked_at) then extract(epoch from now() - q.locked_at) end
  from {schema}._private_job_queues as q
  where q.locked_at is not null
"""

status_now = "select now()"
