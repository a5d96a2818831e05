-- Concurrency and rate limits across every Python pool (Python-only; Node
-- never reads these objects, and its workers ignore the limits).
--
-- A limit applies to a task identifier (kind 'task') or a named queue (kind
-- 'queue'), optionally per value of a payload field (partition_by: each
-- value, say each account_id, has its own limit; a job without the field
-- counts under the empty value), or to an operation that tasks do in their
-- body (kind 'operation': helpers.limit(name, partition), see
-- py_limit_acquire). It caps
--   max_running: jobs of the key (or partition) locked at once, by any pool;
--   max_starts per period: starts in any window of that length. Every start
--     counts whatever its outcome; a retry or snooze counts again when it
--     starts again.
-- The table is the single source of truth: the utilities, the CLI and the
-- pools' own declarations (@task_options(limit=...)) write it; every change
-- is announced on "<schema>:py:control" (payload 'limits').
create table {{schema}}._private_py_limits (
  kind text not null
    constraint _private_py_limits_kind_check check (kind in ('queue', 'task', 'operation')),
  name text not null
    constraint _private_py_limits_name_check check (length(name) between 1 and 128),
  max_running int constraint _private_py_limits_running_check check (max_running between 1 and 10000),
  max_starts int constraint _private_py_limits_starts_check check (max_starts between 1 and 10000),
  period interval
    constraint _private_py_limits_period_check check (period > interval '0' and period <= interval '1 day'),
  partition_by text
    constraint _private_py_limits_partition_check check (length(partition_by) between 1 and 128),
  updated_at timestamptz not null default now(),
  constraint _private_py_limits_pkey primary key (kind, name),
  constraint _private_py_limits_rate_check check ((max_starts is null) = (period is null)),
  constraint _private_py_limits_some_check check (max_running is not null or max_starts is not null)
);

-- The state of each limit (one row per partition value, '' without
-- partition_by): the ids of the jobs it let start that may still be running
-- (those no longer locked are dropped as it is read), and the times of its
-- latest starts (at most max_starts) with the ids of the jobs started then
-- (started[i] at starts[i]). Written by a fetch holding the limit's row lock,
-- and by py_uncount_starts.
create table {{schema}}._private_py_limit_state (
  kind text not null,
  name text not null,
  partition text not null,
  running bigint[] not null default '{}',
  starts timestamptz[] not null default '{}',
  started bigint[] not null default '{}',
  constraint _private_py_limit_state_pkey primary key (kind, name, partition)
);

-- Set (or replace) a limit; returns it.
create or replace function {{schema}}.py_set_limit(
  kind text, name text, max_running int default null, max_starts int default null,
  period interval default null, partition_by text default null
)
returns setof {{schema}}._private_py_limits
language plpgsql
volatile
as $fn$
declare
  v_limit {{schema}}._private_py_limits;
begin
  insert into {{schema}}._private_py_limits as l (kind, name, max_running, max_starts, period,
    partition_by)
  values (py_set_limit.kind, py_set_limit.name, py_set_limit.max_running, py_set_limit.max_starts,
    py_set_limit.period, py_set_limit.partition_by)
  on conflict on constraint _private_py_limits_pkey do update
    set max_running = excluded.max_running, max_starts = excluded.max_starts,
      period = excluded.period, partition_by = excluded.partition_by, updated_at = now()
  returning l.* into v_limit;
  -- A new partitioning starts counting afresh (the old rows name other values).
  delete from {{schema}}._private_py_limit_state as s
  where s.kind = v_limit.kind and s.name = v_limit.name
    and (v_limit.partition_by is null) <> (s.partition = '');
  perform pg_notify({{schema}}.py_channel('control'), 'limits');
  return next v_limit;
end;
$fn$;

-- Remove a limit; whether there was one.
create or replace function {{schema}}.py_remove_limit(kind text, name text)
returns boolean
language plpgsql
volatile
as $fn$
declare
  v_found boolean;
begin
  delete from {{schema}}._private_py_limits as l
  where l.kind = py_remove_limit.kind and l.name = py_remove_limit.name;
  v_found := found;
  delete from {{schema}}._private_py_limit_state as s
  where s.kind = py_remove_limit.kind and s.name = py_remove_limit.name;
  perform pg_notify({{schema}}.py_channel('control'), 'limits');
  return v_found;
end;
$fn$;

-- The worker's fetch of jobs under limits: like py_fetch_jobs (same
-- arguments and columns), for the jobs of limited tasks and limited queues
-- only (py_fetch_jobs now leaves those alone). The worker asks for at most
-- its free slots, so that what this lets start starts at once.
--
-- Race-free by serialising: the rows of every limit this fetch may use are
-- locked first (FOR UPDATE, in key order), so another limited fetch that
-- could use one of them waits until this one commits; each statement after
-- that sees the jobs every earlier fetch locked. A candidate is taken only if
-- each of its limits (its task's, its queue's; its partition's) has a free
-- slot and a free start, and then it is locked and counted at once. A denied
-- job is left as it was (no attempt spent) and the fetch goes on with the
-- next candidate, so one full key holds up no other. At most 1,000
-- candidates are looked at per fetch.
--
-- Each start is timed with clock_timestamp() as its job is taken (and the
-- job locked at that time). A window is counted 50 ms longer than the
-- period, and the worker starts each job within 25 ms of its count or gives
-- it back uncounted (py_uncount_starts), so that the time between the count
-- and the task's start cannot bring one window of the period more starts
-- than allowed.
create or replace function {{schema}}.py_fetch_limited_jobs(
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
set jit = off
as $fn$
#variable_conflict use_column
declare
  v_now timestamptz := coalesce(now_at, now());
  v_clock timestamptz;
  v_locked_at timestamptz;
  v_margin constant interval := interval '50 milliseconds';
  v_paused_queues text[];
  v_paused_tasks text[];
  v_identifiers text[];
  -- The limits this fetch may use (locked), one array per column.
  v_kinds text[];
  v_names text[];
  v_by text[];
  v_running int[];
  v_starts int[];
  v_periods interval[];
  -- Limits without partitions found full before the scan.
  v_full_tasks text[] := '{}';
  v_full_queues text[] := '{}';
  -- The keys (limit index/partition value) met by this fetch, each with its
  -- limit, partition value, jobs running and starts in the window.
  v_keys text[] := '{}';
  v_key_limit int[] := '{}';
  v_key_part text[] := '{}';
  v_key_running int[] := '{}';
  v_key_starts int[] := '{}';
  -- What this fetch took: (key, job, time) for each of a job's keys.
  v_new_key int[] := '{}';
  v_new_job bigint[] := '{}';
  v_new_at timestamptz[] := '{}';
  v_ids bigint[];
  v_ats timestamptz[];
  v_pos int;
  v_i int;
  v_part text;
  -- The candidate's keys.
  v_mine int[];
  v_key text;
  v_ok boolean;
  v_taken bigint[] := '{}';
  v_task_ids int[];
  v_scan int;
  v_queue_ids int[];
  c record;
  s record;
begin
  if job_limit < 1 then
    return;
  end if;
  v_identifiers := array(
    select t.identifier from {{schema}}._private_tasks as t where t.id = any(task_ids)
  );
  -- Lock the limits this fetch may use, in key order (no deadlock between two
  -- fetches); a fetch that could use one of them waits here for this one.
  select array_agg(l.kind order by l.kind, l.name), array_agg(l.name order by l.kind, l.name),
    array_agg(l.partition_by order by l.kind, l.name),
    array_agg(l.max_running order by l.kind, l.name),
    array_agg(l.max_starts order by l.kind, l.name), array_agg(l.period order by l.kind, l.name)
  into v_kinds, v_names, v_by, v_running, v_starts, v_periods
  from (
    select l.*
    from {{schema}}._private_py_limits as l
    where (l.kind = 'task' and l.name = any(v_identifiers)) or l.kind = 'queue'
    order by l.kind, l.name
    for update
  ) as l;
  if v_kinds is null then
    return;
  end if;
  v_clock := clock_timestamp();
  -- Locked when counted, on the database's clock (also with now_at): the
  -- worker starts the job within 50 ms of it or gives it back uncounted.
  v_locked_at := v_clock;
  select array_agg(p.name) filter (where p.kind = 'queue'),
    array_agg(p.name) filter (where p.kind = 'task')
  into v_paused_queues, v_paused_tasks
  from {{schema}}._private_py_pauses as p
  where p.resume_at is null or p.resume_at > v_now;
  -- Limits without partitions that are full now: their jobs are not looked at.
  for i in 1 .. cardinality(v_kinds) loop
    continue when v_by[i] is not null;
    select st.running, st.starts into s
    from {{schema}}._private_py_limit_state as st
    where st.kind = v_kinds[i] and st.name = v_names[i] and st.partition = '';
    continue when not found;
    if (v_running[i] is not null and (
          select count(*) from {{schema}}._private_jobs as j
          where j.id = any(s.running) and j.locked_at is not null
        ) >= v_running[i])
      or (v_starts[i] is not null and (
          select count(*) from unnest(s.starts) as x(at)
          where x.at > v_clock - v_periods[i] - v_margin
        ) >= v_starts[i])
    then
      if v_kinds[i] = 'task' then
        v_full_tasks := v_full_tasks || v_names[i];
      else
        v_full_queues := v_full_queues || v_names[i];
      end if;
    end if;
  end loop;

  -- The tasks whose own limit is not full, and the named queues under a
  -- limit not full (paused ones left alone).
  v_task_ids := array(
    select t.id
    from {{schema}}._private_tasks as t
    where t.id = any(task_ids)
      and t.identifier = any(array(
        select v_names[i] from generate_subscripts(v_names, 1) as i where v_kinds[i] = 'task'
      ))
      and t.identifier <> all(v_full_tasks)
      and not coalesce('*' = any(v_paused_tasks) or t.identifier = any(v_paused_tasks), false)
  );
  v_queue_ids := array(
    select q.id
    from {{schema}}._private_job_queues as q
    where q.is_available
      and q.queue_name = any(array(
        select v_names[i] from generate_subscripts(v_names, 1) as i where v_kinds[i] = 'queue'
      ))
      and q.queue_name <> all(v_full_queues)
      and not coalesce('*' = any(v_paused_queues) or q.queue_name = any(v_paused_queues), false)
  );
  -- Candidates in (priority, run_at, id) order: the jobs of those tasks, per
  -- task through _private_py_jobs_task_order (no sort of a backlog), and the
  -- jobs of those queues (only when a queue is limited: found through
  -- jobs_main_index). Each scan locks as it goes and skips rows another fetch
  -- is locking. Without partitions, a limit that is not full takes every
  -- candidate until it is (then the loop ends or skips it), so job_limit
  -- candidates are enough; with partitions, up to 1,000 are looked at, so
  -- that full values hold up no other.
  v_scan := case when exists (select from unnest(v_by) as b(field) where b.field is not null)
    then 1000 else job_limit end;
  for c in
    select x.id, x.job_queue_id, x.payload, t.identifier, q.queue_name
    from (
      select j.id, j.job_queue_id, j.task_id, j.payload, j.priority, j.run_at
      from unnest(v_task_ids) as lt(id)
      cross join lateral (
        select j.id, j.job_queue_id, j.task_id, j.payload, j.priority, j.run_at
        from {{schema}}._private_jobs as j
        where j.task_id = lt.id
          and j.locked_at is null and j.attempts < j.max_attempts and j.run_at <= v_now
          and (forbidden_flags is null or j.flags is null or not (j.flags ?| forbidden_flags))
        order by j.priority, j.run_at, j.id
        limit v_scan
        for update of j skip locked
      ) as j
      union all
      select j.id, j.job_queue_id, j.task_id, j.payload, j.priority, j.run_at
      from (
        select j.id, j.job_queue_id, j.task_id, j.payload, j.priority, j.run_at
        from {{schema}}._private_jobs as j
        where cardinality(v_queue_ids) > 0
          and j.is_available = true and j.job_queue_id = any(v_queue_ids)
          and j.task_id = any(task_ids) and j.task_id <> all(v_task_ids)
          and j.run_at <= v_now
          and (forbidden_flags is null or j.flags is null or not (j.flags ?| forbidden_flags))
        order by j.priority, j.run_at, j.id
        limit v_scan
        for update of j skip locked
      ) as j
    ) as x
    join {{schema}}._private_tasks as t on t.id = x.task_id
    left join {{schema}}._private_job_queues as q on q.id = x.job_queue_id
    where (x.job_queue_id is null or q.is_available)
      and (q.queue_name is null or q.queue_name <> all(v_full_queues))
      and not coalesce(
        q.queue_name is not null
          and ('*' = any(v_paused_queues) or q.queue_name = any(v_paused_queues)),
        false
      )
    order by x.priority, x.run_at, x.id
    limit v_scan
  loop
    -- Counted now: the job's start is timed as late as it can be.
    v_clock := clock_timestamp();
    v_locked_at := v_clock;
    -- Check every limit of the candidate first. Each key (limit and
    -- partition value) is read once a fetch: how many of its jobs run and
    -- how many starts its window holds; what this fetch takes is counted in
    -- memory, and written once, after the loop.
    v_ok := true;
    v_mine := '{}';
    for i in 1 .. cardinality(v_kinds) loop
      -- (a job without a queue: queue_name is null, so coalesce)
      continue when not coalesce(
        (v_kinds[i] = 'task' and v_names[i] = c.identifier)
        or (v_kinds[i] = 'queue' and v_names[i] = c.queue_name),
        false
      );
      v_part := case when v_by[i] is null then '' else coalesce(c.payload ->> v_by[i], '') end;
      v_key := i || '/' || v_part;
      v_pos := array_position(v_keys, v_key);
      if v_pos is null then
        select st.running, st.starts into s
        from {{schema}}._private_py_limit_state as st
        where st.kind = v_kinds[i] and st.name = v_names[i] and st.partition = v_part;
        v_keys := v_keys || v_key;
        v_key_limit := v_key_limit || i;
        v_key_part := v_key_part || v_part;
        v_key_running := v_key_running || case when found and v_running[i] is not null then (
            select count(*)::int from {{schema}}._private_jobs as j
            where j.id = any(s.running) and j.locked_at is not null
          ) else 0 end;
        v_key_starts := v_key_starts || case when found and v_starts[i] is not null then (
            select count(*)::int from unnest(s.starts) as x(at)
            where x.at > v_clock - v_periods[i] - v_margin
          ) else 0 end;
        v_pos := cardinality(v_keys);
      end if;
      if (v_running[i] is not null and v_key_running[v_pos] >= v_running[i])
        or (v_starts[i] is not null and v_key_starts[v_pos] >= v_starts[i])
      then
        v_ok := false;
        exit;
      end if;
      v_mine := v_mine || v_pos;
    end loop;
    continue when not v_ok;
    -- Its named queue, if any, must be free: take it.
    if c.job_queue_id is not null then
      update {{schema}}._private_job_queues as q
      set locked_at = v_locked_at, locked_by = pool_id
      where q.id = c.job_queue_id and q.locked_at is null;
      continue when not found;
    end if;
    update {{schema}}._private_jobs as j
    set attempts = j.attempts + 1, locked_at = v_locked_at, locked_by = pool_id
    where j.id = c.id;
    v_taken := v_taken || c.id;
    -- Count it in each of its limits.
    foreach v_pos in array v_mine loop
      v_key_running[v_pos] := v_key_running[v_pos] + 1;
      v_key_starts[v_pos] := v_key_starts[v_pos] + 1;
      v_new_key := v_new_key || v_pos;
      v_new_job := v_new_job || c.id;
      v_new_at := v_new_at || v_clock;
    end loop;
    exit when cardinality(v_taken) >= job_limit;
  end loop;

  -- Write each key's new starts and running jobs once (its starts stay in
  -- the order they were made: the latest max_starts are kept).
  for v_pos in 1 .. coalesce(cardinality(v_keys), 0) loop
    v_ids := array(
      select v_new_job[n] from generate_subscripts(v_new_key, 1) as n
      where v_new_key[n] = v_pos order by n
    );
    continue when cardinality(v_ids) = 0;
    v_ats := array(
      select v_new_at[n] from generate_subscripts(v_new_key, 1) as n
      where v_new_key[n] = v_pos order by n
    );
    v_i := v_key_limit[v_pos];
    insert into {{schema}}._private_py_limit_state as st (
      kind, name, partition, running, starts, started
    )
    values (v_kinds[v_i], v_names[v_i], v_key_part[v_pos],
      case when v_running[v_i] is null then '{}'::bigint[] else v_ids end,
      case when v_starts[v_i] is null then '{}'::timestamptz[]
        else v_ats[greatest(1, cardinality(v_ats) - v_starts[v_i] + 1):] end,
      case when v_starts[v_i] is null then '{}'::bigint[]
        else v_ids[greatest(1, cardinality(v_ids) - v_starts[v_i] + 1):] end)
    on conflict on constraint _private_py_limit_state_pkey do update
    set running = case when v_running[v_i] is null then '{}'::bigint[] else
        array(
          select j.id from {{schema}}._private_jobs as j
          where j.id = any(st.running) and j.locked_at is not null and j.id <> all(v_ids)
        ) || v_ids
      end,
      starts = case when v_starts[v_i] is null then '{}'::timestamptz[] else
        (st.starts || v_ats)[
          greatest(1, cardinality(st.starts) + cardinality(v_ats) - v_starts[v_i] + 1):
        ]
      end,
      started = case when v_starts[v_i] is null then '{}'::bigint[] else
        (st.started || v_ids)[
          greatest(1, cardinality(st.started) + cardinality(v_ids) - v_starts[v_i] + 1):
        ]
      end;
  end loop;

  return query
  select j.id, j.job_queue_id, j.task_id, j.payload, j.priority, j.run_at, j.attempts,
    j.max_attempts, j.last_error, j.created_at, j.updated_at, j.key, j.locked_at,
    j.locked_by, j.revision, j.flags, j.is_available, q.queue_name, o.timeout
  from {{schema}}._private_jobs as j
  left join {{schema}}._private_job_queues as q on q.id = j.job_queue_id
  left join {{schema}}._private_py_job_options as o on o.job_id = j.id
  where j.id = any(v_taken)
  order by j.priority, j.run_at, j.id;
end;
$fn$;

-- Starts that did not happen: jobs a limit let start that the worker gives
-- back instead (it could not start them within 50 ms of their count) are
-- removed from the windows and the running sets, so they take no one's
-- place. The worker then gives the jobs back as at shutdown.
create or replace function {{schema}}.py_uncount_starts(job_ids bigint[])
returns void
language sql
volatile
as $fn$
  update {{schema}}._private_py_limit_state as st
  set running = array(
      select r.id from unnest(st.running) as r(id) where r.id <> all(job_ids)
    ),
    starts = array(
      select x.at from unnest(st.starts, st.started) as x(at, job_id)
      where x.job_id <> all(job_ids)
      order by x.at, x.job_id
    ),
    started = array(
      select x.job_id from unnest(st.starts, st.started) as x(at, job_id)
      where x.job_id <> all(job_ids)
      order by x.at, x.job_id
    )
  where st.started && job_ids or st.running && job_ids
$fn$;

-- When a limited fetch that came back short may find more: the earliest
-- moment one of the rate limits of these tasks (or of any queue) that is
-- full now has room for `wanted` starts (the worker's free slots: one fetch
-- then takes several, instead of one fetch a start); null: none is full by
-- its rate (a freed slot comes with a job's completion instead). A limit
-- counts as full here if it was within the last 100 ms, so that the fetch
-- that found it full moments ago is followed by another (the moment may be
-- past: the worker fetches at once).
create or replace function {{schema}}.py_limits_next_start(task_ids int[], wanted int default 1)
returns timestamptz
language sql
stable
as $fn$
  select min(f.freed_at + l.period + interval '50 milliseconds')
  from {{schema}}._private_py_limits as l
  join {{schema}}._private_py_limit_state as st on st.kind = l.kind and st.name = l.name
  cross join lateral (
    select count(*) as n
    from unnest(st.starts) as y(at)
    where y.at > clock_timestamp() - l.period - interval '150 milliseconds'
  ) as w
  cross join lateral (
    -- The (n - max_starts + wanted)-th oldest of the n starts in the window
    -- (at most the newest): once it leaves, `wanted` may start.
    select r.at as freed_at
    from unnest(st.starts) as r(at)
    where r.at > clock_timestamp() - l.period - interval '150 milliseconds'
    order by r.at
    offset least(w.n, w.n - l.max_starts + greatest(wanted, 1)) - 1
    limit 1
  ) as f
  where l.max_starts is not null and w.n >= l.max_starts
    and (l.kind = 'queue' or l.kind = 'task' and l.name in (
      select t.identifier from {{schema}}._private_tasks as t where t.id = any(task_ids)
    ))
$fn$;

-- The worker's fetch, as in 000014.sql, leaving limited tasks and queues to
-- py_fetch_limited_jobs too (same arguments and columns).
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

-- An operation limit, taken inside a task (helpers.limit(name, partition)):
-- the job holder (running) takes a slot and a start of the operation's limit
-- (kind 'operation'), for that partition value ('' if none). Returns null
-- when taken; else the seconds after which it may be (a full rate: until
-- its oldest start leaves the window; full slots: 1 second), or -1 when no
-- such limit exists. The start is counted now; the slot is the holder's
-- until py_limit_release, or until the holder's job is no longer locked
-- (its worker died). Serialised on the limit's row.
create or replace function {{schema}}.py_limit_acquire(name text, partition text, holder bigint)
returns float8
language plpgsql
volatile
as $fn$
declare
  v_limit {{schema}}._private_py_limits;
  v_part text := coalesce(py_limit_acquire.partition, '');
  v_clock timestamptz;
  v_running bigint[] := '{}';
  v_wait float8;
  v_count int;
  v_first timestamptz;
  s record;
begin
  select l.* into v_limit
  from {{schema}}._private_py_limits as l
  where l.kind = 'operation' and l.name = py_limit_acquire.name
  for update;
  if not found then
    return -1;
  end if;
  v_clock := clock_timestamp();
  select st.running, st.starts, st.started into s
  from {{schema}}._private_py_limit_state as st
  where st.kind = 'operation' and st.name = v_limit.name and st.partition = v_part;
  if found then
    v_running := array(
      select j.id from {{schema}}._private_jobs as j
      where j.id = any(s.running) and j.locked_at is not null
    );
    if v_limit.max_running is not null and cardinality(v_running) >= v_limit.max_running then
      v_wait := 1.0;
    end if;
    if v_limit.max_starts is not null then
      select count(*), min(x.at) into v_count, v_first
      from unnest(s.starts) as x(at)
      where x.at > v_clock - v_limit.period;
      if v_count >= v_limit.max_starts then
        v_wait := greatest(
          coalesce(v_wait, 0), extract(epoch from v_first + v_limit.period - v_clock)
        );
      end if;
    end if;
  end if;
  if v_wait is not null then
    return v_wait;
  end if;
  insert into {{schema}}._private_py_limit_state as st (
    kind, name, partition, running, starts, started
  )
  values ('operation', v_limit.name, v_part,
    case when v_limit.max_running is null then '{}'::bigint[] else array[holder] end,
    case when v_limit.max_starts is null then '{}'::timestamptz[] else array[v_clock] end,
    case when v_limit.max_starts is null then '{}'::bigint[] else array[holder] end)
  on conflict on constraint _private_py_limit_state_pkey do update
  set running = case when v_limit.max_running is null then '{}'::bigint[]
      else v_running || holder end,
    starts = case when v_limit.max_starts is null then '{}'::timestamptz[] else
      st.starts[greatest(1, cardinality(st.starts) - v_limit.max_starts + 2):] || v_clock
    end,
    started = case when v_limit.max_starts is null then '{}'::bigint[] else
      st.started[greatest(1, cardinality(st.started) - v_limit.max_starts + 2):] || holder
    end;
  return null;
end;
$fn$;

-- The holder's slot of an operation limit is free again (its start counts on).
create or replace function {{schema}}.py_limit_release(name text, partition text, holder bigint)
returns void
language sql
volatile
as $fn$
  update {{schema}}._private_py_limit_state as st
  set running = array_remove(st.running, holder)
  where st.kind = 'operation' and st.name = py_limit_release.name
    and st.partition = coalesce(py_limit_release.partition, '')
$fn$;
