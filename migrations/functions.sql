-- The public SQL API: seven functions with the exact signatures of
-- graphile-worker (Node) revision 20. Applied with "create or replace" in the
-- transaction of every revision, so they always match the newest definitions.

-- add_jobs: insert jobs in bulk; a spec whose job_key matches an available job
-- updates that job instead (see the job_key rules in the README).
create or replace function {{schema}}.add_jobs(
  specs {{schema}}.job_spec[],
  job_key_preserve_run_at boolean default false
) returns setof {{schema}}._private_jobs
language plpgsql
as $fn$
begin
  -- Register new task identifiers and queue names. Skipping the existing ones
  -- first keeps "on conflict do nothing" from using up identity values.
  insert into {{schema}}._private_tasks (identifier)
  select distinct s.identifier
  from unnest(specs) as s
  where not exists (
    select 1 from {{schema}}._private_tasks as t where t.identifier = s.identifier
  )
  on conflict do nothing;

  insert into {{schema}}._private_job_queues (queue_name)
  select distinct s.queue_name
  from unnest(specs) as s
  where s.queue_name is not null
    and not exists (
      select 1 from {{schema}}._private_job_queues as q where q.queue_name = s.queue_name
    )
  on conflict do nothing;

  -- A keyed job that cannot be updated any more (locked, or permanently
  -- failed) gives up its key and will not run again; the spec becomes a new
  -- job. Its last_error is kept for the record.
  update {{schema}}._private_jobs as j
  set key = null,
      attempts = j.max_attempts,
      updated_at = now()
  from unnest(specs) as s
  where s.job_key is not null
    and j.key = s.job_key
    and not j.is_available;

  -- Counts every spec, updated or inserted.
  perform pg_notify(
    'jobs:insert',
    '{"r":' || random()::text || ',"count":' || cardinality(specs)::text || '}'
  );

  return query
  insert into {{schema}}._private_jobs as j (
    job_queue_id, task_id, payload, run_at, max_attempts, key, priority, flags
  )
  select
    q.id,
    t.id,
    coalesce(s.payload, '{}'::json),
    coalesce(s.run_at, now()),
    coalesce(s.max_attempts, 25::smallint),
    s.job_key,
    coalesce(s.priority, 0::smallint),
    (select jsonb_object_agg(f.flag, true) from unnest(s.flags) as f(flag))
  from unnest(specs) with ordinality as s
  join {{schema}}._private_tasks as t on t.identifier = s.identifier
  left join {{schema}}._private_job_queues as q on q.queue_name = s.queue_name
  -- Ids follow the order of the specs, so a batch added to a named queue runs
  -- in that order.
  order by s.ordinality
  on conflict (key) do update set
    job_queue_id = excluded.job_queue_id,
    task_id = excluded.task_id,
    -- Two arrays accumulate (old items first); anything else is replaced.
    payload = case
      when json_typeof(j.payload) = 'array' and json_typeof(excluded.payload) = 'array'
        then (j.payload::jsonb || excluded.payload::jsonb)::json
      else excluded.payload
    end,
    max_attempts = excluded.max_attempts,
    -- preserve_run_at holds only while the job has never been attempted.
    run_at = case
      when job_key_preserve_run_at and j.attempts = 0 then j.run_at
      else excluded.run_at
    end,
    priority = excluded.priority,
    revision = j.revision + 1,
    flags = excluded.flags,
    attempts = 0,
    last_error = null,
    updated_at = now()
  where j.locked_at is null
  returning *;
end;
$fn$;

-- add_job: one job; job_key_mode chooses what happens to an existing keyed job.
create or replace function {{schema}}.add_job(
  identifier text,
  payload json default null::json,
  queue_name text default null::text,
  run_at timestamptz default null::timestamptz,
  max_attempts integer default null::integer,
  job_key text default null::text,
  priority integer default null::integer,
  flags text[] default null::text[],
  job_key_mode text default 'replace'::text
) returns {{schema}}._private_jobs
language plpgsql
as $fn$
declare
  v_job {{schema}}._private_jobs;
begin
  if add_job.job_key is not null
     and add_job.job_key_mode not in ('replace', 'preserve_run_at', 'unsafe_dedupe') then
    raise exception 'Invalid job_key_mode value, expected ''replace'', ''preserve_run_at'' or ''unsafe_dedupe''.'
      using errcode = 'GWBKM';
  end if;

  if add_job.job_key is null or add_job.job_key_mode is distinct from 'unsafe_dedupe' then
    select * into v_job
    from {{schema}}.add_jobs(
      array[row(
        add_job.identifier,
        add_job.payload,
        add_job.queue_name,
        add_job.run_at,
        add_job.max_attempts::smallint,
        add_job.job_key,
        add_job.priority::smallint,
        add_job.flags
      )::{{schema}}.job_spec],
      add_job.job_key_mode = 'preserve_run_at'
    );
    return v_job;
  end if;

  -- unsafe_dedupe: an existing job with this key wins, whatever its state;
  -- only its revision and updated_at move.
  insert into {{schema}}._private_tasks (identifier)
  select add_job.identifier
  where not exists (
    select 1 from {{schema}}._private_tasks as t where t.identifier = add_job.identifier
  )
  on conflict do nothing;

  if add_job.queue_name is not null then
    insert into {{schema}}._private_job_queues (queue_name)
    select add_job.queue_name
    where not exists (
      select 1 from {{schema}}._private_job_queues as q where q.queue_name = add_job.queue_name
    )
    on conflict do nothing;
  end if;

  insert into {{schema}}._private_jobs as j (
    job_queue_id, task_id, payload, run_at, max_attempts, key, priority, flags
  )
  select
    q.id,
    t.id,
    coalesce(add_job.payload, '{}'::json),
    coalesce(add_job.run_at, now()),
    coalesce(add_job.max_attempts::smallint, 25::smallint),
    add_job.job_key,
    coalesce(add_job.priority::smallint, 0::smallint),
    (select jsonb_object_agg(f.flag, true) from unnest(add_job.flags) as f(flag))
  from {{schema}}._private_tasks as t
  left join {{schema}}._private_job_queues as q on q.queue_name = add_job.queue_name
  where t.identifier = add_job.identifier
  on conflict (key) do update set
    revision = j.revision + 1,
    updated_at = now()
  returning * into v_job;

  if v_job.revision = 0 then
    perform pg_notify('jobs:insert', '{"r":' || random()::text || ',"count":1}');
  end if;
  return v_job;
end;
$fn$;

-- complete_jobs: delete the given jobs (unlocked, or locked over 4 hours ago).
create or replace function {{schema}}.complete_jobs(job_ids bigint[])
returns setof {{schema}}._private_jobs
language sql
as $fn$
  delete from {{schema}}._private_jobs as j
  where j.id = any(job_ids)
    and (j.locked_at is null or j.locked_at < now() - interval '4 hours')
  returning *;
$fn$;

-- permanently_fail_jobs: use up the attempts of the given jobs, keeping them.
create or replace function {{schema}}.permanently_fail_jobs(
  job_ids bigint[],
  error_message text default null::text
) returns setof {{schema}}._private_jobs
language sql
as $fn$
  update {{schema}}._private_jobs as j
  set last_error = coalesce(error_message, 'Manually marked as failed'),
      attempts = j.max_attempts,
      updated_at = now()
  where j.id = any(job_ids)
    and (j.locked_at is null or j.locked_at < now() - interval '4 hours')
  returning *;
$fn$;

-- reschedule_jobs: change the given fields of the given jobs; null keeps a field.
create or replace function {{schema}}.reschedule_jobs(
  job_ids bigint[],
  run_at timestamptz default null::timestamptz,
  priority integer default null::integer,
  attempts integer default null::integer,
  max_attempts integer default null::integer
) returns setof {{schema}}._private_jobs
language sql
as $fn$
  update {{schema}}._private_jobs as j
  set run_at = coalesce(reschedule_jobs.run_at, j.run_at),
      priority = coalesce(reschedule_jobs.priority::smallint, j.priority),
      attempts = coalesce(reschedule_jobs.attempts::smallint, j.attempts),
      max_attempts = coalesce(reschedule_jobs.max_attempts::smallint, j.max_attempts),
      updated_at = now()
  where j.id = any(job_ids)
    and (j.locked_at is null or j.locked_at < now() - interval '4 hours')
  returning *;
$fn$;

-- remove_job: delete the job with this key; a locked one keeps running but
-- loses its key and will not be retried.
create or replace function {{schema}}.remove_job(job_key text)
returns {{schema}}._private_jobs
language plpgsql
strict
as $fn$
declare
  v_job {{schema}}._private_jobs;
begin
  delete from {{schema}}._private_jobs as j
  where j.key = remove_job.job_key
    and (j.locked_at is null or j.locked_at < now() - interval '4 hours')
  returning * into v_job;

  if found then
    perform pg_notify('jobs:insert', '{"r":' || random()::text || ',"count":-1}');
    return v_job;
  end if;

  update {{schema}}._private_jobs as j
  set key = null,
      attempts = j.max_attempts,
      updated_at = now()
  where j.key = remove_job.job_key
  returning * into v_job;
  return v_job;
end;
$fn$;

-- force_unlock_workers: release every job and queue held by these pools.
create or replace function {{schema}}.force_unlock_workers(worker_ids text[])
returns void
language sql
as $fn$
  update {{schema}}._private_jobs as j
  set locked_at = null, locked_by = null
  where j.locked_by = any(worker_ids);

  update {{schema}}._private_job_queues as q
  set locked_at = null, locked_by = null
  where q.locked_by = any(worker_ids);
$fn$;
