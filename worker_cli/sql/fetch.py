"""The worker's fetch: registering its tasks, locking runnable jobs (the SQL
function py_fetch_jobs, migrations/py/000009.sql), recovering from a lost
fetch reply, and releasing the stale locks of crashed workers. Arrays of job
ids are sent in binary (%(job_ids)b) where noted: psycopg dumps a list of
ints about three times faster that way than as text."""

from __future__ import annotations

# Register the identifiers of the loaded tasks (without consuming identity
# values for known ones) and return their ids.
REGISTER_TASKS = """
  with new as (
    insert into {schema}._private_tasks (identifier)
    select i from unnest(%(identifiers)s::text[]) as i
    where not exists (select 1 from {schema}._private_tasks as t where t.identifier = i)
    on conflict do nothing
    returning id, identifier
  )
  select id, identifier from new
  union
  select id,
      identifier from {schema}._private_tasks where identifier = any(%(identifiers)s::text[])
"""

# Lock up to %(limit)s runnable jobs of our tasks for this pool, at most one
# per named queue, and return them with their queue names and their own
# timeouts. The statement is the function py_fetch_jobs
# (migrations/py/000009.sql), for its plan settings.
GET_JOBS = """
  select * from {schema}.py_fetch_jobs(
    %(task_ids)s::int[], %(forbidden_flags)s::text[], %(limit)s::int, %(pool_id)s::text
  )
"""

# The same on the worker's clock (use_local_time): %(now)s replaces the
# database's now().
GET_JOBS_AT = """
  select * from {schema}.py_fetch_jobs(
    %(task_ids)s::int[], %(forbidden_flags)s::text[], %(limit)s::int, %(pool_id)s::text,
    %(now)s::timestamptz
  )
"""

# The fetch connection's session: job timestamps come in UTC (psycopg loads
# those several times faster than a named zone's), and the backend's start
# time, which with its pid names this session in pg_stat_activity (see
# end_lost_fetch_session).
FETCH_SESSION = """
  select set_config('TimeZone', 'UTC', false), a.backend_start
  from pg_stat_activity as a
  where a.pid = pg_backend_pid()
"""

# A fetch whose reply was lost (the connection dropped after the statement was
# sent) may have committed or not, or may still be running. Its session is
# ended first (it is this pool's own, identified by pid and start time, so a
# reused pid is never touched); once it is gone from pg_stat_activity, its
# transaction has ended one way or the other.
END_LOST_FETCH_SESSION = """
  select pg_terminate_backend(a.pid)
  from pg_stat_activity as a
  where a.pid = %(pid)s and a.backend_start = %(backend_start)s
"""

LOST_FETCH_SESSION_GONE = """
  select not exists (
    select 1 from pg_stat_activity as a
    where a.pid = %(pid)s and a.backend_start = %(backend_start)s
  )
"""

# Then the jobs locked by this pool that it does not know about are the ones
# that fetch locked: returned in GET_JOBS' columns, to be run (their named
# queues are locked by this pool too). Not index-backed (locked_by has no
# index), but only ever sent after a lost reply.
LOST_FETCH_JOBS = """
  select j.id, j.job_queue_id, j.task_id, j.payload, j.priority, j.run_at, j.attempts,
    j.max_attempts, j.last_error, j.created_at, j.updated_at, j.key, j.locked_at,
    j.locked_by, j.revision, j.flags, j.is_available, q.queue_name, o.timeout
  from {schema}._private_jobs as j
  left join {schema}._private_job_queues as q on q.id = j.job_queue_id
  left join {schema}._private_py_job_options as o on o.job_id = j.id
  where j.locked_by = %(pool_id)s and j.id <> all(%(known_ids)s::bigint[])
  order by j.priority, j.run_at, j.id
"""

# Free jobs and queues whose lock is older than 4 hours (a crashed worker).
# run_at is kept, as force_unlock_workers keeps it: a released job of a named
# queue is still the first of its queue, and runs before the jobs behind it.
# %(now)s: the worker's clock with use_local_time, else null (the database's).
RELEASE_STALE_LOCKS = """
  with jobs as (
    update {schema}._private_jobs as j
    set locked_at = null, locked_by = null
    where j.locked_at < coalesce(%(now)s::timestamptz, now()) - %(lock_timeout)s::interval
    returning j.id
  ),
  queues as (
    update {schema}._private_job_queues as q
    set locked_at = null, locked_by = null
    where q.locked_at < coalesce(%(now)s::timestamptz, now()) - %(lock_timeout)s::interval
    returning q.id
  )
  select (select count(*) from jobs) as jobs, (select count(*) from queues) as queues
"""
