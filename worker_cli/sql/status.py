"""The read-only statements of ``graphile-worker status`` and the ``--once``
progress line. The jobs' states are counted as every command names them
(py_job_state): each job is exactly one of running (locked by a worker, or
held by a crashed one), failed (attempts used up), paused (held by a pause),
retrying (failed before, will run again), scheduled (never attempted, run_at
in the future) and waiting (never attempted, due now)."""

from __future__ import annotations

# Due, unlocked jobs of the given tasks, counted up to %(cap)s rows (the
# --once progress line; the jobs' main index holds exactly the available ones).
PROGRESS_REMAINING = """
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

# The due jobs of the given tasks that a pause holds (unlocked, attempts left,
# run_at passed, py_paused_by not null), by the pause holding them, for the
# line a --once run ends with. Nothing is read past the pauses table when no
# pause is in force; else the tasks' jobs through _private_py_jobs_task_order
# (task_id first), a pause looked up per task and named queue.
HELD_BY_PAUSES = """
  select p.paused_by, sum(c.jobs)::bigint
  from (
    select j.task_id, j.job_queue_id, count(*) as jobs
    from {schema}._private_jobs as j
    where exists (
        select from {schema}._private_py_pauses as p
        where p.resume_at is null or p.resume_at > now()
      )
      and j.task_id in (
        select t.id from {schema}._private_tasks as t
        where t.identifier = any(%(identifiers)s::text[])
      )
      and j.locked_at is null and j.attempts < j.max_attempts and j.run_at <= now()
    group by j.task_id, j.job_queue_id
  ) as c
  cross join lateral (
    select {schema}.py_paused_by(c.task_id, c.job_queue_id) as paused_by
  ) as p
  where p.paused_by is not null
  group by p.paused_by
  order by p.paused_by
"""

# Whether the schema holds graphile-worker's jobs and migrations tables (the
# schema name is a bound parameter here: a value, not an identifier).
INSTALLED = """
  select to_regclass(format('%%I._private_jobs', %(schema)s::text)) is not null
    and to_regclass(format('%%I.migrations', %(schema)s::text)) is not null
"""

REVISION = "select max(id) from {schema}.migrations"

# The jobs in each state by task and named queue (the states of
# py_job_state, migrations/py/functions.sql), and the pause holding the
# group's jobs (py_paused_by: null when none does); observe/status_report.py
# adds the groups up. A pause holds every job of a task and named queue that
# is not running or failed, so it is read once per group, not per job. now()
# is the transaction's start, so all the status statements (run in one
# read-only repeatable-read transaction) agree.
COUNTS = """
  select
    t.identifier,
    q.queue_name,
    c.total,
    case when p.paused_by is null then c.waiting else 0 end,
    case when p.paused_by is null then c.scheduled else 0 end,
    case when p.paused_by is null then c.retrying else 0 end,
    case when p.paused_by is null then 0 else c.waiting + c.scheduled + c.retrying end,
    c.running,
    c.failed,
    p.paused_by
  from (
    select
      j.task_id,
      j.job_queue_id,
      count(*) as total,
      count(*) filter (
        where j.locked_at is null and j.attempts = 0 and j.attempts < j.max_attempts
          and j.run_at <= now()
      ) as waiting,
      count(*) filter (
        where j.locked_at is null and j.attempts = 0 and j.attempts < j.max_attempts
          and j.run_at > now()
      ) as scheduled,
      count(*) filter (
        where j.locked_at is null and j.attempts > 0 and j.attempts < j.max_attempts
      ) as retrying,
      count(*) filter (where j.locked_at is not null) as running,
      count(*) filter (where j.locked_at is null and j.attempts >= j.max_attempts) as failed
    from {schema}._private_jobs as j
    group by j.task_id, j.job_queue_id
  ) as c
  join {schema}._private_tasks as t on t.id = c.task_id
  left join {schema}._private_job_queues as q on q.id = c.job_queue_id
  cross join lateral (
    select {schema}.py_paused_by(c.task_id, c.job_queue_id) as paused_by
  ) as p
"""

# The job that has been due the longest without being taken (waiting or
# retrying: not running, not failed, not held by a pause), and for how many
# seconds (null for a run_at of -infinity: PostgreSQL before 17 cannot subtract
# it, and no age would mean anything).
OLDEST_WAITING = """
  select j.id, t.identifier, q.queue_name, j.run_at,
    case when isfinite(j.run_at) then extract(epoch from now() - j.run_at) end
  from {schema}._private_jobs as j
  join {schema}._private_tasks as t on t.id = j.task_id
  left join {schema}._private_job_queues as q on q.id = j.job_queue_id
  where j.locked_at is null and j.attempts < j.max_attempts and j.run_at <= now()
    and {schema}.py_paused_by(j.task_id, j.job_queue_id) is null
  order by j.run_at, j.id
  limit 1
"""

# Named queues that are locked (one of their jobs is running), with the holder.
LOCKED_QUEUES = """
  select q.queue_name, q.locked_by,
    case when isfinite(q.locked_at) then extract(epoch from now() - q.locked_at) end
  from {schema}._private_job_queues as q
  where q.locked_at is not null
"""

# Whether the schema has the Python pools' heartbeats (migrations/py/000002.sql;
# a schema only Node's migrations installed has none).
HEARTBEATS_INSTALLED = """
  select to_regclass(format('%%I._private_py_heartbeats', %(schema)s::text)) is not null
"""

# Whether any Python pool has a heartbeat row, live or not (the heartbeats'
# primary key, one row at most).
ANY_HEARTBEAT = "select 1 from {schema}._private_py_heartbeats limit 1"

# Stranded tasks: tasks with runnable jobs (not locked, attempts left, due)
# that no live Python pool runs. A pool is live while its heartbeat is not
# older than its timeout (the dashboard's "alive"); it runs the tasks its row
# lists in task_identifiers. A live pool of an older version (no
# task_identifiers) might run any task, so then nothing is flagged; nor when
# there is no heartbeat row at all (no Python pool running, or heartbeats
# off): there is nothing to compare with. Node workers have no heartbeat, so
# a task only they run is flagged too. A paused task (its own pause or every
# task's, py_paused_by) is not stranded: a pause holds its jobs.
#
# Bounded: at most %(tasks)s tasks not run by a live pool are examined (by
# identifier, tasks_identifier_key), and each through
# _private_py_jobs_task_order (migrations/py/000003.sql), as the worker's
# fetch reads it: the task's priorities found one index descent each (a loose
# index scan), then per priority its due jobs, a range in run_at order, at
# most %(cap)s of them counted. So a task's future jobs, however many, are
# never walked, and `runnable` is at most %(cap)s (counts past it are cut
# there). oldest_age is null for a run_at of -infinity (as in
# OLDEST_WAITING).
STRANDED_TASKS = """
  with live as materialized (
    select h.task_identifiers
    from {schema}._private_py_heartbeats as h
    where h.beat_at >= now() - h.timeout
  ),
  unhandled as materialized (
    select t.id, t.identifier
    from {schema}._private_tasks as t
    where exists (select 1 from {schema}._private_py_heartbeats)
      and not exists (
        select 1 from live as l
        where l.task_identifiers is null or t.identifier = any(l.task_identifiers)
      )
      and {schema}.py_paused_by(t.id, null) is null
    order by t.identifier
    limit %(tasks)s
  )
  select u.identifier as task_identifier, least(r.runnable, %(cap)s)::bigint as runnable,
    r.oldest_run_at,
    case when isfinite(r.oldest_run_at)
      then extract(epoch from now() - r.oldest_run_at)::float8 end as oldest_age
  from unhandled as u
  cross join lateral (
    with recursive priorities (priority) as (
      (
        select j.priority
        from {schema}._private_jobs as j
        where j.task_id = u.id and j.locked_at is null and j.attempts < j.max_attempts
        order by j.priority
        limit 1
      )
      union all
      select (
        select j.priority
        from {schema}._private_jobs as j
        where j.task_id = u.id and j.locked_at is null and j.attempts < j.max_attempts
          and j.priority > p.priority
        order by j.priority
        limit 1
      )
      from priorities as p
      where p.priority is not null
    )
    select coalesce(sum(d.runnable), 0) as runnable, min(d.oldest) as oldest_run_at
    from priorities as p
    cross join lateral (
      select count(*) as runnable, min(due.run_at) as oldest
      from (
        select j.run_at
        from {schema}._private_jobs as j
        where j.task_id = u.id and j.priority = p.priority
          and j.locked_at is null and j.attempts < j.max_attempts
          and j.run_at <= now()
        order by j.run_at
        limit %(cap)s
      ) as due
    ) as d
    where p.priority is not null
  ) as r
  where r.runnable > 0
  order by u.identifier
"""
