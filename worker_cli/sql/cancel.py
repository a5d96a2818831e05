"""Cancelling jobs (migrations/py/000008.sql): the requests, the pools'
watch of them, and the upkeep that records cancelled jobs."""

from __future__ import annotations

# Cancel jobs (migrations/py/000008.sql): each id with its state after the call.
CANCEL_JOBS = """
  select id, state from {schema}.py_cancel_jobs(%(job_ids)s::bigint[], %(reason)s)
"""

# The cancel requests of the jobs a pool holds (worker_cli/worker/supervision/cancel_watch.py).
CANCEL_REQUESTS = """
  select c.job_id, c.reason
  from {schema}._private_py_cancellations as c
  where c.pool_id = %(pool_id)s
"""

# A failure whose task says on_timeout="cancel": a cancel request for each job
# (this pool's, still locked by it), sent with the failure statement in one
# transaction, so that the failure statement records it as cancelled (never
# retried), with the reason %(reasons)s. Primary-key lookups only.
REQUEST_CANCELS = """
  insert into {schema}._private_py_cancellations as c (job_id, reason, pool_id)
  select j.id,
    (select r.reason from unnest(%(job_ids)s::bigint[], %(reasons)s::text[]) as r (id, reason)
     where r.id = j.id limit 1),
    j.locked_by
  from {schema}._private_jobs as j
  where j.id = any(%(job_ids)s::bigint[]) and j.locked_by = %(pool_id)s
  on conflict (job_id) do nothing
"""

# Upkeep (with the pruning, by whichever pool wins its lock): a job with a
# cancel request that is no longer locked (its Node worker failed it, its
# crashed pool's jobs were released) is recorded as cancelled; requests of
# jobs that are gone (the job succeeded) are deleted.
FINALIZE_CANCELLED = """
  with cancelled as (
    delete from {schema}._private_jobs as j
    using {schema}._private_py_cancellations as c
    where c.job_id = j.id and j.locked_at is null
    returning j.*, c.requested_at, c.reason
  ),
  recorded as (
    insert into {schema}._private_py_job_history (
      job_id, state, task_identifier, queue_name, key, priority, attempts, max_attempts,
      revision, flags, last_error, created_at, run_at, finished_at, cancel_requested_at,
      cancel_reason, expires_at
    )
    select d.id, 'cancelled', t.identifier, q.queue_name, d.key, d.priority, d.attempts,
      d.max_attempts, d.revision, d.flags, d.last_error, d.created_at, d.run_at, now(),
      d.requested_at, d.reason, now() + interval '1 day'
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
  stale_requests as (
    delete from {schema}._private_py_cancellations as c
    where not exists (select 1 from {schema}._private_jobs as j where j.id = c.job_id)
       or c.job_id in (select cancelled.id from cancelled)
  )
  select count(*) from cancelled
"""
