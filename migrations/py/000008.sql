-- Cancelling jobs (Python-only; Node never calls it, and it changes Node's
-- rows only as Node's own remove_job does).
--
-- py_cancel_jobs(job_ids, reason): one transaction, rows locked in id order
-- (FOR UPDATE: a fetch that has just locked one is waited for; fetches skip
-- rows being cancelled). For each job:
--   waiting, scheduled, retrying or failed (unlocked, or locked more than 4
--     hours ago by a crashed worker): deleted and recorded in the history as
--     cancelled (kept a day), its uniqueness lock and options gone with it: it
--     never runs;
--   running (locked): a cancel request (_private_py_cancellations) and, on
--     Node's row, attempts = max_attempts and key = null, exactly what Node's
--     remove_job does to a locked job: it is never retried. A Python pool
--     running it is told at once (NOTIFY "<schema>:py:cancel", ids); its
--     outcome is recorded as cancelled unless the task returns normally
--     (then it succeeded: the work happened). A Node worker cannot be told:
--     it finishes the job, and a failure is recorded as cancelled by the
--     Python pools' upkeep;
--   gone: nothing changes.
-- Returns each id with its state after the call ('cancelled', 'running' for
-- a request, or the state py_job_status gives a job that is gone).
create or replace function {{schema}}.py_cancel_jobs(job_ids bigint[], reason text default null)
returns table (id bigint, state text)
language plpgsql
volatile
as $fn$
#variable_conflict use_column
declare
  v_cancelled bigint[];
  v_requested bigint[];
begin
  -- Lock the rows first, in id order (two cancels of overlapping sets cannot
  -- deadlock), waiting for a fetch that is locking one right now.
  perform 1
  from {{schema}}._private_jobs as j
  where j.id = any(py_cancel_jobs.job_ids)
  order by j.id
  for update;

  with gone as (
    delete from {{schema}}._private_jobs as j
    where j.id = any(py_cancel_jobs.job_ids)
      and (j.locked_at is null or j.locked_at < now() - interval '4 hours')
    returning j.*
  ),
  recorded as (
    insert into {{schema}}._private_py_job_history (
      job_id, state, task_identifier, queue_name, key, priority, attempts, max_attempts,
      revision, flags, last_error, created_at, run_at, finished_at, cancel_requested_at,
      cancel_reason, expires_at
    )
    select g.id, 'cancelled', t.identifier, q.queue_name, g.key, g.priority, g.attempts,
      g.max_attempts, g.revision, g.flags, g.last_error, g.created_at, g.run_at, now(), now(),
      py_cancel_jobs.reason, now() + interval '1 day'
    from gone as g
    join {{schema}}._private_tasks as t on t.id = g.task_id
    left join {{schema}}._private_job_queues as q on q.id = g.job_queue_id
    on conflict (job_id) do nothing
    returning job_id
  ),
  unlocked as (
    delete from {{schema}}._private_py_unique_locks as l
    where l.job_id in (select g.id from gone as g)
  ),
  options as (
    delete from {{schema}}._private_py_job_options as o
    where o.job_id in (select g.id from gone as g)
  )
  select coalesce(array_agg(recorded.job_id), '{}') into v_cancelled from recorded;

  return query select r.job_id, 'cancelled'::text from unnest(v_cancelled) as r(job_id);

  -- The running ones: a request, and Node's remove_job treatment.
  with requested as (
    insert into {{schema}}._private_py_cancellations as c (job_id, reason, pool_id)
    select j.id, py_cancel_jobs.reason, j.locked_by
    from {{schema}}._private_jobs as j
    where j.id = any(py_cancel_jobs.job_ids) and j.locked_at is not null
    on conflict (job_id) do update set reason = coalesce(excluded.reason, c.reason)
    returning c.job_id
  ),
  marked as (
    update {{schema}}._private_jobs as j
    set attempts = j.max_attempts, key = null, updated_at = now()
    where j.id in (select requested.job_id from requested)
    returning j.id
  )
  select coalesce(array_agg(marked.id order by marked.id), '{}') into v_requested from marked;

  if cardinality(v_requested) > 0 then
    perform pg_notify(
      {{schema_name}} || ':py:cancel', array_to_string(v_requested, ',')
    );
  end if;
  return query select r.job_id, 'running'::text from unnest(v_requested) as r(job_id);

  -- Any other id: gone already (or never there).
  return query
  select i.job_id, (select s.state from {{schema}}.py_job_status(i.job_id) as s)
  from unnest(py_cancel_jobs.job_ids) as i(job_id)
  where i.job_id <> all(v_cancelled) and i.job_id <> all(v_requested);
end;
$fn$;
