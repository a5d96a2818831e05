"""The heartbeat's statements (migrations/py/000002.sql, 000004.sql and
000025.sql; :mod:`worker_cli.worker.background.heartbeat` and its session sign,
:mod:`worker_cli.worker.background.session_sign`), and the refresh of long jobs' locks that
runs with it (:mod:`worker_cli.worker.background.lock_refresh`)."""

from __future__ import annotations

# Take the session sign (worker_cli/worker/background/session_sign.py): a
# session-level advisory lock, (%(sign_class)s, %(key)s), on the heartbeat's
# connection. Returns whether it was taken (false: another session holds that
# key), the server's start time and this session's backend pid.
SIGN_TAKE = """
  select pg_catalog.pg_try_advisory_lock(%(sign_class)s::int, %(key)s::int),
    pg_catalog.pg_postmaster_start_time(), pg_catalog.pg_backend_pid()
"""

# Record that this pool is alive, with what it reports (migrations/py/000004.sql,
# 000012.sql for its stuck jobs, 000025.sql for its session sign: null where
# the pool reports nothing or holds no sign; a beat is sent on the session
# holding the sign, so the sign is held now and sign_missing_since is
# cleared). The previous beat's counter and time are kept, for the
# dashboard's rate. Returns whether the pool had to register (its first beat,
# or another pool declared it dead meanwhile and released its jobs), and the
# database's time of the beat.
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
        stuck_job_ids = %(stuck_job_ids)s::bigint[],
        sign_key = %(sign_key)s::int,
        sign_server_start = %(sign_server_start)s::timestamptz,
        sign_grace = %(sign_grace)s::interval,
        sign_missing_since = null
    where h.pool_id = %(pool_id)s
    returning h.pool_id
  ),
  registered as (
    insert into {schema}._private_py_heartbeats as h (
      pool_id, timeout, hostname, pid, concurrency, task_identifiers, version, jobs_done,
      stuck_job_ids, sign_key, sign_server_start, sign_grace
    )
    select %(pool_id)s, %(timeout)s::interval, %(hostname)s, %(pid)s, %(concurrency)s,
      %(task_identifiers)s::text[], %(version)s, %(jobs_done)s, %(stuck_job_ids)s::bigint[],
      %(sign_key)s::int, %(sign_server_start)s::timestamptz, %(sign_grace)s::interval
    where not exists (select 1 from beat)
    on conflict (pool_id) do nothing
    returning h.pool_id
  )
  select exists (select 1 from registered), now()
"""

# Declare dead every other pool that is silent or whose session is gone, and
# look at this pool's own sign. Runs every second or so (the heartbeat's tick).
#
# Silent: it has not beaten for its own timeout, counted from its last beat or
# from %(watching_since)s, whichever is later: the first beat of this pool's
# current uninterrupted run of beats (after an outage for everyone, every pool
# gets its whole timeout again).
#
# Session gone: its sign (migrations/py/000025.sql), taken on this very run of
# the server (pg_postmaster_start_time(): a restart or a failover voids every
# sign until its pool takes it again), has been missing from pg_locks for the
# pool's own sign_grace, counted from when a pool first found it missing
# (sign_missing_since, set and cleared here; a pool's beat clears it too).
# The sign's state is read from pg_locks once (held); the verdict is checked
# again on the row as deleted, so a pool that took its sign back meanwhile
# (its beat clears sign_missing_since) is not declared dead.
#
# A dead pool's row is deleted and its jobs and queues released. The attempt
# the dead pool had counted when it fetched a job stays counted; last_error
# says what happened (and is appended to the job's attempt errors,
# _private_py_job_errors); run_at is kept, so a job of a named queue stays
# ahead of the jobs behind it. Only locked_by values that had a heartbeat row
# are touched, never Node's. Released jobs are announced on "jobs:insert" (as
# add_job does), so that every worker fetches them now.
#
# Returns one row: whether this pool's own sign (%(sign_key)s) is held by
# this very session (false through a pooler in transaction mode, whose
# statements run on whichever server connection it lends), and the dead
# pools as a JSON array.
# Sent first, in the reap's transaction: the reap's plan is estimated to
# cost more than jit_above_cost once the jobs table holds some 150,000 rows
# (its release of a dead pool's jobs, which a one-time filter skips when no
# pool is dead), and JIT-compiling it costs about a second of the server's
# CPU, every second, for every pool: 16 long-running pools draining 200,000
# jobs did 3,300 jobs/s with it, 44,000 without (docs/performance.md, "A fleet").
REAP_SETTINGS = "set local jit = off"

HEARTBEAT_REAP = """
  with held as materialized (
    select l.objid, l.pid
    from pg_catalog.pg_locks as l
    where l.locktype = 'advisory' and l.objsubid = 2 and l.granted
      and l.classid = %(sign_class)s::int::oid
      and l.database = (
        select d.oid from pg_catalog.pg_database as d where d.datname = current_database()
      )
  ),
  judged as (
    select h.pool_id, h.sign_key, h.beat_at >= now() - h.timeout as beating,
      h.sign_key is not null
        and h.sign_server_start = pg_catalog.pg_postmaster_start_time()
        and not exists (select 1 from held where held.objid = h.sign_key::oid) as sign_missing
    from {schema}._private_py_heartbeats as h
    where h.pool_id <> %(pool_id)s
  ),
  dead as (
    delete from {schema}._private_py_heartbeats as h
    using judged
    where h.pool_id = judged.pool_id
      and (
        greatest(h.beat_at, %(watching_since)s::timestamptz) < now() - h.timeout
        or (
          judged.sign_missing and h.sign_key = judged.sign_key
          and h.sign_server_start = pg_catalog.pg_postmaster_start_time()
          and h.sign_missing_since < now() - h.sign_grace
        )
      )
    returning h.pool_id, h.beat_at, h.timeout, h.hostname, h.pid,
      greatest(h.beat_at, %(watching_since)s::timestamptz) >= now() - h.timeout as session_gone,
      h.sign_missing_since, h.sign_grace
  ),
  reason as (
    select dead.*,
      'the worker pool ' || dead.pool_id
        || coalesce(' (host ' || dead.hostname || ', pid ' || dead.pid || ')', '')
        || ' running this job was declared dead: '
        || case when dead.session_gone
             then 'its database session ended (gone since ' || dead.sign_missing_since
               || ', grace ' || dead.sign_grace || ')'
             else 'no heartbeat since ' || dead.beat_at || ' (timeout ' || dead.timeout || ')'
           end as last_error
    from dead
  ),
  marked as (
    update {schema}._private_py_heartbeats as h
    set sign_missing_since = case when judged.sign_missing then now() end
    from judged
    where h.pool_id = judged.pool_id
      and h.pool_id not in (select dead.pool_id from dead)
      and h.sign_key = judged.sign_key
      and judged.sign_missing = (h.sign_missing_since is null)
  ),
  jobs as (
    update {schema}._private_jobs as j
    set locked_at = null,
        locked_by = null,
        last_error = reason.last_error,
        updated_at = now()
    from reason
    where j.locked_by = reason.pool_id
      and exists (select 1 from dead)  -- one-time: no scan of the jobs without a dead pool
    returning reason.pool_id, j.id, j.task_id, j.attempts, j.max_attempts, j.last_error
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
  ),
  released as (
    select count(*) as n from jobs
  )
  select
    exists (
      select 1 from held
      where held.objid = %(sign_key)s::int::oid and held.pid = pg_catalog.pg_backend_pid()
    ),
    (
      select pg_catalog.pg_notify(
        'jobs:insert', '{{"r":' || random()::text || ',"count":' || released.n || '}}'
      )
      from released where released.n > 0
    ) is not null,
    (
      select json_agg(json_build_object(
        'pool_id', dead.pool_id, 'hostname', dead.hostname, 'pid', dead.pid,
        'session_gone', dead.session_gone,
        'since', coalesce(
          case when dead.session_gone then dead.sign_missing_since end, dead.beat_at
        ),
        'silent_for', extract(epoch from now() - case
          when dead.session_gone then dead.sign_missing_since
          else greatest(dead.beat_at, %(watching_since)s::timestamptz)
        end)::float8,
        'jobs', (select count(*) from jobs where jobs.pool_id = dead.pool_id),
        'queues', (select count(*) from queues where queues.pool_id = dead.pool_id)
      ))
      from dead
    ),
    -- the other pools that look alive: how many share the sweeping
    (select count(*) from judged where judged.beating and not judged.sign_missing)
"""

# A pool stopping with jobs it could not write back keeps its row (others
# release those jobs once it is silent for its timeout) but gives up its
# sign first: its jobs may still be running in a process that has not ended.
SIGN_FORGET = """
  update {schema}._private_py_heartbeats
  set sign_key = null, sign_server_start = null, sign_missing_since = null
  where pool_id = %(pool_id)s
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
