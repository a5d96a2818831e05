-- The fetch (py_fetch_jobs, as in py/000015.sql) locks the named queues of the
-- jobs it chose by primary key, and none when no chosen job has a queue. Its
-- join to the chosen jobs was planned as a hash of the whole queues table at
-- every fetch: 1.7 ms of a 5.6 ms fetch with 10,000 named queues (all
-- locked, 2 due jobs each) ahead of the runnable jobs (tests/benchmark.py's
-- gw_scale_queues case).
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
  -- Named queues and tasks left alone: paused, or limited (null: none).
  v_paused_queues text[];
  v_paused_tasks text[];
begin
  -- Pauses and limits: one look at each empty table when nothing is paused
  -- or limited. Paused and limited tasks leave task_ids; paused and limited
  -- queues are not locked below, so none of their jobs is a candidate
  -- (limited ones are py_fetch_limited_jobs'). Expired pauses (resume_at
  -- passed) count for nothing, whether or not the upkeep has deleted them yet.
  if exists (select from {{schema}}._private_py_pauses)
    or exists (select from {{schema}}._private_py_limits)
  then
    select array_agg(p.name) filter (where p.kind = 'queue'),
      array_agg(p.name) filter (where p.kind = 'task')
    into v_paused_queues, v_paused_tasks
    from (
      select p.kind, p.name
      from {{schema}}._private_py_pauses as p
      where p.resume_at is null or p.resume_at > v_now
      union all
      select l.kind, l.name from {{schema}}._private_py_limits as l
    ) as p;
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
    -- By primary key, and only the queues chosen: joined to "chosen" instead,
    -- the planner could hash the whole queues table each fetch, even when no
    -- chosen job has a queue (1.7 ms with 10,000 queues).
    update {{schema}}._private_job_queues as q
    set locked_at = v_now, locked_by = pool_id
    where q.id = any(array(
      select chosen.job_queue_id from chosen where chosen.job_queue_id is not null
    ))
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
