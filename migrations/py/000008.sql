-- The NOTIFY channel "<schema>:py:<kind>" (kind: cancel, finished), the
-- same name as worker_cli.schema.lifecycle.channel gives: a schema name too
-- long for PostgreSQL's 63 bytes is cut between characters and the first 8
-- hex digits of its SHA-256 appended after a "~".
create or replace function {{schema}}.py_channel(kind text)
returns text
language plpgsql
immutable
as $fn$
declare
  v_schema text := {{schema_name}};
  v_suffix text := ':py:' || kind;
  v_room int;
  v_cut text := '';
begin
  if octet_length(v_schema || v_suffix) <= 63 then
    return v_schema || v_suffix;
  end if;
  v_room := 63 - octet_length(v_suffix) - 9;
  for i in 1 .. length(v_schema) loop
    exit when octet_length(v_cut || substr(v_schema, i, 1)) > v_room;
    v_cut := v_cut || substr(v_schema, i, 1);
  end loop;
  return v_cut || '~' || left(encode(sha256(convert_to(v_schema, 'UTF8')), 'hex'), 8)
    || v_suffix;
end;
$fn$;

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
    returning job_id
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
