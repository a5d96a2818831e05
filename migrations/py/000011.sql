-- The history's cost per finished job: one row and its primary key, nothing
-- more (Python-only; Node never reads these objects).
--
-- Every success a Python pool records writes a history row in its completion
-- statement, so each index on the history is paid once per job, on the path
-- that finishes jobs. Two were: expires_at (for the pruning) and (finished_at,
-- job_id) (for the dashboard's Finished view). Measured on a drain of 200,000
-- jobs, each cost about 0.6 us of PostgreSQL CPU per job, a sixth of what
-- history on adds (README, "The cost of history"). Both go:
--   - the pruning finds expired rows through a ledger written once per
--     statement that records jobs (a completion batch, a cancel, an archive):
--     when its rows expire and their ids, at most 1,000 ids a ledger row;
--   - the Finished view pages through the primary key, newest job first.
drop index {{schema}}._private_py_job_history_finished_at;
drop index {{schema}}._private_py_job_history_expires_at;

create table {{schema}}._private_py_job_history_expiry (
  id bigint primary key generated always as identity,
  -- When the rows of job_ids expire (their expires_at).
  expires_at timestamptz not null,
  job_ids bigint[] not null check (cardinality(job_ids) between 1 and 1000)
);
create index _private_py_job_history_expiry_expires_at
  on {{schema}}._private_py_job_history_expiry (expires_at);
alter table {{schema}}._private_py_job_history_expiry enable row level security;

-- The rows already recorded, in ledger rows of up to 1,000 ids.
insert into {{schema}}._private_py_job_history_expiry (expires_at, job_ids)
select h.expires_at, array_agg(h.job_id order by h.job_id)
from (
  select x.job_id, x.expires_at,
    (row_number() over (partition by x.expires_at order by x.job_id) - 1) / 1000 as chunk
  from {{schema}}._private_py_job_history as x
) as h
group by h.expires_at, h.chunk;

-- py_cancel_jobs (py/000008.sql) as before, and its cancelled jobs in the ledger.
create or replace function {{schema}}.py_cancel_jobs(job_ids bigint[], reason text default null)
returns table (id bigint, state text)
language plpgsql
volatile
as $fn$
#variable_conflict use_column
declare
  v_cancelled bigint[];
  v_requested bigint[];
  v_told bigint[];
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
    returning job_id, expires_at
  ),
  expiry as (
    insert into {{schema}}._private_py_job_history_expiry (expires_at, job_ids)
    select min(r.expires_at), array_agg(r.job_id)
    from (select recorded.*, (row_number() over () - 1) / 1000 as chunk from recorded) as r
    group by r.chunk
  ),
  unlocked as (
    delete from {{schema}}._private_py_unique_locks as l
    where l.job_id in (select g.id from gone as g)
  ),
  options as (
    delete from {{schema}}._private_py_job_options as o
    where o.job_id in (select g.id from gone as g)
    returning o.job_id, o.notify_on_finish
  )
  select
    coalesce((select array_agg(recorded.job_id) from recorded), '{}'),
    coalesce((select array_agg(options.job_id) from options where options.notify_on_finish), '{}')
  into v_cancelled, v_told;

  -- Their waiters (wait_for_job) are told, as when a worker finishes a job,
  -- 300 ids a notification (under NOTIFY's 8000 bytes).
  for i in 1 .. coalesce(cardinality(v_told), 0) by 300 loop
    perform pg_notify(
      {{schema}}.py_channel('finished'), array_to_string(v_told[i:i + 299], ',')
    );
  end loop;

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
    perform pg_notify({{schema}}.py_channel('cancel'), array_to_string(v_requested, ','));
  end if;
  return query select r.job_id, 'running'::text from unnest(v_requested) as r(job_id);

  -- Any other id: gone already (or never there).
  return query
  select i.job_id, (select s.state from {{schema}}.py_job_status(i.job_id) as s)
  from unnest(py_cancel_jobs.job_ids) as i(job_id)
  where i.job_id <> all(v_cancelled) and i.job_id <> all(v_requested);
end;
$fn$;
