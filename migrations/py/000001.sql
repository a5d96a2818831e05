-- Unique jobs (Python-only; Node never reads these objects).
--
-- One row per uniqueness hash: the job that holds it, the states in which
-- that job blocks a duplicate, and when the hold ends (null: no time limit,
-- only as long as the job row exists). Nothing watches the jobs table: the
-- state of the holder is derived from its live row when a duplicate is
-- checked, and a row that is gone means the job succeeded (a Node or Python
-- worker deleted it). Job ids are identity values and never reused.
create table {{schema}}._private_py_unique_locks (
  hash bytea primary key,
  job_id bigint not null,
  states text[] not null,
  expires_at timestamptz,
  created_at timestamptz not null default now()
);
create index _private_py_unique_locks_job_id on {{schema}}._private_py_unique_locks (job_id);
create index _private_py_unique_locks_expires_at
  on {{schema}}._private_py_unique_locks (expires_at)
  where expires_at is not null;
alter table {{schema}}._private_py_unique_locks enable row level security;

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
