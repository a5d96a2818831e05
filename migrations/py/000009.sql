-- The worker's fetch, with each job's own timeout: py_fetch_jobs.
--
-- py_get_jobs (000003.sql) and its five-argument twin on the worker's clock
-- (000005.sql), with one column more: the job's timeout from
-- _private_py_job_options (add_job(..., timeout=...)), null for a job added
-- without one. The worker learns it with the job, in the same statement:
-- no round trip more per fetch. The lookup is one probe of the options'
-- primary key per fetched job (a subquery in the RETURNING list: with the
-- function's settings an index scan, whatever the table holds), made only
-- while the table has any row: options are written only when given, and the
-- rows of finished jobs are deleted within minutes, so a queue whose jobs
-- have none pays one look per fetch. Measured (tests/fetch_cost.py
-- --fetch-only, 50 jobs per fetch, about 19 us of server time per job): the
-- look costs 0.18 us per job (0.9%), where a probe per job cost 0.42 us
-- (2.2%); with 100,000 rows of other jobs' options, 0.9 us (4.7%).
--
-- A new name, not a changed py_get_jobs: a function's result type cannot
-- change in place, and a worker of an older version, whose session has
-- prepared "select * from py_get_jobs(...)", would fail every fetch with
-- "cached plan must not change result type" if it were dropped and made
-- again. Those workers keep calling py_get_jobs while newer ones start
-- (a rolling upgrade); it stays, unchanged, until a later migration drops it.
--
-- One function for both clocks: now_at (the worker's time, use_local_time)
-- or, when null, the database's now(), read once into v_now. The body is
-- py_get_jobs' with now() read from v_now and the timeout added, nothing
-- else (tests/test_timeouts.py compares them in the database); see
-- 000003.sql for why it is written this way.
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
begin
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
