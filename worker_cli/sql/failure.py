"""The statements that fail a pool's jobs or give them back (the completer's,
through :mod:`worker_cli.worker.pipeline.result_writer`). Both leave a job
that has a cancel request locked by the pool, untouched, for
:data:`~worker_cli.sql.cancel.RECORD_CANCELLED`, sent after them in the same
transaction, to record as cancelled."""

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
# task says on_timeout="cancel", a task raising Cancel) is not retried: its
# row is left as it is (cancelling), for RECORD_CANCELLED to record, with this
# failure's message. Each failed attempt (not a snooze) appends its error and
# its traceback (%(tracebacks)s, bounded by the worker; py/000023.sql) to
# _private_py_job_errors (migrations/py/000018.sql): last_error keeps only the
# newest message; and the lines its task logged (%(logs)s: null when none or
# job logs are off) to _private_py_job_logs (000027.sql). The attempt
# recorded is the one the job is at: for a job asked to cancel while it ran
# (py_cancel_jobs set its attempts to max_attempts), the attempt its cancel
# request kept. The waiters of the jobs
# (notify_on_finish) are told, in one notification.
FAIL_BATCH = """
  with failure as (
    select f.*,
      f.snooze is not null and (f.max_snoozes is null or coalesce(o.snoozes, 0) < f.max_snoozes)
        as snoozing,
      case when f.snooze is not null
        then 'Snooze: snoozed ' || f.max_snoozes || ' times already (max_snoozes)'
        else f.message end as error,
      coalesce(
        (select c.attempts from {schema}._private_py_cancellations as c where c.job_id = f.id),
        cur.attempts
      ) as attempt,
      (select t.identifier from {schema}._private_tasks as t where t.id = cur.task_id)
        as task_identifier,
      exists (
        select 1 from {schema}._private_py_cancellations as c
        where c.job_id = f.id and cur.locked_by = %(pool_id)s
      ) as cancelling
    from unnest(
      %(job_ids)b::bigint[], %(messages)s::text[], %(items)s::text[], %(permanent)s::bool[],
      %(timed_out)s::bool[], %(delays)s::float8[], %(snoozes)s::float8[], %(max_snoozes)s::int[],
      %(tracebacks)s::text[], %(logs)s::text[], %(logs_dropped)s::int[]
    ) as f(
      id, message, items, permanent, timed_out, delay, snooze, max_snoozes, traceback, logs,
      logs_dropped
    )
    left join {schema}._private_py_job_options as o on o.job_id = f.id
    left join {schema}._private_jobs as cur on cur.id = f.id
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
    where j.id = failure.id and j.locked_by = %(pool_id)s and not failure.cancelling
    returning j.id, j.job_queue_id, failure.snoozing, j.attempts < j.max_attempts as retried
  ),
  attempt_errors as (
    insert into {schema}._private_py_job_errors (
      job_id, task_identifier, attempt, error, retried, pool_id, traceback
    )
    select failure.id, failure.task_identifier, failure.attempt, failure.error,
      coalesce(failed.retried, false), %(pool_id)s, failure.traceback
    from failure
    left join failed on failed.id = failure.id
    where not failure.snoozing
      and (failed.id is not null or failure.cancelling)
  ),
  attempt_logs as (
    insert into {schema}._private_py_job_logs (job_id, attempt, outcome, lines, dropped)
    select failure.id, failure.attempt,
      case when failure.cancelling then 'cancelled' else 'failed' end,
      failure.logs, coalesce(failure.logs_dropped, 0)
    from failure
    left join failed on failed.id = failure.id
    where failure.logs is not null and not failure.snoozing
      and (failed.id is not null or failure.cancelling)
  ),
  snoozes_counted as (
    insert into {schema}._private_py_job_options as o (job_id, snoozes)
    select failed.id, 1 from failed where failed.snoozing
    on conflict (job_id) do update set snoozes = o.snoozes + 1
  ),
  unlocked as (
    update {schema}._private_job_queues as q
    set locked_at = null, locked_by = null
    where q.id in (select failed.job_queue_id from failed) and q.locked_by = %(pool_id)s
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
# one with a cancel request is left for RECORD_CANCELLED, which records it as
# cancelled (never run).
RETURN_JOBS = """
  with given as (
    select unnest(%(job_ids)b::bigint[]) as id
  ),
  returned as (
    update {schema}._private_jobs as j
    set attempts = greatest(0, j.attempts - 1), locked_at = null, locked_by = null
    where j.id in (select given.id from given) and j.locked_by = %(pool_id)s
      and not exists (select 1 from {schema}._private_py_cancellations as c where c.job_id = j.id)
    returning j.job_queue_id
  )
  update {schema}._private_job_queues as q
  set locked_at = null, locked_by = null
  where q.id in (select returned.job_queue_id from returned) and q.locked_by = %(pool_id)s
"""
