-- Pauses (Python-only; Node never reads these objects).
--
-- A named queue or a task identifier is paused fleet-wide, in the database:
-- every Python pool's fetch (py_fetch_jobs, redefined below) leaves the
-- paused queues' and tasks' jobs alone, from the first fetch whose snapshot
-- sees the pause; a pool started while it holds does not run them either,
-- and a restart does not undo it. Running jobs finish; add_job still adds.
-- name '*' pauses every named queue (kind 'queue') or every task (kind
-- 'task'). resume_at, when given, ends the pause by itself: the fetch ignores
-- a pause whose resume_at has passed, and the pools' upkeep deletes it.
--
-- hold_queue_lock (named queues only, opt-in) makes Node workers stop on the
-- queue too, through Node's own queue-lock protocol: the queue's row in
-- _private_job_queues is locked by 'py:paused' once no job of it runs (Node's
-- fetch takes only unlocked queues), refreshed by the Python pools' upkeep
-- about every hour. With no Python pool alive for 4 hours, Node's stale-lock
-- sweep unlocks it and Node runs the queue again: the pause fails open.
-- Resuming (or Node's force_unlock_workers('{py:paused}')) unlocks it.
create table {{schema}}._private_py_pauses (
  kind text not null constraint _private_py_pauses_kind_check check (kind in ('queue', 'task')),
  name text not null constraint _private_py_pauses_name_check check (length(name) between 1 and 128),
  paused_at timestamptz not null default now(),
  resume_at timestamptz,
  reason text,
  hold_queue_lock boolean not null default false,
  constraint _private_py_pauses_pkey primary key (kind, name),
  constraint _private_py_pauses_hold_check check (not hold_queue_lock or (kind = 'queue' and name <> '*'))
);

-- The pools are told of pauses and resumes on "<schema>:py:control"
-- (payload 'pauses'): they read the pauses again and give back the jobs of
-- paused queues and tasks they have fetched but not started.

-- The pools' upkeep of pauses (each pool about every minute, and py_pause):
-- deletes the pauses whose resume_at has passed; unlocks the queues held for
-- a pause that is gone; locks, as 'py:paused', the held queues that are
-- unlocked now (a held queue with no row yet gets one: Node's add_job finds
-- it locked); and locks again those held for over an hour, so that no 4-hour
-- stale-lock sweep (Node's or ours) releases them while a Python pool lives.
-- Returns the number of pauses that ended and of queues locked and unlocked;
-- tells the pools when a pause ended.
create or replace function {{schema}}.py_hold_paused_queues(
  out ended int, out locked int, out unlocked int
)
language plpgsql
volatile
as $fn$
begin
  with gone as (
    delete from {{schema}}._private_py_pauses as p
    where p.resume_at <= now()
    returning 1
  )
  select count(*) into ended from gone;

  with freed as (
    update {{schema}}._private_job_queues as q
    set locked_at = null, locked_by = null
    where q.locked_by = 'py:paused'
      and not exists (
        select from {{schema}}._private_py_pauses as p
        where p.kind = 'queue' and p.name = q.queue_name and p.hold_queue_lock
      )
    returning 1
  )
  select count(*) into unlocked from freed;

  insert into {{schema}}._private_job_queues (queue_name, locked_at, locked_by)
  select p.name, now(), 'py:paused'
  from {{schema}}._private_py_pauses as p
  where p.kind = 'queue' and p.hold_queue_lock
  on conflict (queue_name) do nothing;
  get diagnostics locked = row_count;

  with held as (
    update {{schema}}._private_job_queues as q
    set locked_at = now(), locked_by = 'py:paused'
    from {{schema}}._private_py_pauses as p
    where p.kind = 'queue' and p.name = q.queue_name and p.hold_queue_lock
      and (q.locked_at is null or (q.locked_by = 'py:paused' and q.locked_at < now() - interval '1 hour'))
    returning q.locked_by
  )
  select locked + count(*) into locked from held;

  if ended > 0 then
    perform pg_notify({{schema}}.py_channel('control'), 'pauses');
  end if;
end;
$fn$;

-- Pause a queue or task (again: the new until, reason and hold replace the
-- old). Returns the pause.
create or replace function {{schema}}.py_pause(
  kind text, name text, resume_at timestamptz default null, reason text default null,
  hold_queue_lock boolean default false
)
returns setof {{schema}}._private_py_pauses
language plpgsql
volatile
as $fn$
declare
  v_pause {{schema}}._private_py_pauses;
begin
  insert into {{schema}}._private_py_pauses as p (kind, name, resume_at, reason, hold_queue_lock)
  values (py_pause.kind, py_pause.name, py_pause.resume_at, py_pause.reason,
    coalesce(py_pause.hold_queue_lock, false))
  on conflict on constraint _private_py_pauses_pkey do update
    set resume_at = excluded.resume_at, reason = excluded.reason,
      hold_queue_lock = excluded.hold_queue_lock
  returning p.* into v_pause;
  if v_pause.hold_queue_lock then
    perform {{schema}}.py_hold_paused_queues();
  elsif v_pause.kind = 'queue' then
    -- paused again without the hold: the queue goes back to Node
    update {{schema}}._private_job_queues as q
    set locked_at = null, locked_by = null
    where q.queue_name = v_pause.name and q.locked_by = 'py:paused';
  end if;
  perform pg_notify({{schema}}.py_channel('control'), 'pauses');
  return next v_pause;
end;
$fn$;

-- Resume a queue or task; whether it was paused. A held queue is unlocked
-- (only if 'py:paused' holds it).
create or replace function {{schema}}.py_resume(kind text, name text)
returns boolean
language plpgsql
volatile
as $fn$
declare
  v_found boolean;
begin
  delete from {{schema}}._private_py_pauses as p
  where p.kind = py_resume.kind and p.name = py_resume.name;
  v_found := found;
  if py_resume.kind = 'queue' then
    update {{schema}}._private_job_queues as q
    set locked_at = null, locked_by = null
    where q.queue_name = py_resume.name and q.locked_by = 'py:paused';
  end if;
  perform pg_notify({{schema}}.py_channel('control'), 'pauses');
  return v_found;
end;
$fn$;

-- The worker's fetch, as in 000009.sql, leaving paused queues and tasks alone
-- (same arguments and columns: workers running it now honour pauses; workers
-- of versions before pauses call py_get_jobs, which does not).
create or replace function {{schema}}.py_fetch_jobs(
  task_ids int[], forbidden_flags text[], job_limit int, pool_id text,
  now_at timestamptz default null
)
returns table (
  id bigint, job_queue_id int, task_id int, payload json, priority smallint,
  run_at timestamptz, attempts smallint, max_attempts smallint, last_error text,
  created_at timestamptz, updated_at timestamptz, key text, locked_at timestamptz,
  locked_by text, revision int, flags jsonb, is_available boolean, queue_name text,
  timeout interval
)
language plpgsql
volatile
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
set enable_bitmapscan = off
set jit = off
as $fn$
#variable_conflict use_column
declare
  v_now timestamptz := coalesce(now_at, now());
  -- Paused named queues (null: none).
  v_paused_queues text[];
  v_paused_tasks text[];
begin
  -- Pauses: one look at an empty table when nothing is paused. Paused tasks
  -- leave task_ids; paused queues are not locked below, so none of their
  -- jobs is a candidate. Expired pauses (resume_at passed) count for nothing,
  -- whether or not the upkeep has deleted them yet.
  if exists (select from {{schema}}._private_py_pauses) then
    select array_agg(p.name) filter (where p.kind = 'queue'),
      array_agg(p.name) filter (where p.kind = 'task')
    into v_paused_queues, v_paused_tasks
    from {{schema}}._private_py_pauses as p
    where p.resume_at is null or p.resume_at > v_now;
    if v_paused_tasks is not null then
      task_ids := array(
        select t.id
        from {{schema}}._private_tasks as t
        where t.id = any(task_ids)
          and not ('*' = any(v_paused_tasks) or t.identifier = any(v_paused_tasks))
      );
    end if;
  end if;
  return query
  -- Named queues are locked before any of their jobs (as Node's fetch does),
  -- so a job row of a named queue is only ever locked by the fetch holding
  -- its queue. Locking a job first would let a concurrent fetch skip that
  -- locked row, take the queue, and run the next job of the queue before it.
  -- Read only when a candidate job is in a named queue: queue-less workloads
  -- never lock (or scan) the queues table.
  with queues as materialized (
    select q.id
    from {{schema}}._private_job_queues as q
    where q.is_available = true
      and (v_paused_queues is null
        or not ('*' = any(v_paused_queues) or q.queue_name = any(v_paused_queues)))
    for update skip locked
  ),
  candidates as (
    -- Per task, through _private_py_jobs_task_order: due jobs of other tasks,
    -- however many, are never scanned. And per priority: the task's
    -- priorities are found one index descent each (a loose index scan), so
    -- each priority's due jobs are a bounded range and its future jobs,
    -- however many, are never walked either. Each scan locks as it goes and
    -- skips rows another worker is locking right now (not waiting for them),
    -- so it still fills the limit; rows beyond the overall limit are unlocked
    -- when the statement ends.
    select c.id, c.job_queue_id, c.priority, c.run_at
    from unnest(task_ids) as t (id)
    cross join lateral (
      with recursive priorities (priority) as (
        (
          select j.priority
          from {{schema}}._private_jobs as j
          where j.task_id = t.id and j.locked_at is null and j.attempts < j.max_attempts
          order by j.priority
          limit 1
        )
        union all
        select (
          select j.priority
          from {{schema}}._private_jobs as j
          where j.task_id = t.id and j.locked_at is null and j.attempts < j.max_attempts
            and j.priority > p.priority
          order by j.priority
          limit 1
        )
        from priorities as p
        where p.priority is not null
      )
      select p.priority from priorities as p where p.priority is not null
    ) as p
    cross join lateral (
      select j.id, j.job_queue_id, j.priority, j.run_at
      from {{schema}}._private_jobs as j
      where j.task_id = t.id
        and j.priority = p.priority
        and j.locked_at is null and j.attempts < j.max_attempts
        and j.run_at <= v_now
        and (j.job_queue_id is null or j.job_queue_id in (select queues.id from queues))
        and (forbidden_flags is null or j.flags is null or not (j.flags ?| forbidden_flags))
      -- id breaks ties (one add_jobs call gives every job the same run_at), so
      -- a named queue runs its jobs in the order they were added; the index
      -- holds the same order, so nothing is sorted.
      order by j.run_at, j.id
      limit job_limit
      for update of j skip locked
    ) as c
    order by c.priority, c.run_at, c.id
    limit job_limit
  ),
  chosen as (
    -- The first candidate of each named queue is the head of that queue: no
    -- other fetch can lock its rows while this one holds the queue.
    select distinct on (c.job_queue_id, case when c.job_queue_id is null then c.id end)
      c.id, c.job_queue_id
    from candidates as c
    order by c.job_queue_id, case when c.job_queue_id is null then c.id end,
      c.priority, c.run_at, c.id
  ),
  lock_queues as (
    update {{schema}}._private_job_queues as q
    set locked_at = v_now, locked_by = pool_id
    from chosen
    where q.id = chosen.job_queue_id
  )
  -- "= any(array(...))": an index scan on the primary key, never a join that
  -- could hash the whole jobs table.
  update {{schema}}._private_jobs as j
  set attempts = j.attempts + 1, locked_at = v_now, locked_by = pool_id
  where j.id = any(array(select chosen.id from chosen))
  returning j.id, j.job_queue_id, j.task_id, j.payload, j.priority, j.run_at, j.attempts,
    j.max_attempts, j.last_error, j.created_at, j.updated_at, j.key, j.locked_at,
    j.locked_by, j.revision, j.flags, j.is_available,
    case when j.job_queue_id is not null then
      (select q.queue_name from {{schema}}._private_job_queues as q where q.id = j.job_queue_id)
    end,
    -- The job's own timeout, if it has one: a primary-key lookup per job,
    -- made only while any job has options (one look per fetch: an initplan).
    case when (select exists (select from {{schema}}._private_py_job_options)) then
      (select o.timeout from {{schema}}._private_py_job_options as o where o.job_id = j.id)
    end;
end;
$fn$;
