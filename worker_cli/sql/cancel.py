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

# Record as cancelled the jobs that have a cancel request: their rows
# deleted, a history row each (state cancelled, kept a day; its attempts the
# attempt the job was at when py_cancel_jobs asked, not the max_attempts it
# set on the row: migrations/py/000023.sql) listed in the
# expiry ledger (migrations/py/000011.sql, at most 1,000 ids a ledger row),
# their uniqueness locks and requests deleted. Two callers:
# - a pool writing its jobs' failures or giving back unstarted jobs
#   (%(job_ids)s, sent after FAIL_BATCH or RETURN_JOBS in the same
#   transaction: they leave such a job locked by this pool, %(pool_id)s): its
#   named queue is unlocked; the history keeps the failure's message
#   (%(messages)s, beside %(job_ids)s; none: the job's last_error) and
#   whether it timed out (%(timed_out)s);
# - the upkeep (with the pruning, by whichever pool wins its lock;
#   %(job_ids)s and %(pool_id)s null): a job with a cancel request that is no
#   longer locked (its Node worker failed it, its crashed pool's jobs were
#   released); requests of jobs that are gone (the job succeeded) are deleted.
# Returns how many jobs were recorded.
RECORD_CANCELLED = """
  with cancelled as (
    delete from {schema}._private_jobs as j
    using {schema}._private_py_cancellations as c
    where c.job_id = j.id
      and case when %(job_ids)s::bigint[] is null then j.locked_at is null
        else j.id = any(%(job_ids)s::bigint[]) and j.locked_by = %(pool_id)s end
    returning j.*, c.requested_at, c.reason, c.attempts as attempt
  ),
  recorded as (
    insert into {schema}._private_py_job_history (
      job_id, state, task_identifier, queue_name, key, priority, attempts, max_attempts,
      revision, flags, last_error, created_at, run_at, started_at, finished_at, pool_id,
      cancel_requested_at, cancel_reason, timed_out, expires_at
    )
    select d.id, 'cancelled', t.identifier, q.queue_name, d.key, d.priority,
      coalesce(d.attempt, d.attempts),
      d.max_attempts, d.revision, d.flags, coalesce(m.message, d.last_error), d.created_at,
      d.run_at, d.locked_at, now(), d.locked_by, d.requested_at, d.reason,
      d.id = any(%(timed_out)s::bigint[]), now() + interval '1 day'
    from cancelled as d
    join {schema}._private_tasks as t on t.id = d.task_id
    left join {schema}._private_job_queues as q on q.id = d.job_queue_id
    left join unnest(%(job_ids)s::bigint[], %(messages)s::text[]) as m (id, message)
      on m.id = d.id
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
  unlocked as (
    update {schema}._private_job_queues as q
    set locked_at = null, locked_by = null
    where q.id in (
        select cancelled.job_queue_id from cancelled where cancelled.locked_by = %(pool_id)s
      )
      and q.locked_by = %(pool_id)s
  ),
  answered as (
    delete from {schema}._private_py_cancellations as c
    where c.job_id in (select cancelled.id from cancelled)
      or (%(job_ids)s::bigint[] is null
          and not exists (select 1 from {schema}._private_jobs as j where j.id = c.job_id))
  )
  select count(*) from cancelled
"""
