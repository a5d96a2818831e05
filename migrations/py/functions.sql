-- Every Python-only function (py_*), one definition each, as the latest
-- Python revision (py/NNNNNN.sql) wants it. The migrator applies this file in
-- the transaction of the last pending Python revision, after it, so the
-- functions and the tables they read are committed together; an install with
-- nothing pending does not read it. A function added or changed here needs a
-- new Python revision (only its number, if nothing else changes): see
-- migrations/README.md. A signature that goes away is dropped by its
-- revision (drop function), not here.

-- ==========================================================================
-- Unique jobs (py/000001.sql; table _private_py_unique_locks): a rule
-- checked, the lock's hash and key, add_job and add_jobs with a rule, and
-- the collection of locks that can no longer block.
-- ==========================================================================

-- py_unique_rule: validate a rule (a JSON object) and return it with every
-- default filled in and every list sorted. Errors use SQLSTATE 22023 and name
-- the field ("unique.period: ..."), with the same wording as the Python API.
create or replace function {{schema}}.py_unique_rule(rule jsonb)
returns jsonb
language plpgsql
immutable
as $fn$
declare
  v_unknown text;
  v_period jsonb;
  v_by jsonb;
  v_keys jsonb;
  v_states jsonb;
  v_until jsonb;
  v_timestamp jsonb;
  v_replace jsonb;
begin
  if rule is null or jsonb_typeof(rule) <> 'object' then
    raise exception 'unique: must be a JSON object' using errcode = '22023';
  end if;

  select string_agg(k, ', ' order by k) into v_unknown
  from jsonb_object_keys(rule) as k
  where k not in ('period', 'by', 'keys', 'states', 'until', 'timestamp', 'replace');
  if v_unknown is not null then
    raise exception 'unique: unknown field(s) %', v_unknown using errcode = '22023';
  end if;

  v_period := coalesce(nullif(rule -> 'period', 'null'), '60');
  if v_period = '"infinity"' then
    v_period := 'null';
  elsif jsonb_typeof(v_period) <> 'number' then
    raise exception 'unique.period: must be a positive number of seconds or "infinity", not %',
      v_period using errcode = '22023';
  elsif v_period::text::numeric <= 0 then
    raise exception 'unique.period: must be a positive number of seconds or "infinity", not %',
      v_period using errcode = '22023';
  elsif v_period::text::numeric > 3155760000 then
    raise exception 'unique.period: % seconds is more than 100 years; use "infinity"',
      v_period using errcode = '22023';
  end if;

  v_by := {{schema}}.py_unique_list(rule, 'by', '["task", "queue", "payload"]',
    array['task', 'queue', 'payload', 'flags']);
  v_states := {{schema}}.py_unique_list(rule, 'states',
    '["pending", "running", "retrying", "succeeded"]',
    array['pending', 'running', 'retrying', 'failed', 'succeeded']);
  v_replace := {{schema}}.py_unique_list(rule, 'replace', '[]',
    array['run_at', 'priority', 'max_attempts', 'payload', 'queue'], true);

  v_keys := nullif(rule -> 'keys', 'null');
  if v_keys is not null then
    if jsonb_typeof(v_keys) <> 'array' or jsonb_array_length(v_keys) = 0 or exists (
      select 1 from jsonb_array_elements(v_keys) as e
      where jsonb_typeof(e) <> 'string' or e = '""'
    ) then
      raise exception 'unique.keys: must be a non-empty list of payload keys (strings)'
        using errcode = '22023';
    end if;
    if not v_by ? 'payload' then
      raise exception 'unique.keys: compares payload keys, so "by" must include "payload"'
        using errcode = '22023';
    end if;
    select jsonb_agg(distinct e order by e) into v_keys
    from jsonb_array_elements_text(v_keys) as e;
  end if;

  v_until := coalesce(nullif(rule -> 'until', 'null'), '"success"');
  if v_until not in ('"success"', '"start"') then
    raise exception 'unique.until: must be "success" or "start", not %', v_until
      using errcode = '22023';
  end if;
  if v_until = '"start"' and not v_states ? 'pending' then
    raise exception 'unique.until: "start" releases the lock when the job starts, so only a pending job blocks; "states" must include "pending"'
      using errcode = '22023';
  end if;

  v_timestamp := coalesce(nullif(rule -> 'timestamp', 'null'), '"run_at"');
  if v_timestamp not in ('"run_at"', '"added"') then
    raise exception 'unique.timestamp: must be "run_at" or "added", not %', v_timestamp
      using errcode = '22023';
  end if;

  return jsonb_build_object(
    'period', v_period,
    'by', v_by,
    'keys', v_keys,
    'states', v_states,
    'until', v_until,
    'timestamp', v_timestamp,
    'replace', v_replace
  );
end;
$fn$;

-- py_unique_list: one list field of a rule: its default when absent, else
-- its distinct values, sorted, all of them in "allowed".
create or replace function {{schema}}.py_unique_list(
  rule jsonb,
  field text,
  default_value jsonb,
  allowed text[],
  may_be_empty boolean default false
) returns jsonb
language plpgsql
immutable
as $fn$
declare
  v_value jsonb := nullif(rule -> field, 'null');
  v_bad text;
begin
  if v_value is null then
    return default_value;
  end if;
  if jsonb_typeof(v_value) <> 'array'
     or exists (select 1 from jsonb_array_elements(v_value) as e where jsonb_typeof(e) <> 'string')
  then
    raise exception 'unique.%: must be a list of strings from %', field, array_to_string(allowed, ', ')
      using errcode = '22023';
  end if;
  select string_agg(e, ', ' order by e) into v_bad
  from jsonb_array_elements_text(v_value) as e
  where e <> all(allowed);
  if v_bad is not null then
    raise exception 'unique.%: unknown value(s) %; expected some of %',
      field, v_bad, array_to_string(allowed, ', ')
      using errcode = '22023';
  end if;
  if jsonb_array_length(v_value) = 0 then
    if may_be_empty then
      return '[]';
    end if;
    raise exception 'unique.%: must not be empty', field using errcode = '22023';
  end if;
  return (select jsonb_agg(distinct e order by e) from jsonb_array_elements_text(v_value) as e);
end;
$fn$;

-- py_unique_hash: what makes two jobs "the same" under a normalised rule.
-- The compared fields become one jsonb document (key order and whitespace of
-- the payload do not matter; flags are a sorted set) and are hashed.
create or replace function {{schema}}.py_unique_hash(
  rule jsonb,
  identifier text,
  payload json,
  queue_name text,
  flags text[]
) returns bytea
language plpgsql
immutable
as $fn$
declare
  v_by jsonb := rule -> 'by';
  v_payload jsonb := coalesce(payload::jsonb, '{}');
  v_identity jsonb := '{}';
begin
  if v_by ? 'task' then
    v_identity := v_identity || jsonb_build_object('task', identifier);
  end if;
  if v_by ? 'queue' then
    v_identity := v_identity || jsonb_build_object('queue', queue_name);
  end if;
  if v_by ? 'payload' then
    if jsonb_typeof(rule -> 'keys') = 'array' then
      if jsonb_typeof(v_payload) <> 'object' then
        raise exception 'unique.keys: compares keys of the payload, which must be a JSON object, not %',
          jsonb_typeof(v_payload) using errcode = '22023';
      end if;
      -- A missing key and a key whose value is null are different.
      v_identity := v_identity || jsonb_build_object('keys', (
        select coalesce(jsonb_object_agg(k, v_payload -> k), '{}')
        from jsonb_array_elements_text(rule -> 'keys') as k
        where v_payload ? k
      ));
    else
      v_identity := v_identity || jsonb_build_object('payload', v_payload);
    end if;
  end if;
  if v_by ? 'flags' then
    v_identity := v_identity || jsonb_build_object('flags', (
      select coalesce(jsonb_agg(distinct f order by f), '[]') from unnest(flags) as f
    ));
  end if;
  return sha256(convert_to(v_identity::text, 'UTF8'));
end;
$fn$;

-- py_unique_state: the state of a job for uniqueness, from its live row; a
-- row that is gone (all fields null) has succeeded.
create or replace function {{schema}}.py_unique_state(job {{schema}}._private_jobs)
returns text
language sql
immutable
as $fn$
  select case
    when job.id is null then 'succeeded'
    when job.locked_at is not null then 'running'
    when job.attempts >= job.max_attempts then 'failed'
    when job.attempts > 0 then 'retrying'
    else 'pending'
  end;
$fn$;

-- py_unique_lock_key: the advisory lock taken for a hash (its first 64 bits).
create or replace function {{schema}}.py_unique_lock_key(hash bytea)
returns bigint
language sql
immutable
as $fn$
  select ('x' || encode(substring(hash from 1 for 8), 'hex'))::bit(64)::bigint;
$fn$;

-- py_add_job: add_job with a uniqueness rule (see the README, "Unique jobs").
-- Concurrent callers of the same hash are serialised by a transaction-level
-- advisory lock, and the lock table's primary key holds one job per hash, so
-- exactly one of them adds the job. A null rule adds the job as add_job does.
-- On a conflict nothing is added: the existing job is returned (null when it
-- has already succeeded and its row is gone) with conflict = true, the state
-- that blocked, and whether the fields named in "replace" were updated
-- (only a pending job is updated).
create or replace function {{schema}}.py_add_job(
  identifier text,
  payload json default null::json,
  queue_name text default null::text,
  run_at timestamptz default null::timestamptz,
  max_attempts integer default null::integer,
  job_key text default null::text,
  priority integer default null::integer,
  flags text[] default null::text[],
  job_key_mode text default 'replace'::text,
  unique_rule jsonb default '{}'::jsonb
) returns table (
  job_id bigint,
  conflict boolean,
  conflict_state text,
  replaced boolean,
  job {{schema}}._private_jobs
)
language plpgsql
as $fn$
#variable_conflict use_column
declare
  v_rule jsonb;
  v_hash bytea;
  v_lock {{schema}}._private_py_unique_locks;
  v_existing {{schema}}._private_jobs;
  v_job {{schema}}._private_jobs;
  v_state text;
  v_replace jsonb;
  v_period interval;
  v_run_at timestamptz := coalesce(py_add_job.run_at, now());
  v_replaced boolean := false;
begin
  if py_add_job.unique_rule is null or py_add_job.unique_rule = 'null'::jsonb then
    v_job := {{schema}}.add_job(
      py_add_job.identifier, py_add_job.payload, py_add_job.queue_name, py_add_job.run_at,
      py_add_job.max_attempts, py_add_job.job_key, py_add_job.priority, py_add_job.flags,
      py_add_job.job_key_mode
    );
    return query select v_job.id, false, null::text, false, v_job;
    return;
  end if;

  v_rule := {{schema}}.py_unique_rule(py_add_job.unique_rule);
  v_hash := {{schema}}.py_unique_hash(
    v_rule, py_add_job.identifier, py_add_job.payload, py_add_job.queue_name, py_add_job.flags
  );
  v_period := make_interval(secs => (v_rule ->> 'period')::double precision);

  -- Wait for any other transaction adding the same hash to commit; the
  -- statements below then see what it did.
  perform pg_advisory_xact_lock({{schema}}.py_unique_lock_key(v_hash));

  select * into v_lock
  from {{schema}}._private_py_unique_locks as l
  where l.hash = v_hash
  for update;

  if found and (v_lock.expires_at is null or v_lock.expires_at > now()) then
    select * into v_existing from {{schema}}._private_jobs as j where j.id = v_lock.job_id;
    v_state := {{schema}}.py_unique_state(v_existing);
    -- With no time limit a succeeded job (no row left) does not block.
    if v_state = any(v_lock.states)
       and not (v_state = 'succeeded' and v_lock.expires_at is null) then
      v_replace := v_rule -> 'replace';
      if v_state = 'pending' and jsonb_array_length(v_replace) > 0 then
        if v_replace ? 'queue' and py_add_job.queue_name is not null then
          insert into {{schema}}._private_job_queues (queue_name)
          select py_add_job.queue_name
          where not exists (
            select 1 from {{schema}}._private_job_queues as q
            where q.queue_name = py_add_job.queue_name
          )
          on conflict do nothing;
        end if;
        update {{schema}}._private_jobs as j
        set run_at = case when v_replace ? 'run_at' then v_run_at else j.run_at end,
            priority = case when v_replace ? 'priority'
              then coalesce(py_add_job.priority::smallint, 0::smallint) else j.priority end,
            max_attempts = case when v_replace ? 'max_attempts'
              then coalesce(py_add_job.max_attempts::smallint, 25::smallint) else j.max_attempts end,
            payload = case when v_replace ? 'payload'
              then coalesce(py_add_job.payload, '{}'::json) else j.payload end,
            job_queue_id = case when v_replace ? 'queue'
              then (select q.id from {{schema}}._private_job_queues as q
                    where q.queue_name = py_add_job.queue_name)
              else j.job_queue_id end,
            revision = j.revision + 1,
            updated_at = now()
        where j.id = v_lock.job_id and j.locked_at is null and j.attempts = 0
        returning * into v_existing;
        v_replaced := found;
        if v_replaced then
          if v_replace ? 'run_at' and v_rule ->> 'timestamp' = 'run_at' then
            update {{schema}}._private_py_unique_locks as l
            set expires_at = greatest(now(), v_existing.run_at) + v_period
            where l.hash = v_hash;
          end if;
          perform pg_notify('jobs:insert', '{"r":' || random()::text || ',"count":1}');
        end if;
      end if;
      return query select
        v_lock.job_id,
        true,
        v_state,
        v_replaced,
        v_existing;
      return;
    end if;
  end if;

  v_job := {{schema}}.add_job(
    py_add_job.identifier, py_add_job.payload, py_add_job.queue_name, py_add_job.run_at,
    py_add_job.max_attempts, py_add_job.job_key, py_add_job.priority, py_add_job.flags,
    py_add_job.job_key_mode
  );

  insert into {{schema}}._private_py_unique_locks as l (hash, job_id, states, expires_at)
  values (
    v_hash,
    v_job.id,
    case when v_rule ->> 'until' = 'start'
      then array['pending']
      else array(select jsonb_array_elements_text(v_rule -> 'states'))
    end,
    case when v_rule ->> 'timestamp' = 'run_at'
      then greatest(now(), v_job.run_at) + v_period
      else now() + v_period
    end
  )
  on conflict (hash) do update set
    job_id = excluded.job_id,
    states = excluded.states,
    expires_at = excluded.expires_at,
    created_at = now();

  return query select v_job.id, false, null::text, false, v_job;
end;
$fn$;

-- py_add_jobs: add_jobs with uniqueness. unique_rules is one rule object for
-- every spec, or an array with one rule (or null) per spec. Specs are added
-- one by one, in order, so a spec is also compared with the earlier specs of
-- the same call; each result carries the position of its spec (from 1).
create or replace function {{schema}}.py_add_jobs(
  specs {{schema}}.job_spec[],
  unique_rules jsonb default '{}'::jsonb,
  job_key_preserve_run_at boolean default false
) returns table (
  spec_index integer,
  job_id bigint,
  conflict boolean,
  conflict_state text,
  replaced boolean,
  job {{schema}}._private_jobs
)
language plpgsql
as $fn$
#variable_conflict use_column
declare
  v_spec {{schema}}.job_spec;
  v_index integer := 0;
  v_rule jsonb;
  v_key bigint;
begin
  if jsonb_typeof(py_add_jobs.unique_rules) = 'array'
     and jsonb_array_length(py_add_jobs.unique_rules) <> coalesce(cardinality(py_add_jobs.specs), 0)
  then
    raise exception 'unique: % rules for % specs; give one rule per spec, or one rule for all',
      jsonb_array_length(py_add_jobs.unique_rules), coalesce(cardinality(py_add_jobs.specs), 0)
      using errcode = '22023';
  end if;
  -- Take the advisory locks of every hash first, in one global order, so two
  -- batches holding the same jobs in different orders cannot deadlock.
  for v_key in
    select distinct {{schema}}.py_unique_lock_key({{schema}}.py_unique_hash(
      {{schema}}.py_unique_rule(s.rule), s.identifier, s.payload, s.queue_name, s.flags
    ))
    from (
      select
        spec.identifier,
        spec.payload,
        spec.queue_name,
        spec.flags,
        case jsonb_typeof(py_add_jobs.unique_rules)
          when 'array' then py_add_jobs.unique_rules -> (spec.ordinality::integer - 1)
          else py_add_jobs.unique_rules
        end as rule
      from unnest(py_add_jobs.specs) with ordinality as spec
    ) as s
    where s.rule is not null and s.rule <> 'null'::jsonb
    order by 1
  loop
    perform pg_advisory_xact_lock(v_key);
  end loop;

  foreach v_spec in array coalesce(py_add_jobs.specs, '{}') loop
    v_index := v_index + 1;
    v_rule := case jsonb_typeof(py_add_jobs.unique_rules)
      when 'array' then py_add_jobs.unique_rules -> (v_index - 1)
      else py_add_jobs.unique_rules
    end;
    return query
    select v_index, r.job_id, r.conflict, r.conflict_state, r.replaced, r.job
    from {{schema}}.py_add_job(
      v_spec.identifier, v_spec.payload, v_spec.queue_name, v_spec.run_at,
      v_spec.max_attempts, v_spec.job_key, v_spec.priority, v_spec.flags,
      case when py_add_jobs.job_key_preserve_run_at then 'preserve_run_at' else 'replace' end,
      v_rule
    ) as r;
  end loop;
end;
$fn$;

-- py_gc_unique_locks: delete up to max_rows locks that can never block
-- again: their time is up, or their job is gone and they either had no time
-- limit or did not block succeeded jobs. Returns how many were deleted. Each
-- lock is re-checked under its advisory lock, in a statement of its own, so a
-- concurrent py_add_job that has just taken the hash over is never undone.
create or replace function {{schema}}.py_gc_unique_locks(max_rows integer default 500)
returns integer
language plpgsql
as $fn$
declare
  v_hash bytea;
  v_deleted integer := 0;
begin
  for v_hash in
    select l.hash
    from {{schema}}._private_py_unique_locks as l
    where l.expires_at <= now()
       or ((l.expires_at is null or not 'succeeded' = any(l.states))
           and not exists (select 1 from {{schema}}._private_jobs as j where j.id = l.job_id))
    limit max_rows
  loop
    if pg_try_advisory_xact_lock({{schema}}.py_unique_lock_key(v_hash)) then
      delete from {{schema}}._private_py_unique_locks as l
      where l.hash = v_hash
        and (l.expires_at <= now()
             or ((l.expires_at is null or not 'succeeded' = any(l.states))
                 and not exists (
                   select 1 from {{schema}}._private_jobs as j where j.id = l.job_id
                 )));
      if found then
        v_deleted := v_deleted + 1;
      end if;
    end if;
  end loop;
  return v_deleted;
end;
$fn$;

-- ==========================================================================
-- The job lifecycle (py/000007.sql, 000008.sql, 000011.sql): one state for
-- any job id, the names of the notification channels, cancelling.
-- ==========================================================================

-- py_paused_by: the pause in force (py/000014.sql) that holds the jobs of
-- this task and named queue (ids of _private_tasks and _private_job_queues;
-- a null queue: no named queue), as it is shown: 'queue mail', 'task
-- send_email', 'every queue' or 'every task' (a pause of '*', which holds
-- every named queue or every task); null when none holds them. The fetch
-- (py_fetch_jobs) leaves exactly these jobs alone. A queue's pause before a
-- task's, a name before '*'.
create or replace function {{schema}}.py_paused_by(task_id integer, job_queue_id integer)
returns text
language sql
stable
as $fn$
  select case when p.name = '*' then 'every ' || p.kind else p.kind || ' ' || p.name end
  from {{schema}}._private_py_pauses as p
  where (p.resume_at is null or p.resume_at > now())
    and (
      (p.kind = 'task' and (p.name = '*' or p.name = (
        select t.identifier from {{schema}}._private_tasks as t
        where t.id = py_paused_by.task_id)))
      or (p.kind = 'queue' and py_paused_by.job_queue_id is not null and (p.name = '*'
        or p.name = (
          select q.queue_name from {{schema}}._private_job_queues as q
          where q.id = py_paused_by.job_queue_id)))
    )
  order by p.kind, p.name = '*', p.name
  limit 1;
$fn$;

-- py_job_state: the state of a job still in the jobs table, in the one
-- vocabulary every command prints (checked in this order):
--   running    locked by a worker
--   failed     no attempts left (attempts >= max_attempts)
--   paused     would run (now or at its run_at), but a pause holds it
--              (paused_by: py_paused_by's text, null when none does)
--   retrying   failed at least once, will run again (due now or later)
--   scheduled  never attempted, run_at in the future
--   waiting    never attempted, due now
create or replace function {{schema}}.py_job_state(
  locked_at timestamptz, attempts integer, max_attempts integer, run_at timestamptz,
  paused_by text
) returns text
language sql
stable
as $fn$
  select case
    when py_job_state.locked_at is not null then 'running'
    when py_job_state.attempts >= py_job_state.max_attempts then 'failed'
    when py_job_state.paused_by is not null then 'paused'
    when py_job_state.attempts > 0 then 'retrying'
    when py_job_state.run_at > now() then 'scheduled'
    else 'waiting'
  end;
$fn$;

-- The state of a job, from any process (py_job_status(42) in psql; the
-- utilities' get_job_status and get_job_result): one row, always. A job in
-- the jobs table has py_job_state's state (running, failed, paused, retrying,
-- scheduled, waiting; paused_by says which pause holds a paused one); a
-- finished one its history's (succeeded, failed, cancelled, or removed: by an
-- operator, py/000023.sql); and
--   unknown    no row anywhere: finished by a Node worker, removed by Node's
--              functions, pruned, or never existed
-- A running job asked to cancel shows the attempt it is at (its cancel
-- request's), not the max_attempts py_cancel_jobs set on its row.
create or replace function {{schema}}.py_job_status(job_id bigint)
returns table (
  state text, id bigint, task_identifier text, queue_name text, key text,
  attempts smallint, max_attempts smallint, last_error text, result json,
  result_error text, created_at timestamptz, run_at timestamptz, started_at timestamptz,
  finished_at timestamptz, locked_by text, cancel_requested_at timestamptz,
  cancel_reason text, timed_out boolean, paused_by text
)
language plpgsql
stable
as $fn$
#variable_conflict use_column
begin
  return query
  select
    {{schema}}.py_job_state(j.locked_at, j.attempts, j.max_attempts, j.run_at, p.paused_by),
    j.id, t.identifier, q.queue_name, j.key, coalesce(c.attempts, j.attempts), j.max_attempts,
    j.last_error, null::json, null::text, j.created_at, j.run_at, j.locked_at, null::timestamptz,
    j.locked_by, c.requested_at, c.reason, false,
    case when j.locked_at is null and j.attempts < j.max_attempts then p.paused_by end
  from {{schema}}._private_jobs as j
  cross join lateral (
    select {{schema}}.py_paused_by(j.task_id, j.job_queue_id) as paused_by
  ) as p
  join {{schema}}._private_tasks as t on t.id = j.task_id
  left join {{schema}}._private_job_queues as q on q.id = j.job_queue_id
  left join {{schema}}._private_py_cancellations as c on c.job_id = j.id
  where j.id = py_job_status.job_id;
  if found then
    return;
  end if;
  return query
  select
    h.state, h.job_id, h.task_identifier, h.queue_name, h.key, h.attempts, h.max_attempts,
    h.last_error, h.result, h.result_error, h.created_at, h.run_at, h.started_at,
    h.finished_at, null::text, h.cancel_requested_at, h.cancel_reason, h.timed_out,
    null::text
  from {{schema}}._private_py_job_history as h
  where h.job_id = py_job_status.job_id;
  if found then
    return;
  end if;
  return query
  select
    'unknown'::text, py_job_status.job_id, null::text, null::text, null::text,
    null::smallint, null::smallint, null::text, null::json, null::text,
    null::timestamptz, null::timestamptz, null::timestamptz, null::timestamptz,
    null::text, null::timestamptz, null::text, false, null::text;
end;
$fn$;

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
--   running (locked): a cancel request (_private_py_cancellations, with the
--     attempt it is at: its history and attempt error keep that number) and,
--     on Node's row, attempts = max_attempts and key = null, exactly what
--     Node's remove_job does to a locked job: it is never retried. A Python pool
--     running it is told at once (NOTIFY "<schema>:py:cancel", ids); its
--     outcome is recorded as cancelled unless the task returns normally
--     (then it succeeded: the work happened). A Node worker cannot be told:
--     it finishes the job, and a failure is recorded as cancelled by the
--     Python pools' upkeep;
--   gone: nothing changes.
-- Returns each id with its state after the call ('cancelled', 'running' for
-- a request, or the state py_job_status gives a job that is gone).
-- The cancelled jobs are listed in the history's expiry ledger
-- (_private_py_job_history_expiry, py/000011.sql) with their history rows.
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
  -- The workflows of steps among them first (workflow rows before job rows:
  -- see py_workflow_lock).
  perform {{schema}}.py_workflow_lock(py_cancel_jobs.job_ids);
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

  -- Cancelled steps: their workflows advance in this transaction.
  perform {{schema}}.py_workflow_settle(v_cancelled);

  return query select r.job_id, 'cancelled'::text from unnest(v_cancelled) as r(job_id);

  -- The running ones: a request, and Node's remove_job treatment.
  with requested as (
    insert into {{schema}}._private_py_cancellations as c (job_id, reason, pool_id, attempts)
    select j.id, py_cancel_jobs.reason, j.locked_by, j.attempts
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

-- ==========================================================================
-- Pauses (py/000014.sql; table _private_py_pauses): the pools' upkeep, pause
-- and resume. The pools are told of pauses and resumes on
-- "<schema>:py:control" (payload 'pauses'): they read the pauses again and
-- give back the jobs of paused queues and tasks they have fetched but not
-- started.
-- ==========================================================================

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

-- ==========================================================================
-- Limits (py/000015.sql, 000020.sql; tables _private_py_limits and
-- _private_py_limit_state): partition keys, setting, removing and reading a
-- limit, the fetch of limited jobs, starts given back, operation limits.
-- A limit of a task or a queue set while jobs run counts them: py_set_limit
-- first waits for the fetches in flight (an access exclusive lock on
-- _private_py_limits, which every fetch reads) and holds new ones until it
-- commits, so a fetch never takes jobs of the task without either seeing the
-- limit or being seen by it.
-- ==========================================================================

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

-- Set (or replace) a limit; returns it. A limit of a task or a queue counts
-- the jobs of its key locked now (see "Limits" above); a new partition_by starts
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
  v_lease_task text;
  v_lease_by text;
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
  -- Its leases end: the jobs their pools hold locked are counted below.
  delete from {{schema}}._private_py_limit_leases as le
  where le.kind = v_limit.kind and le.name = v_limit.name;
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
  -- No lease while a queue has a limit (py_fetch_leased_jobs): a queue's
  -- limit ends every task's leases, and the jobs their pools hold locked are
  -- counted instead, by partition value.
  if v_limit.kind = 'queue' then
    for v_task_id, v_lease_task, v_lease_by in
      select t.id, l.name, l.partition_by
      from {{schema}}._private_py_limits as l
      join {{schema}}._private_tasks as t on t.identifier = l.name
      where l.kind = 'task'
        and exists (
          select from {{schema}}._private_py_limit_leases as le
          where le.kind = 'task' and le.name = l.name
        )
    loop
      delete from {{schema}}._private_py_limit_leases as le
      where le.kind = 'task' and le.name = v_lease_task;
      insert into {{schema}}._private_py_limit_state as st (kind, name, partition, running)
      select 'task', v_lease_task, x.part, array_agg(x.id order by x.id)
      from (
        select j.id,
          case when v_lease_by is null then ''
            else {{schema}}.py_limit_partition(j.payload, v_lease_by) end as part
        from {{schema}}._private_jobs as j
        where j.locked_at is not null and j.task_id = v_task_id
      ) as x
      group by x.part
      on conflict on constraint _private_py_limit_state_pkey do update
      set running = excluded.running;
    end loop;
  end if;
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
      where s.kind = py_limit_use.kind and s.name = py_limit_use.name)::int
      + (select coalesce(sum(le.slots), 0) from {{schema}}._private_py_limit_leases as le
      where le.kind = py_limit_use.kind and le.name = py_limit_use.name)::int,
    (select count(*) from {{schema}}._private_py_limit_state as s
      cross join lateral unnest(s.starts) as x(at)
      where s.kind = py_limit_use.kind and s.name = py_limit_use.name
        and x.at > clock_timestamp() - py_limit_use.period)::int,
    (select count(*) from {{schema}}._private_py_limit_state as s
      where s.kind = py_limit_use.kind and s.name = py_limit_use.name)::int;
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
--
-- Each partition value is keyed by py_limit_partition.
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
  v_state_running bigint[];
  v_state_starts timestamptz[];
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
    -- (no state row yet: nulls, counted as none; its leases still count)
    select st.running, st.starts into v_state_running, v_state_starts
    from {{schema}}._private_py_limit_state as st
    where st.kind = v_kinds[i] and st.name = v_names[i] and st.partition = '';
    if (v_running[i] is not null and (
          select count(*) from {{schema}}._private_jobs as j
          where j.id = any(v_state_running) and j.locked_at is not null
        ) + (
          select coalesce(sum(le.slots), 0) from {{schema}}._private_py_limit_leases as le
          where le.kind = v_kinds[i] and le.name = v_names[i] and le.partition = ''
        ) >= v_running[i])
      or (v_starts[i] is not null and (
          select count(*) from unnest(v_state_starts) as x(at)
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
          -- (a job of a named queue that cannot be taken now takes no place)
          and (j.job_queue_id is null or exists (
            select from {{schema}}._private_job_queues as q
            where q.id = j.job_queue_id and q.is_available and q.locked_at is null
              and q.queue_name <> all(v_full_queues)
              and not coalesce(
                '*' = any(v_paused_queues) or q.queue_name = any(v_paused_queues), false)
          ))
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
          ) else 0 end + case when v_running[i] is not null then (
            select coalesce(sum(le.slots), 0)::int from {{schema}}._private_py_limit_leases as le
            where le.kind = v_kinds[i] and le.name = v_names[i] and le.partition = v_part
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

-- The worker's fetch of jobs under leased limits (py/000028.sql): the jobs of
-- limited tasks whose limit is max_running only (no max_starts; with or
-- without partition_by), fetched ahead like any job (up to job_limit of
-- each task: locked, their attempt counted, not counted as running), with
-- the pool's lease of each key's slots (a limit, or one partition value of
-- it) set in the same transaction. The pool starts them locally while it
-- runs fewer than its lease's target: a start costs no round trip. The keys
-- the pool leases or holds jobs of are given (key_tasks, key_parts) with,
-- for each, what it may run now (holding), runs (running) and has queued
-- (queued); the leases are read back from _private_py_limit_leases. Returns
-- nothing for a pool without a heartbeat row (its leases could outlive
-- it), and nothing while a queue has a limit (the worker then fetches them
-- all through py_fetch_limited_jobs; py_set_limit ended the leases).
--
-- Serialised with py_fetch_limited_jobs on the limits' rows (FOR UPDATE, in
-- the same key order). For each key: its slots in use are the jobs counted
-- in _private_py_limit_state plus every pool's lease; the pool may have
-- what the others leave (at most concurrency, and what its jobs need:
-- running + queued + found now); when another pool wanted more than it got
-- in the last 2 seconds, at most its share (max_running over the pools
-- holding or wanting slots). Its slots are at least `holding` (what it may
-- be running by the time this commits: a lease shrinks at the next fetch),
-- and its jobs are fetched ahead only while its target is above 0. The
-- pool's lease of a key it neither gives nor meets a job of ends. A lease
-- that gave up slots another pool wants announces jobs (as add_job does), so
-- that pool fetches.
create or replace function {{schema}}.py_fetch_leased_jobs(
  task_ids int[], forbidden_flags text[], job_limit int, pool_id text,
  key_tasks text[], key_parts text[], holding int[], running int[], queued int[],
  concurrency int, now_at timestamptz default null
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
  v_clock timestamptz := clock_timestamp();
  v_pool text := py_fetch_leased_jobs.pool_id;
  v_paused_queues text[];
  v_paused_tasks text[];
  v_cand_ids bigint[];
  v_cand_parts text[];
  v_cand_queues int[];
  v_ids bigint[];
  v_id_queues int[];
  v_n int;
  -- Per key (partition value) of the limit at hand: what was decided.
  v_kparts text[];
  v_ktargets int[];
  v_kslots int[];
  v_kwants int[];
  v_kqueued int[];
  v_shrunk boolean;
  v_announce boolean := false;
  l record;
  c record;
begin
  if job_limit < 1 or not exists (
    select from {{schema}}._private_py_heartbeats as h where h.pool_id = v_pool
  ) then
    return;
  end if;
  -- Nothing is leased while a queue has a limit, though the pool asking has
  -- not yet heard of it: the limits locked first (py_set_limit holds them
  -- while it ends the leases), then read in a statement of its own, which
  -- sees a limit set meanwhile.
  lock table {{schema}}._private_py_limits in row share mode;
  if exists (select from {{schema}}._private_py_limits as l where l.kind = 'queue') then
    return;
  end if;
  select array_agg(p.name) filter (where p.kind = 'queue'),
    array_agg(p.name) filter (where p.kind = 'task')
  into v_paused_queues, v_paused_tasks
  from {{schema}}._private_py_pauses as p
  where p.resume_at is null or p.resume_at > v_now;
  for l in
    select l.kind, l.name, l.max_running, l.partition_by, x.id as task_id
    from unnest(task_ids) as x(id)
    join {{schema}}._private_tasks as t on t.id = x.id
    join {{schema}}._private_py_limits as l on l.kind = 'task' and l.name = t.identifier
    where l.max_running is not null and l.max_starts is null
    order by l.kind, l.name
    for update of l
  loop
    -- Candidates, locked as rows (not yet as jobs) and skipped when another
    -- fetch holds them (through _private_py_jobs_task_order, as
    -- py_fetch_limited_jobs' own), each with its partition value: with
    -- partitions, at least 1,000 are looked at (as py_fetch_limited_jobs
    -- does), so that a backlog of a full value holds up no other.
    v_cand_ids := '{}';
    v_cand_parts := '{}';
    v_cand_queues := '{}';
    if not coalesce('*' = any(v_paused_tasks) or l.name = any(v_paused_tasks), false) then
      select coalesce(array_agg(x.id order by x.n), '{}'),
        coalesce(array_agg(x.part order by x.n), '{}'),
        coalesce(array_agg(x.job_queue_id order by x.n), '{}')
      into v_cand_ids, v_cand_parts, v_cand_queues
      from (
        select j.id, j.job_queue_id, row_number() over (order by j.priority, j.run_at, j.id) as n,
          case when l.partition_by is null then ''
            else {{schema}}.py_limit_partition(j.payload, l.partition_by) end as part
        from (
          select j.id, j.job_queue_id, j.payload, j.priority, j.run_at
          from {{schema}}._private_jobs as j
          where j.task_id = l.task_id
            and j.locked_at is null and j.attempts < j.max_attempts and j.run_at <= v_now
            and (forbidden_flags is null or j.flags is null or not (j.flags ?| forbidden_flags))
          order by j.priority, j.run_at, j.id
          limit case when l.partition_by is null then job_limit else greatest(job_limit, 1000) end
          for update of j skip locked
        ) as j
      ) as x;
    end if;
    -- Past job_limit of them, the jobs of values full for this pool (their
    -- running jobs and the other pools' slots fill the limit) are left out,
    -- and the first job_limit of the rest kept.
    if cardinality(v_cand_ids) > job_limit then
      select coalesce(array_agg(c.id order by c.n), '{}'),
        coalesce(array_agg(c.part order by c.n), '{}'),
        coalesce(array_agg(c.q order by c.n), '{}')
      into v_cand_ids, v_cand_parts, v_cand_queues
      from (
        select c.id, c.part, c.q, c.n
        from unnest(v_cand_ids, v_cand_parts, v_cand_queues) with ordinality as c(id, part, q, n)
        where c.part not in (
          select p.part
          from (select distinct c.part from unnest(v_cand_parts) as c(part)) as p
          where l.max_running <= (
              select count(*)
              from {{schema}}._private_py_limit_state as st
              cross join lateral unnest(st.running) as rn(id)
              join {{schema}}._private_jobs as j on j.id = rn.id and j.locked_at is not null
              where st.kind = l.kind and st.name = l.name and st.partition = p.part
            ) + (
              select coalesce(sum(le.slots), 0)
              from {{schema}}._private_py_limit_leases as le
              where le.kind = l.kind and le.name = l.name and le.partition = p.part
                and le.pool_id <> v_pool
            )
        )
        order by c.n
        limit job_limit
      ) as c;
    end if;
    -- Each partition value met (one, '', without partition_by), and each
    -- this pool leases or holds jobs of: its lease set again, all at once.
    with mine as (
      select p.part, sum(p.met)::int as met, coalesce(max(p.h), 0)::int as h,
        coalesce(max(p.r), 0)::int as r, coalesce(max(p.q), 0)::int as q
      from (
        select c.part, count(*) as met, null::int as h, null::int as r, null::int as q
        from unnest(v_cand_parts) as c(part)
        group by c.part
        union all
        select key_parts[i], 0, holding[i], running[i], queued[i]
        from generate_subscripts(key_tasks, 1) as i
        where key_tasks[i] = l.name
      ) as p
      group by p.part
    ),
    counted as (
      select st.partition as part, count(*)::int as n
      from {{schema}}._private_py_limit_state as st
      cross join lateral unnest(st.running) as rn(id)
      join {{schema}}._private_jobs as j on j.id = rn.id and j.locked_at is not null
      where st.kind = l.kind and st.name = l.name and st.partition in (select m.part from mine as m)
      group by st.partition
    ),
    leased as (
      select le.partition as part,
        coalesce(sum(le.slots) filter (where le.pool_id <> v_pool), 0)::int as others,
        count(*) filter (
          where le.pool_id <> v_pool
            and (le.slots > 0 or le.wanted_at > v_clock - interval '2 seconds')
        )::int as active,
        coalesce(bool_or(
          le.pool_id <> v_pool and le.wanted_at > v_clock - interval '2 seconds'
        ), false) as waiter,
        coalesce(max(le.slots) filter (where le.pool_id = v_pool), 0)::int as was
      from {{schema}}._private_py_limit_leases as le
      where le.kind = l.kind and le.name = l.name and le.partition in (select m.part from mine as m)
      group by le.partition
    ),
    wanted as (
      select m.part, m.h, m.q, least(concurrency, l.max_running, m.r + m.q + m.met) as want,
        l.max_running - coalesce(c.n, 0) - coalesce(x.others, 0) as free,
        case when coalesce(x.waiter, false)
          then ceil(l.max_running::numeric / (coalesce(x.active, 0) + 1))::int
          else l.max_running end as cap,
        coalesce(x.waiter, false) as waiter, coalesce(x.was, 0) as was
      from mine as m
      left join counted as c on c.part = m.part
      left join leased as x on x.part = m.part
    ),
    decided as (
      select w.*, greatest(0, least(w.want, w.free, w.cap)) as target
      from wanted as w
    )
    select array_agg(d.part order by d.part), array_agg(d.target order by d.part),
      array_agg(greatest(d.h, d.target) order by d.part), array_agg(d.want order by d.part),
      array_agg(d.q order by d.part),
      coalesce(bool_or(d.waiter and greatest(d.h, d.target) < d.was), false)
    into v_kparts, v_ktargets, v_kslots, v_kwants, v_kqueued, v_shrunk
    from decided as d;
    v_announce := v_announce or v_shrunk;
    delete from {{schema}}._private_py_limit_leases as le
    using unnest(v_kparts, v_kslots, v_ktargets, v_kwants) as k(part, slots, target, want)
    where le.kind = l.kind and le.name = l.name and le.pool_id = v_pool
      and le.partition = k.part and k.slots = 0 and k.target >= k.want;
    -- A key the pool neither asked about nor met is one it may run nothing
    -- of (its target read back as 0, nothing running or waiting): its
    -- lease ends, or its slots would stay held from every other pool.
    delete from {{schema}}._private_py_limit_leases as le
    where le.kind = l.kind and le.name = l.name and le.pool_id = v_pool
      and le.partition <> all(coalesce(v_kparts, '{}'));
    insert into {{schema}}._private_py_limit_leases as le (
      kind, name, partition, pool_id, slots, target, wanted_at, updated_at
    )
    select l.kind, l.name, k.part, v_pool, k.slots, k.target,
      case when k.target < k.want then v_clock end, v_clock
    from unnest(v_kparts, v_kslots, v_ktargets, v_kwants) as k(part, slots, target, want)
    where not (k.slots = 0 and k.target >= k.want)
    on conflict (kind, name, partition, pool_id) do update
    set slots = excluded.slots, target = excluded.target,
      wanted_at = coalesce(excluded.wanted_at, le.wanted_at), updated_at = v_clock;
    -- Ahead, each value's share of the fetch (its target of the pool's
    -- slots), less what the pool holds of it already: a lease that binds
    -- does not fill the pool's local queue with jobs it cannot start.
    if l.partition_by is null then
      -- (One value: the first of the candidates.)
      v_n := coalesce((
          select ceil(job_limit::numeric * k.target / greatest(concurrency, 1))::int - k.queued
          from unnest(v_kparts, v_ktargets, v_kqueued) as k(part, target, queued)
          where k.part = '' and k.target > 0
        ), 0);
      v_ids := v_cand_ids[1:v_n];
      v_id_queues := v_cand_queues[1:v_n];
    else
      select coalesce(array_agg(c.id order by c.n), '{}'),
        coalesce(array_agg(c.q order by c.n), '{}')
      into v_ids, v_id_queues
      from (
        select c.id, c.part, c.q, c.n, row_number() over (partition by c.part order by c.n) as rn
        from unnest(v_cand_ids, v_cand_parts, v_cand_queues) with ordinality as c(id, part, q, n)
      ) as c
      join unnest(v_kparts, v_ktargets, v_kqueued) as k(part, target, queued)
        on k.part = c.part
      where k.target > 0
        and c.rn <= ceil(job_limit::numeric * k.target / greatest(concurrency, 1)) - k.queued;
    end if;
    continue when cardinality(v_ids) = 0;
    -- A job of a named queue is taken with its queue (free, available, not
    -- paused), in the jobs' order, as by the usual fetch; the others at once.
    for c in
      select x.id, x.q as job_queue_id
      from unnest(v_ids, v_id_queues) with ordinality as x(id, q, n)
      where x.q is not null
      order by x.n
    loop
      update {{schema}}._private_job_queues as q
      set locked_at = v_clock, locked_by = v_pool
      where q.id = c.job_queue_id and q.locked_at is null and q.is_available
        and not coalesce('*' = any(v_paused_queues) or q.queue_name = any(v_paused_queues),
          false);
      if not found then
        v_ids := array_remove(v_ids, c.id);
      end if;
    end loop;
    -- Taken: locked, their attempt counted, and returned as they are now,
    -- in order (the local queue's heap takes them in order at least cost).
    return query
    with taken as (
      update {{schema}}._private_jobs as j
      set attempts = j.attempts + 1, locked_at = v_clock, locked_by = v_pool
      where j.id = any(v_ids)
      returning j.*
    )
    select j.id, j.job_queue_id, j.task_id, j.payload, j.priority, j.run_at, j.attempts,
      j.max_attempts, j.last_error, j.created_at, j.updated_at, j.key, j.locked_at,
      j.locked_by, j.revision, j.flags, j.is_available, q.queue_name, o.timeout
    from taken as j
    left join {{schema}}._private_job_queues as q on q.id = j.job_queue_id
    left join {{schema}}._private_py_job_options as o on o.job_id = j.id
    order by j.priority, j.run_at, j.id;
    -- Taken under the lease, they count there: an id left in the running
    -- sets by an earlier count (py_set_limit, a limited fetch of a pool
    -- without heartbeats; its job since given back or failed) would count
    -- them twice, and could hold every slot for good.
    update {{schema}}._private_py_limit_state as st
    set running = array(select r.id from unnest(st.running) as r(id) where r.id <> all(v_ids))
    where st.kind = l.kind and st.name = l.name and st.partition = any(v_kparts)
      and st.running && v_ids;
  end loop;
  if v_announce then
    perform pg_notify('jobs:insert', '{"r":' || random()::text || ',"count":1}');
  end if;
end;
$fn$;

-- Starts that did not happen: jobs a limit let start that the worker gives
-- back instead (it could not start them within 50 ms of their count) are
-- removed from the windows and the running sets of task and queue limits,
-- so they take no one's place. Only the jobs pool_id still holds, and only
-- the start counted with their lock (at their locked_at): a pool declared
-- dead meanwhile, whose job another pool took and counted, leaves that
-- count alone, and an earlier attempt's real start stays in its window
-- (null pool_id: any holder, as workers before revision 29 call it). The
-- worker then gives the jobs back as at shutdown.
create or replace function {{schema}}.py_uncount_starts(job_ids bigint[], pool_id text default null)
returns void
language sql
volatile
as $fn$
  with mine as materialized (
    select j.id, j.locked_at
    from {{schema}}._private_jobs as j
    where j.id = any(job_ids) and j.locked_at is not null
      and (py_uncount_starts.pool_id is null or j.locked_by = py_uncount_starts.pool_id)
  ),
  ids as (
    select coalesce(array_agg(m.id), '{}') as ids from mine as m
  )
  update {{schema}}._private_py_limit_state as st
  set running = array(
      select r.id from unnest(st.running) as r(id), ids where r.id <> all(ids.ids)
    ),
    starts = array(
      select x.at from unnest(st.starts, st.started) as x(at, job_id)
      where not exists (select from mine as m where m.id = x.job_id and m.locked_at = x.at)
      order by x.at, x.job_id
    ),
    started = array(
      select x.job_id from unnest(st.starts, st.started) as x(at, job_id)
      where not exists (select from mine as m where m.id = x.job_id and m.locked_at = x.at)
      order by x.at, x.job_id
    )
  from ids
  where st.kind in ('task', 'queue') and (st.started && ids.ids or st.running && ids.ids)
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

-- An operation limit, taken inside a task (helpers.limit(name, partition)):
-- the job holder (running) takes a slot and a start of the operation's limit
-- (kind 'operation'), for that partition value ('' if none). Returns null
-- when taken; else the seconds after which it may be (a full rate: until
-- its oldest start leaves the window; full slots: 1 second), or -1 when no
-- such limit exists. The start is counted now; the slot is the holder's
-- until py_limit_release, or until the holder's job is no longer locked
-- (its worker died). Serialised on the limit's row.
--
-- The partition is keyed by py_limit_key. A holder already in the running set (the job's
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
  -- Its row locked as read: a release committing meanwhile is read (not
  -- written over with the holder it removed).
  select st.running, st.starts, st.started into s
  from {{schema}}._private_py_limit_state as st
  where st.kind = 'operation' and st.name = v_limit.name and st.partition = v_part
  for update;
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

-- ==========================================================================
-- The worker's fetch (py/000003.sql, 000005.sql, 000009.sql, 000014.sql,
-- 000015.sql, 000017.sql): py_get_jobs for workers of earlier versions,
-- py_fetch_jobs for this one.
--
-- Order: a language sql function is checked when it is created, so one it
-- calls comes first (py_limit_key before py_limit_release, say); the tables
-- all exist by the time this file runs.
-- ==========================================================================

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

-- The worker's fetch on the application's clock (use_local_time, graphile-worker's
-- useNodeTime): py_get_jobs with a fifth argument, now_at, the worker's own
-- time, used where the four-argument py_get_jobs (above)
-- uses the database's now(): which jobs are due (run_at <= now_at) and the
-- locked_at of the jobs and named queues it locks, as graphile-worker's fetch
-- does with useNodeTime.
--
-- A separate overload rather than a changed py_get_jobs: a worker without the
-- option sends exactly the statement it sent before, and workers of an older
-- version keep calling the four-argument function while newer ones start.
-- The body is the four-argument one with now() replaced by now_at and nothing
-- else (tests/test_local_time.py compares the two in the database); see
-- the four-argument one for why it is written this way.
create or replace function {{schema}}.py_get_jobs(
  task_ids int[], forbidden_flags text[], job_limit int, pool_id text, now_at timestamptz
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
        and j.run_at <= now_at
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
    set locked_at = now_at, locked_by = pool_id
    from chosen
    where q.id = chosen.job_queue_id
  )
  -- "= any(array(...))": an index scan on the primary key, never a join that
  -- could hash the whole jobs table.
  update {{schema}}._private_jobs as j
  set attempts = j.attempts + 1, locked_at = now_at, locked_by = pool_id
  where j.id = any(array(select chosen.id from chosen))
  returning j.id, j.job_queue_id, j.task_id, j.payload, j.priority, j.run_at, j.attempts,
    j.max_attempts, j.last_error, j.created_at, j.updated_at, j.key, j.locked_at,
    j.locked_by, j.revision, j.flags, j.is_available,
    case when j.job_queue_id is not null then
      (select q.queue_name from {{schema}}._private_job_queues as q where q.id = j.job_queue_id)
    end;
end;
$fn$;

-- The worker's fetch, with each job's own timeout: py_fetch_jobs.
--
-- py_get_jobs and its five-argument twin on the worker's clock (above), with one column more: the job's timeout from
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
-- py_get_jobs for why it is written this way.
--
-- Paused queues and tasks are left alone (py/000014.sql: workers running it
-- honour pauses; workers of versions before pauses call py_get_jobs, which
-- does not); limited tasks and queues are left to py_fetch_limited_jobs
-- (py/000015.sql).
--
-- It locks the named queues of the jobs it chose by primary key, and none
-- when no chosen job has a queue (py/000017.sql). Its join to the chosen jobs
-- was planned as a hash of the whole queues table at every fetch: 1.7 ms of
-- a 5.6 ms fetch with 10,000 named queues (all locked, 2 due jobs each) ahead
-- of the runnable jobs (tests/benchmark.py's gw_scale_queues case).
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

-- ==========================================================================
-- Workflows (py/000026.sql): steps that become jobs when they may run.
--
-- A step's job is added by py_workflow_start (through add_jobs, with the flag
-- "py:workflow"); when it ends, py_workflow_settle records its outcome on the
-- step, in the transaction that ends the job, and py_workflow_advance tells
-- its children: each child whose parents are now all final and whose run_if
-- holds becomes a job, each one whose run_if can no longer hold ends
-- (cancelled or skipped, naming the parent), and so on down, in rounds (one
-- statement per round for the whole workflow, never one per step).
--
-- The statements on the way of a job's end each read one table, through a
-- unique index ("= any(array)" of ids), and look up what they need of other
-- rows in a jsonb map by id, never through a join; and every function runs
-- with enable_seqscan off (as py_fetch_jobs). A workflow's steps are added
-- faster than statistics follow them: plans made while the table was small
-- joined the steps to a set of them once per step (13 s to record 2,000
-- steps, 19 s for 5,000), or, cached, scanned the whole table for each step
-- once it had grown (a chain of 1,000 steps at 39 a second, not 150).
--
-- Locks: every function here locks a workflow's row (py_workflow_lock)
-- before it reads or changes its steps, and before any job row of them: the
-- completer, py_cancel_jobs and py_cancel_workflow all lock the workflow
-- first. Two transactions ending two parents of one child take turns, and
-- the second sees the first's counts: each child is started (or ended) once.
-- ==========================================================================

-- Lock the workflows of the steps whose jobs are job_ids, in id order.
create or replace function {{schema}}.py_workflow_lock(job_ids bigint[])
returns void
language plpgsql
volatile
set enable_seqscan = off
as $fn$
begin
  perform 1
  from {{schema}}._private_py_workflows as w
  where w.id = any(array(
    select s.workflow_id from {{schema}}._private_py_workflow_steps as s
    where s.job_id = any(py_workflow_lock.job_ids)
  ))
  order by w.id
  for update of w;
end;
$fn$;

-- Insert a workflow's steps (a JSON array of {"ref", "spec", "run_if",
-- "after"}; positions from first_position), and their links: "after" names
-- steps of the array, or (known) steps already in the workflow by ref.
-- extra_parent: a step every new step without a parent in the array waits
-- for (py_workflow_extend's running step). Returns the new steps' ids, in
-- the order of the array.
create or replace function {{schema}}.py_workflow_insert(
  workflow_id bigint, steps jsonb, first_position integer, extra_parent bigint default null
)
returns bigint[]
language plpgsql
volatile
set enable_seqscan = off
as $fn$
declare
  v_map jsonb;
  v_ids bigint[];
begin
  with inserted as (
    insert into {{schema}}._private_py_workflow_steps (
      workflow_id, ref, position, task_identifier, spec, run_if, parents, parents_left
    )
    select py_workflow_insert.workflow_id, n.value ->> 'ref', first_position + n.position,
      n.value -> 'spec' ->> 'identifier', n.value -> 'spec',
      coalesce(n.value ->> 'run_if', 'succeeded'),
      jsonb_array_length(coalesce(n.value -> 'after', '[]'))
        + case when extra_parent is not null
            and jsonb_array_length(coalesce(n.value -> 'after', '[]')) = 0 then 1 else 0 end,
      jsonb_array_length(coalesce(n.value -> 'after', '[]'))
        + case when extra_parent is not null
            and jsonb_array_length(coalesce(n.value -> 'after', '[]')) = 0 then 1 else 0 end
    from jsonb_array_elements(py_workflow_insert.steps) with ordinality as n (value, position)
    order by n.position
    returning id, ref, position
  )
  select jsonb_object_agg(inserted.ref, inserted.id), array_agg(inserted.id order by inserted.position)
  into v_map, v_ids
  from inserted;
  insert into {{schema}}._private_py_workflow_edges (parent_id, child_id)
  select (v_map ->> p.ref)::bigint, (v_map ->> (n.value ->> 'ref'))::bigint
  from jsonb_array_elements(py_workflow_insert.steps) as n
  cross join jsonb_array_elements_text(coalesce(n.value -> 'after', '[]')) as p (ref)
  union all
  select extra_parent, (v_map ->> (n.value ->> 'ref'))::bigint
  from jsonb_array_elements(py_workflow_insert.steps) as n
  where extra_parent is not null and jsonb_array_length(coalesce(n.value -> 'after', '[]')) = 0;
  return v_ids;
end;
$fn$;

-- Add a workflow (the utilities' add_workflow, which has checked the graph:
-- refs unique, parents earlier steps, no cycle). steps: a JSON array of
-- {"ref", "spec" (a job_spec record, and "timeout" in seconds), "run_if",
-- "after" (parent refs)}. Its root steps become jobs at once; a root whose job
-- add_jobs refuses refuses the whole workflow. Returns its id.
create or replace function {{schema}}.py_add_workflow(name text, steps jsonb)
returns bigint
language plpgsql
volatile
set enable_seqscan = off
as $fn$
declare
  v_id bigint;
  v_ids bigint[];
begin
  insert into {{schema}}._private_py_workflows (name, steps, steps_left)
  values (py_add_workflow.name, jsonb_array_length(py_add_workflow.steps),
    jsonb_array_length(py_add_workflow.steps))
  returning id into v_id;
  v_ids := {{schema}}.py_workflow_insert(v_id, py_add_workflow.steps, 0);
  perform {{schema}}.py_workflow_start(
    v_id,
    array(
      select v_ids[n.position]
      from jsonb_array_elements(py_add_workflow.steps) with ordinality as n (value, position)
      where jsonb_array_length(coalesce(n.value -> 'after', '[]')) = 0
    ),
    strict => true
  );
  return v_id;
end;
$fn$;

-- Make the jobs of these blocked steps (ids) of a locked workflow: one
-- add_jobs call (its ids follow the order of its specs, which maps each job
-- to its step), with their timeouts beside them. strict: an error is raised;
-- otherwise the steps are tried one by one and a step whose job cannot be
-- added fails alone ("its job could not be added: ..."). Returns the ids of
-- the steps that failed so.
create or replace function {{schema}}.py_workflow_start(
  workflow_id bigint, step_ids bigint[], strict boolean default false
)
returns bigint[]
language plpgsql
volatile
set enable_seqscan = off
as $fn$
declare
  v_steps bigint[];
  v_specs {{schema}}.job_spec[];
  v_jobs bigint[];
  v_failed bigint[] := '{}';
  v_job bigint;
  -- Each started step's job, by step id.
  v_at jsonb;
begin
  select array_agg(s.id order by s.position),
    array_agg(json_populate_record(
      null::{{schema}}.job_spec,
      jsonb_set(
        s.spec, '{flags}',
        case when jsonb_typeof(s.spec -> 'flags') = 'array' then s.spec -> 'flags'
          else '[]'::jsonb end || '["py:workflow"]'::jsonb
      )::json
    ) order by s.position)
  into v_steps, v_specs
  from {{schema}}._private_py_workflow_steps as s
  where s.id = any(py_workflow_start.step_ids) and s.state = 'blocked';
  if v_steps is null then
    return v_failed;
  end if;
  if strict then
    v_jobs := array(select j.id from {{schema}}.add_jobs(v_specs) as j order by j.id);
  else
    begin
      v_jobs := array(select j.id from {{schema}}.add_jobs(v_specs) as j order by j.id);
    exception when others then
      -- One by one: a step whose job is refused fails alone.
      v_jobs := '{}';
      for i in 1 .. cardinality(v_steps) loop
        begin
          select j.id into v_job from {{schema}}.add_jobs(array[v_specs[i]]) as j;
          v_jobs := v_jobs || v_job;
        exception when others then
          v_jobs := v_jobs || null::bigint;
          v_failed := v_failed || v_steps[i];
          update {{schema}}._private_py_workflow_steps as s
          set state = 'failed', finished_at = now(),
            error = 'its job could not be added: ' || sqlerrm
          where s.id = v_steps[i];
        end;
      end loop;
    end;
  end if;
  v_at := (
    select jsonb_object_agg(m.step_id::text, m.job_id)
    from unnest(v_steps, v_jobs) as m (step_id, job_id)
    where m.job_id is not null
  );
  update {{schema}}._private_py_workflow_steps as s
  set state = 'queued', job_id = (v_at ->> s.id::text)::bigint, queued_at = now()
  where s.id = any(array(select k::bigint from jsonb_object_keys(v_at) as k));
  insert into {{schema}}._private_py_job_options (job_id, timeout)
  select s.job_id, make_interval(secs => (s.spec ->> 'timeout')::float8)
  from {{schema}}._private_py_workflow_steps as s
  where s.id = any(v_steps) and s.job_id is not null
    and jsonb_typeof(s.spec -> 'timeout') = 'number';
  return v_failed;
end;
$fn$;

-- Advance a locked workflow: ended are steps (ids) that have just become
-- final (their state written, not counted yet), checked blocked steps to
-- decide (retry_workflow's). Rounds until nothing changes: the children of
-- the steps that ended are told (their counts), every told or checked step
-- is decided:
--   cancelled  the workflow is being cancelled, or run_if 'succeeded' and a
--              parent failed or was cancelled
--   skipped    run_if 'succeeded' and a parent was skipped; run_if 'failed'
--              and every parent is final, none failed or was cancelled
--   started    every parent final and run_if holds ('finished': whatever
--              they ended as)
-- and those that ended are the next round's. Then the workflow's counts, and
-- its state once no step is left.
create or replace function {{schema}}.py_workflow_advance(
  workflow_id bigint, ended bigint[], checked bigint[] default null
)
returns void
language plpgsql
volatile
set enable_seqscan = off
as $fn$
declare
  v_wf constant bigint := py_workflow_advance.workflow_id;
  v_ended bigint[] := coalesce(ended, '{}');
  v_check bigint[] := coalesce(checked, '{}');
  v_all bigint[] := coalesce(ended, '{}');
  v_start bigint[];
  v_cancel bigint[];
  v_skip bigint[];
  -- The ended steps' [state, ref], and each told child's counts, by id.
  v_parents jsonb;
  v_told jsonb;
  v_bad text;
  v_cancelling boolean;
begin
  select w.cancel_requested_at is not null into v_cancelling
  from {{schema}}._private_py_workflows as w where w.id = v_wf;
  loop
    v_told := null;
    if cardinality(v_ended) > 0 then
      -- The ended steps' states and refs, by id; then what each of their
      -- children is told ([parents ended, of them failed or cancelled,
      -- skipped, the first bad parent's ref]), by id: every statement reads
      -- one table through a unique index, whatever the plan.
      select jsonb_object_agg(p.id::text, jsonb_build_array(p.state, p.ref))
      into v_parents
      from {{schema}}._private_py_workflow_steps as p
      where p.id = any(v_ended);
      select jsonb_object_agg(t.child_id::text, jsonb_build_array(t.n, t.failed, t.skipped, t.bad))
      into v_told
      from (
        select e.child_id, count(*) as n,
          count(*) filter (where v_parents -> e.parent_id::text ->> 0 in ('failed', 'cancelled'))
            as failed,
          count(*) filter (where v_parents -> e.parent_id::text ->> 0 = 'skipped') as skipped,
          min(
            (case v_parents -> e.parent_id::text ->> 0
              when 'failed' then '0' when 'cancelled' then '1' when 'skipped' then '2' end)
            || (v_parents -> e.parent_id::text ->> 1)
          ) as bad
        from {{schema}}._private_py_workflow_edges as e
        where e.parent_id = any(v_ended)
        group by e.child_id
      ) as t;
      if v_told is not null then
        with counted as (
          update {{schema}}._private_py_workflow_steps as c
          set parents_left = c.parents_left - (v_told -> c.id::text ->> 0)::int,
            parents_failed = c.parents_failed + (v_told -> c.id::text ->> 1)::int,
            parents_skipped = c.parents_skipped + (v_told -> c.id::text ->> 2)::int
          where c.id = any(array(select k::bigint from jsonb_object_keys(v_told) as k))
            and c.state = 'blocked'
          returning c.id
        )
        select v_check || coalesce(array_agg(counted.id), '{}') into v_check from counted;
      end if;
    end if;
    exit when cardinality(v_check) = 0;

    select coalesce(array_agg(d.id) filter (where d.verdict = 'cancelled'), '{}'),
      coalesce(array_agg(d.id) filter (where d.verdict = 'skipped'), '{}'),
      coalesce(array_agg(d.id) filter (where d.verdict = 'start'), '{}')
    into v_cancel, v_skip, v_start
    from (
      select s.id,
        case
          when v_cancelling then 'cancelled'
          when s.run_if = 'succeeded' and s.parents_failed > 0 then 'cancelled'
          when s.run_if = 'succeeded' and s.parents_skipped > 0 then 'skipped'
          when s.parents_left > 0 then null
          when s.run_if = 'failed' and s.parents_failed = 0 then 'skipped'
          else 'start'
        end as verdict
      from {{schema}}._private_py_workflow_steps as s
      where s.id = any(v_check) and s.state = 'blocked'
    ) as d;

    v_ended := '{}';
    if cardinality(v_cancel) + cardinality(v_skip) > 0 then
      with ended as (
        update {{schema}}._private_py_workflow_steps as s
        set state = case when s.id = any(v_cancel) then 'cancelled' else 'skipped' end,
          finished_at = now(),
          error = case
            when v_cancelling then (
              select 'its workflow was cancelled' || coalesce(': ' || w.cancel_reason, '')
              from {{schema}}._private_py_workflows as w where w.id = v_wf)
            when s.run_if = 'failed' and s.id = any(v_skip) then 'no parent failed'
            when v_told ? s.id::text and v_told -> s.id::text ->> 3 is not null then
              'parent ' || quote_literal(substr(v_told -> s.id::text ->> 3, 2))
              || case left(v_told -> s.id::text ->> 3, 1)
                  when '0' then ' failed' when '1' then ' was cancelled' else ' was skipped' end
            else (
              select 'parent ' || quote_literal(p.ref) || case p.state
                  when 'failed' then ' failed'
                  when 'cancelled' then ' was cancelled'
                  else ' was skipped' end
              from {{schema}}._private_py_workflow_edges as e
              join {{schema}}._private_py_workflow_steps as p on p.id = e.parent_id
              where e.child_id = s.id and p.state in ('failed', 'cancelled', 'skipped')
              order by p.state = 'skipped', p.finished_at, p.ref
              limit 1)
          end
        where s.id = any(v_cancel || v_skip)
        returning s.id
      )
      select coalesce(array_agg(ended.id), '{}') into v_ended from ended;
    end if;

    if cardinality(v_start) > 0 then
      v_ended := v_ended || {{schema}}.py_workflow_start(v_wf, v_start);
    end if;
    v_all := v_all || v_ended;
    v_check := '{}';
    exit when cardinality(v_ended) = 0;
  end loop;

  -- The counts, from the steps that ended in this call; the state once none is left.
  with counts as (
    select count(*) as total,
      count(*) filter (where s.state = 'succeeded') as succeeded,
      count(*) filter (where s.state = 'failed') as failed,
      count(*) filter (where s.state = 'cancelled') as cancelled,
      count(*) filter (where s.state = 'skipped') as skipped
    from {{schema}}._private_py_workflow_steps as s
    where s.id = any(v_all)
  )
  update {{schema}}._private_py_workflows as w
  set steps_left = w.steps_left - c.total,
    succeeded = w.succeeded + c.succeeded,
    failed = w.failed + c.failed,
    cancelled = w.cancelled + c.cancelled,
    skipped = w.skipped + c.skipped,
    state = case
      when w.steps_left - c.total > 0 then w.state
      when w.failed + c.failed > 0 then 'failed'
      when w.cancelled + c.cancelled > 0 then 'cancelled'
      else 'succeeded' end,
    finished_at = case when w.steps_left - c.total > 0 then null else now() end
  from counts as c
  where w.id = v_wf and c.total > 0;
  if found then
    -- A workflow that has just finished says so (a listener may wake on it).
    perform pg_notify({{schema}}.py_channel('finished'), 'w' || v_wf::text)
    from {{schema}}._private_py_workflows as w
    where w.id = v_wf and w.state <> 'running';
  end if;
end;
$fn$;

-- Record how the jobs of job_ids (steps' jobs; any other id is ignored) ended,
-- and advance their workflows, in the caller's transaction. results given:
-- they succeeded, with these results (the completer). Otherwise each one's
-- outcome is read where it is:
--   the job row is there     failed once its attempts are used up and it is
--                            not locked (else it is not final: left alone)
--   gone, with a history row its state: succeeded (its result), failed,
--                            cancelled, or removed (read as cancelled)
--   gone, with no record     succeeded with no result: finished by a Node
--                            worker (or removed by Node's functions)
-- Each workflow in subtransactions of its own: one whose steps cannot be
-- recorded, or that fails to advance, ends failed (py_workflow_break) and
-- holds up nothing else. Returns how many steps it recorded.
create or replace function {{schema}}.py_workflow_settle(
  job_ids bigint[], results json[] default null
)
returns integer
language plpgsql
volatile
set enable_seqscan = off
as $fn$
declare
  v_succeeded constant boolean := results is not null;
  -- Where each job's result is in results, by job id (a lookup per step,
  -- not a join; the results stay as the tasks returned them).
  v_given jsonb;
  v_groups jsonb;
  v_ids bigint[];
  v_states text[];
  v_results json[];
  v_errors text[];
  -- Where each step is in those arrays, by id.
  v_at jsonb;
  v_wf bigint;
  v_steps bigint[];
  v_ended bigint[];
  v_error text;
  v_count integer := 0;
begin
  -- The queued steps of these jobs, by workflow (through the job_id index).
  select jsonb_object_agg(g.workflow_id::text, g.ids)
  into v_groups
  from (
    select s.workflow_id, jsonb_agg(s.id) as ids
    from {{schema}}._private_py_workflow_steps as s
    where s.job_id = any(py_workflow_settle.job_ids) and s.state = 'queued'
    group by s.workflow_id
  ) as g;
  if v_groups is null then
    return 0;
  end if;
  if v_succeeded then
    select jsonb_object_agg(r.id::text, r.position)
    into v_given
    from unnest(py_workflow_settle.job_ids) with ordinality as r (id, position);
  end if;
  perform {{schema}}.py_workflow_lock(py_workflow_settle.job_ids);
  for v_wf in select e.key::bigint from jsonb_each(v_groups) as e order by 1 loop
    v_steps := array(select jsonb_array_elements_text(v_groups -> v_wf::text)::bigint);
    v_ended := null;
    v_ids := null;
    begin
      select array_agg(o.id), array_agg(o.state), array_agg(o.result), array_agg(o.error)
      into v_ids, v_states, v_results, v_errors
      from (
        select s.id,
          case
            when v_succeeded then 'succeeded'
            when j.id is not null then
              case when j.locked_at is null and j.attempts >= j.max_attempts then 'failed' end
            when h.state = 'succeeded' then 'succeeded'
            when h.state = 'failed' then 'failed'
            when h.state in ('cancelled', 'removed') then 'cancelled'
            else 'succeeded'
          end as state,
          case
            when v_succeeded
              then py_workflow_settle.results[(v_given ->> s.job_id::text)::int]
            when h.state = 'succeeded' then h.result
          end as result,
          case
            when v_succeeded then null
            when j.id is not null then j.last_error
            when h.state = 'failed' then h.last_error
            when h.state = 'cancelled' then
              coalesce('cancelled: ' || h.cancel_reason, 'cancelled')
            when h.state = 'removed' then
              'its job was removed' || coalesce(' (' || h.removed_by || ')', '')
          end as error
        from {{schema}}._private_py_workflow_steps as s
        left join {{schema}}._private_jobs as j on j.id = s.job_id and not v_succeeded
        left join {{schema}}._private_py_job_history as h
          on h.job_id = s.job_id and not v_succeeded
        where s.id = any(v_steps) and s.state = 'queued'
      ) as o
      where o.state is not null;
      if v_ids is not null then
        v_at := (
          select jsonb_object_agg(o.id::text, o.position)
          from unnest(v_ids) with ordinality as o (id, position)
        );
        with marked as (
          update {{schema}}._private_py_workflow_steps as s
          set state = v_states[(v_at ->> s.id::text)::int],
            result = v_results[(v_at ->> s.id::text)::int],
            error = v_errors[(v_at ->> s.id::text)::int],
            finished_at = now()
          where s.id = any(v_ids)
          returning s.id
        )
        select array_agg(marked.id) into v_ended from marked;
      end if;
    exception when others then
      v_error := sqlerrm;
      begin
        perform {{schema}}.py_workflow_break(v_wf, v_error, py_workflow_settle.job_ids);
      exception when others then
        raise warning 'workflow %: its steps'' outcomes could not be recorded (%), nor could it '
          'end failed (%)', v_wf, v_error, sqlerrm;
      end;
      continue;
    end;
    if v_ended is null then
      continue;
    end if;
    v_count := v_count + cardinality(v_ended);
    begin
      perform {{schema}}.py_workflow_advance(v_wf, v_ended);
    exception when others then
      v_error := sqlerrm;
      begin
        perform {{schema}}.py_workflow_break(v_wf, v_error);
      exception when others then
        raise warning 'workflow %: could not advance (%), nor end failed (%)',
          v_wf, v_error, sqlerrm;
      end;
    end;
  end loop;
  return v_count;
end;
$fn$;

-- A workflow that could not advance (an error in its resolution): it ends
-- failed, saying why; its blocked steps are cancelled, and its steps whose
-- jobs were being recorded (job_ids: their jobs end all the same) failed (its
-- running jobs run on; retry_workflow starts it again).
create or replace function {{schema}}.py_workflow_break(
  workflow_id bigint, error text, job_ids bigint[] default '{}'
)
returns void
language plpgsql
volatile
set enable_seqscan = off
as $fn$
declare
  v_wf constant bigint := py_workflow_break.workflow_id;
  v_cancelled integer;
  v_failed integer;
begin
  with ended as (
    update {{schema}}._private_py_workflow_steps as s
    set state = 'cancelled', finished_at = now(),
      error = 'its workflow could not advance: ' || py_workflow_break.error
    where s.workflow_id = v_wf and s.state = 'blocked'
    returning 1
  )
  select count(*) into v_cancelled from ended;
  with ended as (
    update {{schema}}._private_py_workflow_steps as s
    set state = 'failed', finished_at = now(),
      error = 'its outcome could not be recorded: ' || py_workflow_break.error
    where s.job_id = any(py_workflow_break.job_ids) and s.workflow_id = v_wf
      and s.state = 'queued'
    returning 1
  )
  select count(*) into v_failed from ended;
  update {{schema}}._private_py_workflows as w
  set state = 'failed', finished_at = now(), error = py_workflow_break.error,
    cancelled = w.cancelled + v_cancelled, failed = w.failed + v_failed,
    steps_left = w.steps_left - v_cancelled - v_failed
  where w.id = v_wf;
  perform pg_notify({{schema}}.py_channel('finished'), 'w' || v_wf);
end;
$fn$;

-- The repair sweep (every pool's upkeep, about every 2 seconds): settles up
-- to max_steps steps whose job ended without its workflow being told (run by
-- a Node worker, removed or failed for good by an admin function, or a
-- Python worker of an earlier version). Returns how many it settled.
create or replace function {{schema}}.py_workflow_repair(max_steps integer default 1000)
returns integer
language plpgsql
volatile
set enable_seqscan = off
as $fn$
declare
  v_ids bigint[];
begin
  v_ids := array(
    select s.job_id
    from {{schema}}._private_py_workflow_steps as s
    where s.state = 'queued'
      and not exists (
        select from {{schema}}._private_jobs as j
        where j.id = s.job_id and (j.locked_at is not null or j.attempts < j.max_attempts)
      )
    order by s.job_id
    limit max_steps
  );
  if cardinality(v_ids) = 0 then
    return 0;
  end if;
  return {{schema}}.py_workflow_settle(v_ids);
end;
$fn$;

-- Dynamic fan-out: the running step from_ref adds steps to its workflow (a
-- JSON array as py_add_workflow's; "after" names steps of that array). The
-- new steps without parents among them wait for from_ref itself (they start
-- when it succeeds). hold_dependents: from_ref's blocked children wait for
-- the new steps too (those no other new step waits for). Refused with one
-- line if from_ref is not running or a ref is taken. Returns the number of
-- steps added.
create or replace function {{schema}}.py_workflow_extend(
  workflow_id bigint, from_ref text, steps jsonb, hold_dependents boolean default false
)
returns integer
language plpgsql
volatile
set enable_seqscan = off
as $fn$
declare
  v_wf constant bigint := py_workflow_extend.workflow_id;
  v_n constant integer := jsonb_array_length(py_workflow_extend.steps);
  v_from bigint;
  v_taken text;
  v_first integer;
  v_ids bigint[];
begin
  select w.steps into v_first
  from {{schema}}._private_py_workflows as w where w.id = v_wf for update;
  select s.id into v_from
  from {{schema}}._private_py_workflow_steps as s
  where s.workflow_id = v_wf and s.ref = from_ref and s.state = 'queued';
  if v_from is null then
    raise exception 'workflow %: step % is not running: only a running step adds steps',
      v_wf, quote_literal(from_ref) using errcode = '22023';
  end if;
  select s.ref into v_taken
  from jsonb_array_elements(py_workflow_extend.steps) as n
  join {{schema}}._private_py_workflow_steps as s
    on s.workflow_id = v_wf and s.ref = n.value ->> 'ref'
  limit 1;
  if v_taken is not null then
    raise exception 'workflow %: ref % names a step it already has', v_wf, quote_literal(v_taken)
      using errcode = '22023';
  end if;
  v_ids := {{schema}}.py_workflow_insert(v_wf, py_workflow_extend.steps, v_first, v_from);
  if hold_dependents then
    with leaves as (
      select v_ids[n.position] as id
      from jsonb_array_elements(py_workflow_extend.steps) with ordinality as n (value, position)
      where not exists (
        select from jsonb_array_elements(py_workflow_extend.steps) as c
        where c.value -> 'after' ? (n.value ->> 'ref')
      )
    ),
    children as (
      select c.id
      from {{schema}}._private_py_workflow_edges as e
      join {{schema}}._private_py_workflow_steps as c on c.id = e.child_id
      where e.parent_id = v_from and c.state = 'blocked' and c.id <> all(v_ids)
    ),
    linked as (
      insert into {{schema}}._private_py_workflow_edges (parent_id, child_id)
      select l.id, c.id from leaves as l cross join children as c
      returning child_id
    )
    update {{schema}}._private_py_workflow_steps as s
    set parents = s.parents + x.n, parents_left = s.parents_left + x.n
    from (select linked.child_id, count(*) as n from linked group by linked.child_id) as x
    where s.id = x.child_id;
  end if;
  update {{schema}}._private_py_workflows as w
  set steps = w.steps + v_n, steps_left = w.steps_left + v_n
  where w.id = v_wf;
  return v_n;
end;
$fn$;

-- Cancel a workflow: no step of it starts any more; its blocked steps are
-- cancelled now, its steps' jobs cancelled as py_cancel_jobs cancels (those
-- waiting now, the running ones asked to stop: they end cancelled unless
-- they succeed first). Returns its state after, null if there is no such
-- workflow.
create or replace function {{schema}}.py_cancel_workflow(workflow_id bigint, reason text default null)
returns text
language plpgsql
volatile
set enable_seqscan = off
as $fn$
declare
  v_wf constant bigint := py_cancel_workflow.workflow_id;
  v_state text;
  v_ids bigint[];
begin
  select w.state into v_state
  from {{schema}}._private_py_workflows as w where w.id = v_wf for update;
  if v_state is null or v_state <> 'running' then
    return v_state;
  end if;
  update {{schema}}._private_py_workflows as w
  set cancel_requested_at = coalesce(w.cancel_requested_at, now()),
    cancel_reason = coalesce(py_cancel_workflow.reason, w.cancel_reason)
  where w.id = v_wf;
  with ended as (
    update {{schema}}._private_py_workflow_steps as s
    set state = 'cancelled', finished_at = now(),
      error = 'its workflow was cancelled' || coalesce(': ' || py_cancel_workflow.reason, '')
    where s.workflow_id = v_wf and s.state = 'blocked'
    returning s.id
  )
  select coalesce(array_agg(ended.id), '{}') into v_ids from ended;
  perform {{schema}}.py_workflow_advance(v_wf, v_ids);
  perform {{schema}}.py_cancel_jobs(
    array(
      select s.job_id from {{schema}}._private_py_workflow_steps as s
      where s.workflow_id = v_wf and s.state = 'queued'
      order by s.job_id
    ),
    coalesce(py_cancel_workflow.reason, 'its workflow was cancelled')
  );
  select w.state into v_state from {{schema}}._private_py_workflows as w where w.id = v_wf;
  return v_state;
end;
$fn$;

-- Run a workflow's failed and cancelled steps again, and every step after
-- them (whatever they ended as); the others keep their outcomes and results.
-- A reset step whose job is still there (failed for good) has that job
-- deleted: its new job replaces it. Steps running now are left to end.
-- Returns the number of steps reset, null if there is no such workflow.
create or replace function {{schema}}.py_retry_workflow(workflow_id bigint)
returns integer
language plpgsql
volatile
set enable_seqscan = off
as $fn$
declare
  v_wf constant bigint := py_retry_workflow.workflow_id;
  v_ids bigint[];
  v_old bigint[];
begin
  perform 1 from {{schema}}._private_py_workflows as w where w.id = v_wf for update;
  if not found then
    return null;
  end if;
  with recursive hit (id) as (
    select s.id from {{schema}}._private_py_workflow_steps as s
    where s.workflow_id = v_wf and s.state in ('failed', 'cancelled')
    union
    select e.child_id
    from {{schema}}._private_py_workflow_edges as e
    join hit on e.parent_id = hit.id
  )
  select array_agg(s.id), array_agg(s.job_id) filter (where s.job_id is not null)
  into v_ids, v_old
  from {{schema}}._private_py_workflow_steps as s
  where s.id in (select hit.id from hit)
    and s.state in ('succeeded', 'failed', 'cancelled', 'skipped');
  if v_ids is null then
    return 0;
  end if;
  delete from {{schema}}._private_jobs as j
  where j.id = any(v_old) and j.locked_at is null;
  delete from {{schema}}._private_py_job_options as o where o.job_id = any(v_old);
  update {{schema}}._private_py_workflow_steps as s
  set state = 'blocked', job_id = null, result = null, error = null, queued_at = null,
    finished_at = null, retries = s.retries + 1
  where s.id = any(v_ids);
  -- Every blocked step's counts, from its parents as they are now.
  update {{schema}}._private_py_workflow_steps as s
  set parents_left = x.left_, parents_failed = x.failed, parents_skipped = x.skipped
  from (
    select c.id,
      count(p.id) filter (where p.state in ('blocked', 'queued')) as left_,
      count(p.id) filter (where p.state in ('failed', 'cancelled')) as failed,
      count(p.id) filter (where p.state = 'skipped') as skipped
    from {{schema}}._private_py_workflow_steps as c
    left join {{schema}}._private_py_workflow_edges as e on e.child_id = c.id
    left join {{schema}}._private_py_workflow_steps as p on p.id = e.parent_id
    where c.workflow_id = v_wf and c.state = 'blocked'
    group by c.id
  ) as x
  where s.id = x.id;
  update {{schema}}._private_py_workflows as w
  set state = 'running', finished_at = null, error = null, cancel_requested_at = null,
    cancel_reason = null,
    steps_left = x.left_, succeeded = x.succeeded, failed = x.failed,
    cancelled = x.cancelled, skipped = x.skipped
  from (
    select count(*) filter (where s.state in ('blocked', 'queued')) as left_,
      count(*) filter (where s.state = 'succeeded') as succeeded,
      count(*) filter (where s.state = 'failed') as failed,
      count(*) filter (where s.state = 'cancelled') as cancelled,
      count(*) filter (where s.state = 'skipped') as skipped
    from {{schema}}._private_py_workflow_steps as s
    where s.workflow_id = v_wf
  ) as x
  where w.id = v_wf;
  perform {{schema}}.py_workflow_advance(v_wf, '{}', v_ids);
  return cardinality(v_ids);
end;
$fn$;
