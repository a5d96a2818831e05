"""The metrics' queue depth (:mod:`worker_cli.observe.queue_depth`); it also
reads :data:`worker_cli.sql.limits.LIMIT_USAGE` and
:data:`worker_cli.sql.status.STRANDED_TASKS`."""

from __future__ import annotations

# At most %(limit)s rows of the jobs table, in their physical order (a
# sequential scan that stops there, no index: the cost is bounded whatever the
# queue holds), counted by task id and named queue id in the states every
# command prints (py_job_state, as status.COUNTS counts them: six that
# partition; a pause holds a whole task and named queue, so it is read once
# per group, py_paused_by), then the jobs that failed an attempt before and
# will run again (paused or not: the retrying gauge), then in all, with the
# earliest run_at of the due jobs (not running, attempts left; paused ones
# too, as before: a paused queue's age still grows).
# Then each task id named, and each named queue: the worker's tasks (%(tasks)s)
# by name, every other task as null; the %(queues)s named queues with the most
# jobs read (then by name) by name, the others as %(other)s, no named queue as
# ''. So at most (tasks + 1) * (%(queues)s + 2) rows, whatever names the table
# holds. The oldest waiting job's age is null when none waits, and infinity
# for a run_at of -infinity (PostgreSQL before 17 cannot subtract it).
QUEUE_DEPTH = """
  with counted (task_id, job_queue_id, waiting, scheduled, retrying, running, failed, total,
                oldest) as (
    select
      j.task_id, j.job_queue_id,
      count(*) filter (
        where j.locked_at is null and j.attempts = 0 and j.attempts < j.max_attempts
          and j.run_at <= now()
      ),
      count(*) filter (
        where j.locked_at is null and j.attempts = 0 and j.attempts < j.max_attempts
          and j.run_at > now()
      ),
      count(*) filter (
        where j.locked_at is null and j.attempts > 0 and j.attempts < j.max_attempts
      ),
      count(*) filter (where j.locked_at is not null),
      count(*) filter (where j.locked_at is null and j.attempts >= j.max_attempts),
      count(*),
      min(j.run_at) filter (
        where j.locked_at is null and j.attempts < j.max_attempts and j.run_at <= now()
      )
    from (
      select j.task_id, j.job_queue_id, j.run_at, j.attempts, j.max_attempts, j.locked_at
      from {schema}._private_jobs as j
      limit %(limit)s
    ) as j
    group by j.task_id, j.job_queue_id
  ),
  c as (
    select c.task_id, c.job_queue_id,
      case when p.held then 0 else c.waiting end as waiting,
      case when p.held then 0 else c.scheduled end as scheduled,
      case when p.held then 0 else c.retrying end as retrying,
      case when p.held then c.waiting + c.scheduled + c.retrying else 0 end as paused,
      c.running, c.failed, c.retrying as retried, c.total,
      c.oldest
    from counted as c
    cross join lateral (
      select {schema}.py_paused_by(c.task_id, c.job_queue_id) is not null as held
    ) as p
  ),
  ranked as (
    select c.job_queue_id,
      row_number() over (order by sum(c.total) desc, q.queue_name) <= %(queues)s as labelled
    from c
    join {schema}._private_job_queues as q on q.id = c.job_queue_id
    group by c.job_queue_id, q.queue_name
  )
  select
    case when t.identifier = any(%(tasks)s::text[]) then t.identifier end,
    case
      when c.job_queue_id is null then ''
      when r.labelled then q.queue_name
      else %(other)s
    end,
    sum(c.waiting)::bigint, sum(c.scheduled)::bigint, sum(c.retrying)::bigint,
    sum(c.paused)::bigint, sum(c.running)::bigint, sum(c.failed)::bigint,
    sum(c.retried)::bigint, sum(c.total)::bigint,
    case
      when isfinite(min(c.oldest)) then extract(epoch from now() - min(c.oldest))::float8
      when min(c.oldest) is not null then 'infinity'::float8
    end
  from c
  join {schema}._private_tasks as t on t.id = c.task_id
  left join ranked as r on r.job_queue_id = c.job_queue_id
  left join {schema}._private_job_queues as q on q.id = c.job_queue_id and r.labelled
  group by 1, 2
"""

# The pauses in force (migrations/py/000014.sql: a small table, a row per
# paused named queue or task; one whose resume_at has passed is over), at most
# %(limit)s, by kind and name.
PAUSES_IN_FORCE = """
  select p.kind, p.name
  from {schema}._private_py_pauses as p
  where p.resume_at is null or p.resume_at > now()
  order by p.kind, p.name
  limit %(limit)s
"""

# The query gives up rather than hold a connection for long.
STATEMENT_TIMEOUT = "set local statement_timeout = 5000"
