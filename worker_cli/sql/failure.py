"""The statements that fail a pool's jobs or give them back (the completer's,
through :mod:`worker_cli.worker.pipeline.result_writer`). Both record a job that has a
cancel request as cancelled instead: its row deleted, a history row
(state cancelled, kept 1 day) listed in the expiry ledger
(migrations/py/000011.sql, at most 1,000 ids a ledger row), its uniqueness
lock and its request deleted."""

from __future__ import annotations

# Failure: record the error, back off, release the lock. The backoff is
# graphile-worker's, exp(min(attempts, 10)) seconds after greatest(now(),
# run_at), unless the task's retry policy gave a delay (%(delays)s, seconds
# from now()). A batch job keeps only its failed items (their 0-based
# positions, as an int[] literal in ``items``), as they are stored: the payload
# is never re-encoded by the worker. attempts is not touched (it was counted
# when the job was fetched), except for a permanent failure (a payload that
# does not fit its task, an error its policy does not retry, Discard): its
# attempts are used up, as permanently_fail_jobs does. A snooze (%(snoozes)s:
# seconds) gives the attempt back and keeps last_error, as a job given back
# at shutdown, and is counted in the job's options; past %(max_snoozes)s it
# is a failure. A job with a cancel request (py_cancel_jobs, a timeout whose
# task says on_timeout="cancel", a task raising Cancel) is not retried: it is
# deleted and recorded as cancelled, timed out or not
# (timed_out). Each failed attempt (not a snooze) appends its error to
# _private_py_job_errors (migrations/py/000018.sql): last_error keeps only the
# newest. The waiters of the jobs (notify_on_finish) are told, in one
# notification.
FAIL_BATCH = """
  with failure as (
    select f.*,
      f.snooze is not null and (f.max_snoozes is null or coalesce(o.snoozes, 0) < f.max_snoozes)
        as snoozing,
      case when f.snooze is not null
        then 'Snooze: snoozed ' || f.max_snoozes || ' times already (max_snoozes)'
        else f.message end as error,
      cur.attempts as attempt,
      (select t.identifier from {schema}._private_tasks as t where t.id = cur.task_id)
        as task_identifier
    from unnest(
      %(job_ids)b::bigint[], %(messages)s::text[], %(items)s::text[], %(permanent)s::bool[],
      %(timed_out)s::bool[], %(delays)s::float8[], %(snoozes)s::float8[], %(max_snoozes)s::int[]
    ) as f(id, message, items, permanent, timed_out, delay, snooze, max_snoozes)
    left join {schema}._private_py_job_options as o on o.job_id = f.id
    left join {schema}._private_jobs as cur on cur.id = f.id
  ),
  cancelled as (
    delete from {schema}._private_jobs as j
    using failure, {schema}._private_py_cancellations as c
    where j.id = failure.id and c.job_id = j.id and j.locked_by = %(pool_id)s
    returning j.*, failure.message as message, failure.timed_out as timed_out, c.requested_at,
        c.reason
  ),
  recorded as (
    insert into {schema}._private_py_job_history (
      job_id, state, task_identifier, queue_name, key, priority, attempts, max_attempts,
      revision, flags, last_error, created_at, run_at, started_at, finished_at, pool_id,
      cancel_requested_at, cancel_reason, timed_out, expires_at
    )
    select d.id, 'cancelled', t.identifier, q.queue_name, d.key, d.priority, d.attempts,
      d.max_attempts, d.revision, d.flags, d.message, d.created_at, d.run_at, d.locked_at,
      now(), %(pool_id)s, d.requested_at, d.reason, d.timed_out, now() + interval '1 day'
    from cancelled as d
    join {schema}._private_tasks as t on t.id = d.task_id
    left join {schema}._private_job_queues as q on q.id = d.job_queue_id
    on conflict (job_id) do nothing
    returning job_id, expires_at
  ),

  expiry as (
    insert into {schema}._private_py_job_history_expiry (expires_at, job_ids)
    select min(r.expires_at), array_agg(r.job_id)
    from (select s.job_id, s.expires_at, (row_number() over () - 1) / 1000 as chunk
          from recorded as s) as r
    group by r.chunk
  ),
  released as (
    delete from {schema}._private_py_unique_locks as l
    where l.job_id in (select cancelled.id from cancelled)
  ),
  answered as (
    delete from {schema}._private_py_cancellations as c
    where c.job_id in (select cancelled.id from cancelled)
  ),
  failed as (
    update {schema}._private_jobs as j
    set last_error = case
          when failure.snoozing then j.last_error
          else failure.error end,
        attempts = case
          when failure.snoozing then greatest(0, j.attempts - 1)
          when failure.permanent then greatest(j.attempts, j.max_attempts)
          else j.attempts end,
        run_at = case
          when failure.snoozing then now() + failure.snooze * interval '1 second'
          when failure.delay is not null then now() + failure.delay * interval '1 second'
          else greatest(now(), j.run_at) + exp(least(j.attempts, 10)) * interval '1 second' end,
        payload = case when failure.items is null or json_typeof(j.payload) <> 'array'
          then j.payload
          else (
            select coalesce(json_agg(item.value order by item.position), '[]'::json)
            from json_array_elements(j.payload) with ordinality as item(value, position)
            where item.position - 1 = any(failure.items::int[])
          ) end,
        locked_at = null,
        locked_by = null,
        updated_at = now()
    from failure
    where j.id = failure.id and j.locked_by = %(pool_id)s
      and failure.id not in (select cancelled.id from cancelled)
    returning j.id, j.job_queue_id, failure.snoozing, j.attempts < j.max_attempts as retried
  ),
  attempt_errors as (
    insert into {schema}._private_py_job_errors (
      job_id, task_identifier, attempt, error, retried, pool_id
    )
    select failure.id, failure.task_identifier, failure.attempt, failure.error,
      coalesce(failed.retried, false), %(pool_id)s
    from failure
    left join failed on failed.id = failure.id
    where not failure.snoozing
      and (failed.id is not null or failure.id in (select cancelled.id from cancelled))
  ),
  snoozes_counted as (
    insert into {schema}._private_py_job_options as o (job_id, snoozes)
    select failed.id, 1 from failed where failed.snoozing
    on conflict (job_id) do update set snoozes = o.snoozes + 1
  ),
  unlocked as (
    update {schema}._private_job_queues as q
    set locked_at = null, locked_by = null
    where q.id in (
        select failed.job_queue_id from failed
        union all select cancelled.job_queue_id from cancelled
      )
      and q.locked_by = %(pool_id)s
  ),
  finished as (
    select o.job_id, o.notify_on_finish
    from {schema}._private_py_job_options as o
    where o.job_id = any(%(job_ids)b::bigint[])
  )
  select pg_notify(%(channel)s, array_to_string(w.ids[i:i + 299], ','))
  from (
    select array_agg(f.job_id) as ids from finished as f where f.notify_on_finish
  ) as w
  cross join generate_series(1, coalesce(cardinality(w.ids), 0), 300) as i
"""

# Give back fetched jobs that never started (shutdown), restoring the attempt;
# one with a cancel request is recorded as cancelled instead (never run).
RETURN_JOBS = """
  with given as (
    select unnest(%(job_ids)b::bigint[]) as id
  ),
  cancelled as (
    delete from {schema}._private_jobs as j
    using given, {schema}._private_py_cancellations as c
    where j.id = given.id and c.job_id = j.id and j.locked_by = %(pool_id)s
    returning j.*, j.last_error as message, false as timed_out, c.requested_at, c.reason
  ),
  recorded as (
    insert into {schema}._private_py_job_history (
      job_id, state, task_identifier, queue_name, key, priority, attempts, max_attempts,
      revision, flags, last_error, created_at, run_at, started_at, finished_at, pool_id,
      cancel_requested_at, cancel_reason, timed_out, expires_at
    )
    select d.id, 'cancelled', t.identifier, q.queue_name, d.key, d.priority, d.attempts,
      d.max_attempts, d.revision, d.flags, d.message, d.created_at, d.run_at, d.locked_at,
      now(), %(pool_id)s, d.requested_at, d.reason, d.timed_out, now() + interval '1 day'
    from cancelled as d
    join {schema}._private_tasks as t on t.id = d.task_id
    left join {schema}._private_job_queues as q on q.id = d.job_queue_id
    on conflict (job_id) do nothing
    returning job_id, expires_at
  ),

  expiry as (
    insert into {schema}._private_py_job_history_expiry (expires_at, job_ids)
    select min(r.expires_at), array_agg(r.job_id)
    from (select s.job_id, s.expires_at, (row_number() over () - 1) / 1000 as chunk
          from recorded as s) as r
    group by r.chunk
  ),
  released as (
    delete from {schema}._private_py_unique_locks as l
    where l.job_id in (select cancelled.id from cancelled)
  ),
  answered as (
    delete from {schema}._private_py_cancellations as c
    where c.job_id in (select cancelled.id from cancelled)
  ),
  returned as (
    update {schema}._private_jobs as j
    set attempts = greatest(0, j.attempts - 1), locked_at = null, locked_by = null
    where j.id in (select given.id from given) and j.locked_by = %(pool_id)s
      and j.id not in (select cancelled.id from cancelled)
    returning j.job_queue_id
  )
  update {schema}._private_job_queues as q
  set locked_at = null, locked_by = null
  where q.id in (
      select returned.job_queue_id from returned
      union all select cancelled.job_queue_id from cancelled
    )
    and q.locked_by = %(pool_id)s
"""
