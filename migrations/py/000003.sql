-- The worker's fetch: py_get_jobs and the index it reads.
--
-- _private_py_jobs_task_order: the fetch looks jobs up per task. Without it,
-- a backlog of due jobs of a task this worker does not run (a million jobs
-- for a task only another deployment handles, say) lies ahead of its own
-- jobs in jobs_main_index, and every fetch would walk all of it. Node's
-- statements do not use it; it adds an entry per available job on insert
-- (and when a failed job becomes available again).
-- id is a key column: the fetch orders by (priority, run_at, id), and jobs
-- added in one statement share their run_at.
-- The predicate spells out is_available (a generated column: locked_at is
-- null and attempts < max_attempts) on purpose: py_get_jobs uses the same
-- words, so this is the only partial index the planner can match there;
-- jobs_main_index ("where is_available = true") cannot be picked by mistake.
create index if not exists _private_py_jobs_task_order
  on {{schema}}._private_jobs (task_id, priority, run_at, id)
  include (job_queue_id)
  where locked_at is null and attempts < max_attempts;

-- Lock up to job_limit runnable jobs for the pool pool_id: available, due, of
-- the tasks task_ids, without forbidden flags, and either queue-less or in an
-- available named queue. At most one job per named queue is taken, and its
-- queue is locked in the same statement, so a named queue runs strictly one
-- job at a time across every worker (Python or Node). Rows another worker is
-- locking right now are skipped, not waited for. Returns the locked jobs with
-- their queue names (the worker's statements.get_jobs).
--
-- A function, for its SET clauses: its statement is planned once per session
-- (a generic plan, ~0.3 ms saved on every fetch) and only as index scans in
-- index order. A plan made from statistics is only as good as they are: a
-- table analyzed while nearly empty and then filled with a million rows led
-- ordinary planning to bitmap-scan and sort every job of the task, ~500 ms
-- per fetch until the next ANALYZE. The settings hold only while the function
-- runs, so they also work through a pgBouncer in transaction mode.
create or replace function {{schema}}.py_get_jobs(
  task_ids int[], forbidden_flags text[], job_limit int, pool_id text
)
returns table (
  id bigint, job_queue_id int, task_id int, payload json, priority smallint,
  run_at timestamptz, attempts smallint, max_attempts smallint, last_error text,
  created_at timestamptz, updated_at timestamptz, key text, locked_at timestamptz,
  locked_by text, revision int, flags jsonb, is_available boolean, queue_name text
)
language plpgsql
volatile
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
set enable_bitmapscan = off
set jit = off
as $fn$
#variable_conflict use_column
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
        and j.run_at <= now()
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
    set locked_at = now(), locked_by = pool_id
    from chosen
    where q.id = chosen.job_queue_id
  )
  -- "= any(array(...))": an index scan on the primary key, never a join that
  -- could hash the whole jobs table.
  update {{schema}}._private_jobs as j
  set attempts = j.attempts + 1, locked_at = now(), locked_by = pool_id
  where j.id = any(array(select chosen.id from chosen))
  returning j.id, j.job_queue_id, j.task_id, j.payload, j.priority, j.run_at, j.attempts,
    j.max_attempts, j.last_error, j.created_at, j.updated_at, j.key, j.locked_at,
    j.locked_by, j.revision, j.flags, j.is_available,
    case when j.job_queue_id is not null then
      (select q.queue_name from {{schema}}._private_job_queues as q where q.id = j.job_queue_id)
    end;
end;
$fn$;
