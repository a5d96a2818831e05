-- Limits that one job cannot break (issue 41). Redefines the functions of
-- py/000015.sql:
--
-- * A partition key of any length and content: a value longer than 256
--   bytes (a payload field's, or helpers.limit's partition) is keyed by its
--   first 64 characters and the SHA-256 of the whole, so it always fits the
--   state's primary key (a btree entry holds about 2.7 kB: one longer value
--   failed every fetch of its limit, for ever); a payload PostgreSQL cannot
--   read as text (a \u0000 escape, a lone surrogate) counts under the empty
--   value, as a job without the field does. Shorter values stay as they are.
-- * An operation limit taken again by the job that holds it (a nested
--   block) is granted at once, without a second slot or start.
-- * A limit set or changed while jobs run counts them: py_set_limit puts
--   every job of the task (or queue) locked now, by any pool, Node's
--   included, in the running set of its partition value. It first waits for
--   the fetches in flight (an access exclusive lock on _private_py_limits,
--   which every fetch reads) and holds new ones until it commits, so a fetch
--   never takes jobs of the task without either seeing the limit or being
--   seen by it.

-- The key of a partition value in _private_py_limit_state: the value itself
-- when at most 256 bytes long, else its first 64 characters, '...sha256:'
-- and the SHA-256 of the whole (UTF-8), in hexadecimal. A value holding that
-- marker is hashed too, so no value's key is another's. Stable (convert_to
-- is) and not strict, so that callers inline it: called as a function inside
-- py_limit_partition's exception block, it was set up again at every call
-- (15 us instead of 1).
create or replace function {{schema}}.py_limit_key(value text)
returns text
language sql
stable
parallel safe
as $fn$
  select case
    when octet_length(value) <= 256 and strpos(value, '...sha256:') = 0 then value
    else left(value, 64) || '...sha256:' || encode(sha256(convert_to(value, 'UTF8')), 'hex')
  end
$fn$;

-- The partition key of a job's payload under partition_by = field: the key of
-- payload->>field; '' without the field, or when the payload cannot be read
-- as text (->> fails on a \u0000 escape or a lone surrogate anywhere in it).
create or replace function {{schema}}.py_limit_partition(payload json, field text)
returns text
language plpgsql
stable
parallel safe
as $fn$
begin
  return {{schema}}.py_limit_key(coalesce(payload ->> field, ''));
exception when others then
  return '';
end;
$fn$;

-- Partition keys stored before: longer ones take their new form.
update {{schema}}._private_py_limit_state as st
set partition = {{schema}}.py_limit_key(st.partition)
where st.partition <> {{schema}}.py_limit_key(st.partition);

-- Set (or replace) a limit; returns it. A limit of a task or a queue counts
-- the jobs of its key locked now (see the top); a new partition_by starts
-- its windows afresh (the old rows name another field's values), and so
-- does a new limit. Waits at most 5 seconds for the fetches in flight.
create or replace function {{schema}}.py_set_limit(
  kind text, name text, max_running int default null, max_starts int default null,
  period interval default null, partition_by text default null
)
returns setof {{schema}}._private_py_limits
language plpgsql
volatile
set lock_timeout = '5s'
as $fn$
declare
  v_limit {{schema}}._private_py_limits;
  v_old_by text;
  v_existed boolean;
  v_task_id int;
  v_queue_id int;
begin
  if py_set_limit.kind in ('task', 'queue') then
    begin
      lock table {{schema}}._private_py_limits in access exclusive mode;
    exception when lock_not_available then
      raise exception 'set_limit: the limits were in use for more than 5 seconds '
        '(a transaction left open after reading them?); nothing was changed'
        using errcode = 'lock_not_available';
    end;
  end if;
  select l.partition_by into v_old_by
  from {{schema}}._private_py_limits as l
  where l.kind = py_set_limit.kind and l.name = py_set_limit.name;
  v_existed := found;
  insert into {{schema}}._private_py_limits as l (kind, name, max_running, max_starts, period,
    partition_by)
  values (py_set_limit.kind, py_set_limit.name, py_set_limit.max_running, py_set_limit.max_starts,
    py_set_limit.period, py_set_limit.partition_by)
  on conflict on constraint _private_py_limits_pkey do update
    set max_running = excluded.max_running, max_starts = excluded.max_starts,
      period = excluded.period, partition_by = excluded.partition_by, updated_at = now()
  returning l.* into v_limit;
  if not v_existed or v_old_by is distinct from v_limit.partition_by then
    delete from {{schema}}._private_py_limit_state as s
    where s.kind = v_limit.kind and s.name = v_limit.name;
  end if;
  if v_limit.kind in ('task', 'queue') and v_limit.max_running is not null then
    -- Every job of the key locked now, by its partition value (a scan of the
    -- jobs table: locked jobs have no index).
    if v_limit.kind = 'task' then
      select t.id into v_task_id
      from {{schema}}._private_tasks as t where t.identifier = v_limit.name;
    else
      select q.id into v_queue_id
      from {{schema}}._private_job_queues as q where q.queue_name = v_limit.name;
    end if;
    insert into {{schema}}._private_py_limit_state as st (kind, name, partition, running)
    select v_limit.kind, v_limit.name, x.part, array_agg(x.id order by x.id)
    from (
      select j.id,
        case when v_limit.partition_by is null then ''
          else {{schema}}.py_limit_partition(j.payload, v_limit.partition_by) end as part
      from {{schema}}._private_jobs as j
      where j.locked_at is not null
        and (j.task_id = v_task_id or j.job_queue_id = v_queue_id)
    ) as x
    group by x.part
    on conflict on constraint _private_py_limit_state_pkey do update
    set running = excluded.running;
  elsif v_limit.max_running is null then
    update {{schema}}._private_py_limit_state as st
    set running = '{}'
    where st.kind = v_limit.kind and st.name = v_limit.name and st.running <> '{}';
  end if;
  perform pg_notify({{schema}}.py_channel('control'), 'limits');
  return next v_limit;
end;
$fn$;

-- How much of a limit is in use now: its jobs running (locked), its starts
-- in the current window, its partition values. Volatile, so that a statement
-- that sets a limit and then calls it (WorkerUtils.set_limit's) sees what
-- py_set_limit counted: the statement's own snapshot predates that.
create or replace function {{schema}}.py_limit_use(kind text, name text, period interval)
returns table (running int, recent_starts int, partitions int)
language plpgsql
volatile
as $fn$
begin
  return query
  select
    (select count(*) from {{schema}}._private_py_limit_state as s
      cross join lateral unnest(s.running) as r(id)
      join {{schema}}._private_jobs as j on j.id = r.id and j.locked_at is not null
      where s.kind = py_limit_use.kind and s.name = py_limit_use.name)::int,
    (select count(*) from {{schema}}._private_py_limit_state as s
      cross join lateral unnest(s.starts) as x(at)
      where s.kind = py_limit_use.kind and s.name = py_limit_use.name
        and x.at > clock_timestamp() - py_limit_use.period)::int,
    (select count(*) from {{schema}}._private_py_limit_state as s
      where s.kind = py_limit_use.kind and s.name = py_limit_use.name)::int;
end;
$fn$;

-- The worker's fetch of jobs under limits, as in py/000015.sql, each
-- partition value keyed by py_limit_partition.
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
      v_part := case when v_by[i] is null then ''
        else {{schema}}.py_limit_partition(c.payload, v_by[i]) end;
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

-- An operation limit, taken inside a task, as in py/000015.sql; the partition
-- keyed by py_limit_key. A holder already in the running set (the job's
-- nested block, or a block whose release was lost) is granted at once,
-- without a second slot or start.
create or replace function {{schema}}.py_limit_acquire(name text, partition text, holder bigint)
returns float8
language plpgsql
volatile
as $fn$
declare
  v_limit {{schema}}._private_py_limits;
  v_part text := {{schema}}.py_limit_key(coalesce(py_limit_acquire.partition, ''));
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
    if holder = any(v_running) then
      return null;
    end if;
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

-- The holder's slot of an operation limit is free again (its start counts
-- on); the partition keyed as py_limit_acquire keys it.
create or replace function {{schema}}.py_limit_release(name text, partition text, holder bigint)
returns void
language sql
volatile
as $fn$
  update {{schema}}._private_py_limit_state as st
  set running = array_remove(st.running, holder)
  where st.kind = 'operation' and st.name = py_limit_release.name
    and st.partition = {{schema}}.py_limit_key(coalesce(py_limit_release.partition, ''))
$fn$;
