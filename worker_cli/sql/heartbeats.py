"""The heartbeat's statements (migrations/py/000002.sql and 000004.sql;
:mod:`worker_cli.worker.background.heartbeat`), and the refresh of long jobs' locks that
runs with it (:mod:`worker_cli.worker.background.lock_refresh`)."""

from __future__ import annotations

# Record that this pool is alive, with what it reports (migrations/py/000004.sql,
# and 000012.sql for its stuck jobs: null where the pool reports nothing; the
# previous beat's counter and time are kept, for the dashboard's rate). Returns
# whether the pool had to register (its first beat, or another pool declared it
# dead meanwhile and released its jobs), and the database's time of the beat.
HEARTBEAT_BEAT = """
  with beat as (
    update {schema}._private_py_heartbeats as h
    set beat_at = now(),
        timeout = %(timeout)s::interval,
        concurrency = %(concurrency)s,
        task_identifiers = %(task_identifiers)s::text[],
        version = %(version)s,
        jobs_done_before = h.jobs_done,
        beat_before = h.beat_at,
        jobs_done = %(jobs_done)s,
        stuck_job_ids = %(stuck_job_ids)s::bigint[]
    where h.pool_id = %(pool_id)s
    returning h.pool_id
  ),
  registered as (
    insert into {schema}._private_py_heartbeats as h (
      pool_id, timeout, hostname, pid, concurrency, task_identifiers, version, jobs_done,
      stuck_job_ids
    )
    select %(pool_id)s, %(timeout)s::interval, %(hostname)s, %(pid)s, %(concurrency)s,
      %(task_identifiers)s::text[], %(version)s, %(jobs_done)s, %(stuck_job_ids)s::bigint[]
    where not exists (select 1 from beat)
    on conflict (pool_id) do nothing
    returning h.pool_id
  )
  select exists (select 1 from registered), now()
"""

# Declare dead every other pool that has not beaten for its own timeout, counted
# from its last beat or from %(watching_since)s, whichever is later: the first
# beat of this pool's current uninterrupted run of beats (after an outage for
# everyone, every pool gets its whole timeout again). Deletes its row and
# releases its jobs and queues. The attempt the dead pool had counted when it
# fetched a job stays counted; last_error says what happened (and is appended
# to the job's attempt errors, _private_py_job_errors); run_at is kept, so
# a job of a named queue stays ahead of the jobs behind it. Only locked_by
# values that had a heartbeat row are touched, never Node's.
HEARTBEAT_REAP = """
  with dead as (
    delete from {schema}._private_py_heartbeats as h
    where greatest(h.beat_at, %(watching_since)s::timestamptz) < now() - h.timeout
      and h.pool_id <> %(pool_id)s
    returning h.pool_id, h.beat_at, h.timeout, h.hostname, h.pid
  ),
  jobs as (
    update {schema}._private_jobs as j
    set locked_at = null,
        locked_by = null,
        last_error = 'the worker pool ' || dead.pool_id
          || coalesce(' (host ' || dead.hostname || ', pid ' || dead.pid || ')', '')
          || ' running this job was declared dead: no heartbeat since '
          || dead.beat_at || ' (timeout ' || dead.timeout || ')',
        updated_at = now()
    from dead
    where j.locked_by = dead.pool_id
    returning dead.pool_id, j.id, j.task_id, j.attempts, j.max_attempts, j.last_error
  ),
  attempt_errors as (
    insert into {schema}._private_py_job_errors (
      job_id, task_identifier, attempt, error, retried, pool_id
    )
    select jobs.id, t.identifier,
      coalesce(
        (select c.attempts from {schema}._private_py_cancellations as c where c.job_id = jobs.id),
        jobs.attempts
      ),
      jobs.last_error,
      jobs.attempts < jobs.max_attempts, jobs.pool_id
    from jobs join {schema}._private_tasks as t on t.id = jobs.task_id
  ),
  queues as (
    update {schema}._private_job_queues as q
    set locked_at = null, locked_by = null
    from dead
    where q.locked_by = dead.pool_id
    returning dead.pool_id
  )
  select dead.pool_id, dead.hostname, dead.pid, dead.beat_at,
    extract(epoch from now() - greatest(dead.beat_at, %(watching_since)s::timestamptz))::float8,
    (select count(*) from jobs where jobs.pool_id = dead.pool_id) as jobs,
    (select count(*) from queues where queues.pool_id = dead.pool_id) as queues
  from dead
"""

# A pool stopping cleanly (every result written) forgets its heartbeat.
HEARTBEAT_REMOVE = """
  delete from {schema}._private_py_heartbeats where pool_id = %(pool_id)s
"""

# Long jobs keep their locks (worker_cli/worker/background/lock_refresh.py): the jobs of
# %(job_ids)s that this pool holds, locked longer ago than %(age)s, and their
# named queues, are locked again now, so that no 4-hour stale-lock sweep
# (Node's or ours) releases a job that is still running. Only locked_at
# changes, and only on this pool's own locks: Node reads it only in its fetch,
# its sweep and its admin functions, which then go on treating the job as
# running. Primary-key lookups for the jobs. %(now)s: the worker's clock with
# use_local_time, else null (the database's).
REFRESH_LOCKS = """
  with jobs as (
    update {schema}._private_jobs as j
    set locked_at = coalesce(%(now)s::timestamptz, now())
    where j.id = any(%(job_ids)s::bigint[]) and j.locked_by = %(pool_id)s
      and j.locked_at < coalesce(%(now)s::timestamptz, now()) - %(age)s::interval
    returning j.job_queue_id
  ),
  queues as (
    update {schema}._private_job_queues as q
    set locked_at = coalesce(%(now)s::timestamptz, now())
    where q.id in (select jobs.job_queue_id from jobs) and q.locked_by = %(pool_id)s
    returning q.id
  )
  select (select count(*) from jobs), (select count(*) from queues)
"""
