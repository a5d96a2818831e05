"""Every SQL statement the dashboard sends, and the index each one reads.

Templates over the schema name, composed with :func:`worker_cli.sql.compose`
(the name quoted by ``psycopg.sql.Identifier``), as the worker's own statements.

The rule: on a queue of millions of jobs, every statement is bounded (it
examines at most a fixed number of rows or pages, whatever the table holds)
and reaches ``_private_jobs`` only through an index or a bounded sample,
never a sequential scan. ``tests/test_dashboard_queries.py`` EXPLAINs each one
on 200,000 jobs and checks the index named here. Where no index serves a
question (locked jobs, failures: ``locked_by``, ``locked_at`` and
``last_error`` have none, and the dashboard adds none, since every index on
``_private_jobs`` costs every add and every completion of every worker), the
statement scans a bounded window of the newest jobs by primary key, or a
bounded random sample, and the page says so.

The indexes of ``_private_jobs`` used here (migrations/base.sql):

- ``jobs_pkey1`` (``id``): a job's page; the windows of newest jobs;
- ``jobs_main_index`` (``priority, run_at`` where ``is_available``): the
  oldest due job;
- ``_private_py_jobs_task_order`` (migrations/py/000003.sql: ``task_id,
  priority, run_at, id`` of available jobs): the stranded tasks' runnable jobs.

The finished jobs are read from the history (``_private_py_job_history``,
migrations/py/000007.sql) through its primary key only (``job_id``): a
finished job's page, and the Finished view's keyset, windows of the newest
finished jobs by id. The history has no other index: each would be paid by
every job a worker completes (migrations/py/000011.sql)."""

from __future__ import annotations

# Whether the queue's tables exist (the schema name is a bound value here, as
# in worker_cli.sql.status.INSTALLED). Catalog lookups only.
INSTALLED = """
  select to_regclass(format('%%I._private_jobs', %(schema)s::text)) is not null as jobs,
    to_regclass(format('%%I._private_py_migrations', %(schema)s::text)) is not null
      as py_migrations
"""

# The Python-only migrations applied (one row each: a handful).
PY_MIGRATIONS = """
  select coalesce(array_agg(id order by id), '{{}}') as ids from {schema}._private_py_migrations
"""

# The revision of Node's schema (migrations_pkey: a backward scan, one row).
REVISION = "select max(id) as revision from {schema}.migrations"

# The jobs table's size now, in pages: pg_relation_size asks the storage, so it
# is right even when the table has grown since its last ANALYZE (the planner's
# reltuples would not be). No table access.
JOBS_PAGES = """
  select pg_relation_size(format('%%I._private_jobs', %(schema)s::text)::regclass)
    / current_setting('block_size')::bigint as pages
"""

# Jobs by task, named queue, state and holder, in the words every command
# prints (py_job_state). No index: a sample scan (TABLESAMPLE SYSTEM) reading
# each page with probability %(percent)s, so about job_counts.SAMPLE_PAGES
# pages whatever the table's size; at 100 percent it reads every page and the
# counts are exact (dashboard/job_counts.py decides). A pause holds a whole
# task and named queue, so it is read per group (py_paused_by), as are the
# task and queue names (tasks_pkey, job_queues_pkey1).
CENSUS = """
  with sampled as (
    select j.task_id, j.job_queue_id,
        {schema}.py_job_state(j.locked_at, j.attempts, j.max_attempts, j.run_at, null)
          as state,
      case when j.locked_at is not null then j.locked_by end as locked_by,
      min(j.locked_at) as locked_since,
      count(*) as jobs
    from {schema}._private_jobs as j tablesample system (%(percent)s::real)
    group by 1, 2, 3, 4
  )
  select
    (select t.identifier from {schema}._private_tasks as t where t.id = s.task_id)
      as task_identifier,
    (select q.queue_name from {schema}._private_job_queues as q where q.id = s.job_queue_id)
      as queue_name,
    case when s.state in ('waiting', 'scheduled', 'retrying')
      and {schema}.py_paused_by(s.task_id, s.job_queue_id) is not null then 'paused'
      else s.state end as state,
    s.locked_by, s.locked_since, s.jobs
  from sampled as s
"""

# The job that has been due the longest without being taken (paused or held
# by a limit included: the overview's badges say so; `status` leaves paused
# jobs out, with an unbounded read). jobs_main_index
# (priority, run_at, available jobs only): its distinct priorities found one
# index descent each (a loose index scan), then the first entry of each
# priority, which is that priority's earliest run_at. Bounded by the number of
# distinct priorities, never by the number of jobs.
OLDEST_DUE = """
  with recursive priorities (priority) as (
    (
      select j.priority from {schema}._private_jobs as j
      where j.is_available = true
      order by j.priority
      limit 1
    )
    union all
    select (
      select j.priority from {schema}._private_jobs as j
      where j.is_available = true and j.priority > p.priority
      order by j.priority
      limit 1
    )
    from priorities as p
    where p.priority is not null
  )
  select first.id,
    (select t.identifier from {schema}._private_tasks as t where t.id = first.task_id)
      as task_identifier,
    (select q.queue_name from {schema}._private_job_queues as q
     where q.id = first.job_queue_id) as queue_name,
    first.run_at,
    case when isfinite(first.run_at) then extract(epoch from now() - first.run_at)::float8
      else 'Infinity'::float8 end as age
  from priorities as p
  cross join lateral (
    select j.id, j.task_id, j.job_queue_id, j.run_at
    from {schema}._private_jobs as j
    where j.is_available = true and j.priority = p.priority and j.run_at <= now()
    order by j.run_at
    limit 1
  ) as first
  order by first.run_at, first.id
  limit 1
"""

# The latest failures: jobs with a last_error that are not running (retrying,
# paused or failed: py_job_state's word), newest error first, among the newest %(window)s jobs.
# jobs_pkey1, backward: nothing indexes last_error or updated_at, so only that
# window is examined; `examined` tells the page whether it was full. The
# %(limit)s shown are chosen inside the window (`shown`, materialized so the
# planner knows they are few) and only they are read back by id (jobs_pkey1):
# joining the whole window to the table let the planner pick a hash join over
# a sequential scan when its statistics guessed many failures.
LATEST_FAILURES = """
  with newest as materialized (
    select j.id, j.updated_at, j.last_error is not null and j.locked_at is null as failed
    from {schema}._private_jobs as j
    order by j.id desc
    limit %(window)s
  ),
  window_end as (
    select count(*)::int as examined from newest
  ),
  shown as materialized (
    select n.id, n.updated_at
    from newest as n
    where n.failed
    order by n.updated_at desc, n.id desc
    limit %(limit)s
  )
  select w.examined, r.*
  from window_end as w
  left join lateral (
    select j.id,
      (select t.identifier from {schema}._private_tasks as t where t.id = j.task_id)
        as task_identifier,
      (select q.queue_name from {schema}._private_job_queues as q
       where q.id = j.job_queue_id) as queue_name,
      j.attempts, j.max_attempts, left(j.last_error, 500) as last_error, j.updated_at,
      {schema}.py_job_state(j.locked_at, j.attempts, j.max_attempts, j.run_at,
        {schema}.py_paused_by(j.task_id, j.job_queue_id)) as state
    from shown as s
    join {schema}._private_jobs as j on j.id = s.id
    order by s.updated_at desc, s.id desc
  ) as r on true
"""

# The first %(limit)s named queues by name, with their holders
# (job_queues_queue_name_key).
QUEUES = """
  select q.id, q.queue_name, q.locked_by, q.locked_at,
    extract(epoch from now() - q.locked_at)::float8 as locked_for
  from {schema}._private_job_queues as q
  order by q.queue_name
  limit %(limit)s
"""

# The pauses in force (migrations/py/000014.sql): one small row per paused
# named queue or task, read whole (the pauses' primary key, kind and name, or
# a scan of that table, never of the jobs), at most %(limit)s. A pause whose
# resume_at has passed is over, whether or not a pool's upkeep has deleted it.
PAUSES = """
  select p.kind, p.name, p.paused_at, p.resume_at, p.reason, p.hold_queue_lock
  from {schema}._private_py_pauses as p
  where p.resume_at is null or p.resume_at > now()
  order by p.kind, p.name
  limit %(limit)s
"""

# A page of the job list, newest first, filtered by task, queue and state, by
# keyset on id (below %(before)s). jobs_pkey1, backward: at most %(window)s
# jobs below the cursor are examined (`scanned`), whatever the filters, and up
# to %(limit)s of them that match are returned; `examined` and `lowest` say
# how far the window went, so the page can offer to search older jobs when a
# rare filter found fewer. The task and queue names are looked up once
# (tasks_identifier_key, job_queues_queue_name_key); the matching rows are
# chosen inside the window (`shown`, materialized so the planner knows they
# are few) and only they are read back by id (jobs_pkey1).
JOBS_PAGE = """
  with scanned as materialized (
    select j.id, j.task_id, j.job_queue_id,
      {schema}.py_job_state(j.locked_at, j.attempts, j.max_attempts, j.run_at, p.paused_by)
        as state,
      case when j.locked_at is null and j.attempts < j.max_attempts then p.paused_by end
        as paused_by
    from {schema}._private_jobs as j
    cross join lateral (
      select {schema}.py_paused_by(j.task_id, j.job_queue_id) as paused_by
    ) as p
    where j.id < %(before)s::bigint
    order by j.id desc
    limit %(window)s
  ),
  window_end as (
    select count(*)::int as examined, min(s.id) as lowest from scanned as s
  ),
  shown as materialized (
    select s.id, s.state, s.paused_by
    from scanned as s
    where (%(task)s::text is null or s.task_id = (
        select t.id from {schema}._private_tasks as t where t.identifier = %(task)s::text))
      and (%(queue)s::text is null or s.job_queue_id = (
        select q.id from {schema}._private_job_queues as q
        where q.queue_name = %(queue)s::text))
      and (%(state)s::text is null or s.state = %(state)s::text)
    order by s.id desc
    limit %(limit)s
  )
  select w.examined, w.lowest, r.*
  from window_end as w
  left join lateral (
    select j.id,
      (select t.identifier from {schema}._private_tasks as t where t.id = j.task_id)
        as task_identifier,
      (select q.queue_name from {schema}._private_job_queues as q
       where q.id = j.job_queue_id) as queue_name,
      s.state, s.paused_by, j.priority, j.run_at, j.attempts, j.max_attempts,
      left(j.last_error, 300) as last_error, j.key, j.locked_by, j.created_at
    from shown as s
    join {schema}._private_jobs as j on j.id = s.id
    order by s.id desc
  ) as r on true
"""

# One job, with its queue's holder, if a pool holds it that pool's heartbeat,
# and its cancel request if it has one, with the attempt the job was at then
# (cancel_attempt: its row's attempts became max_attempts) (jobs_pkey1;
# job_queues_pkey1; the heartbeats' and the cancel requests' primary keys).
# `state` is its state as every command names it (py_job_state, as
# py_job_status gives it), with the pause holding a paused one (`paused_by`).
JOB = """
  select j.id,
    (select t.identifier from {schema}._private_tasks as t where t.id = j.task_id)
      as task_identifier,
    q.queue_name, q.locked_by as queue_locked_by, j.payload::text as payload, j.priority,
    j.run_at, j.attempts, j.max_attempts, j.last_error, j.created_at, j.updated_at, j.key,
    j.locked_at, j.locked_by, j.revision, j.flags,
    {schema}.py_job_state(j.locked_at, j.attempts, j.max_attempts, j.run_at, p.paused_by)
      as state,
    case when j.locked_at is null and j.attempts < j.max_attempts then p.paused_by end
      as paused_by,
    h.beat_at >= now() - h.timeout as holder_alive, now() as now,
    c.requested_at as cancel_requested_at, c.reason as cancel_reason,
    c.attempts as cancel_attempt, coalesce(j.id = any(h.stuck_job_ids), false) as stuck
  from {schema}._private_jobs as j
  left join {schema}._private_job_queues as q on q.id = j.job_queue_id
  left join {schema}._private_py_heartbeats as h on h.pool_id = j.locked_by
  left join {schema}._private_py_cancellations as c on c.job_id = j.id
  cross join lateral (
    select {schema}.py_paused_by(j.task_id, j.job_queue_id) as paused_by
  ) as p
  where j.id = %(id)s::bigint
"""

# The task identifiers for the filter (tasks_identifier_key, the first %(limit)s).
TASK_IDENTIFIERS = """
  select t.identifier from {schema}._private_tasks as t order by t.identifier limit %(limit)s
"""

NOW = "select now() as now"

# A page of the Finished view, newest job first: a keyset on the history's
# primary key, read backward from the page's cursor (a job id; null: the
# newest). As the job list's, at most %(window)s rows are examined
# (`scanned`), whatever the filters, and up to %(limit)s of them that match
# the task, the state and the finish times (strictly after %(after)s and
# before %(before)s) are returned; `examined` and the lowest id examined let
# the page search older ones when a rare filter found fewer. Only the rows
# shown are read back, by primary key; a result is previewed only when it is
# stored in at most %(preview_max)s bytes (pg_column_size reads no more than
# the row), since a result may be 64 MiB.
FINISHED_PAGE = """
  with scanned as materialized (
    select h.job_id, h.finished_at, h.task_identifier, h.state
    from {schema}._private_py_job_history as h
    where h.job_id < coalesce(%(upper_id)s::bigint, 9223372036854775807)
    order by h.job_id desc
    limit %(window)s
  ),
  window_end as (
    select count(*)::int as examined, min(s.job_id) as lowest_id from scanned as s
  ),
  shown as materialized (
    select s.job_id
    from scanned as s
    where (%(task)s::text is null or s.task_identifier = %(task)s::text)
      and (%(state)s::text is null or s.state = %(state)s::text)
      and s.finished_at > coalesce(%(after)s::timestamptz, '-infinity')
      and s.finished_at < coalesce(%(before)s::timestamptz, 'infinity')
    order by s.job_id desc
    limit %(limit)s
  )
  select w.examined, w.lowest_id, r.*
  from window_end as w
  left join lateral (
    select h.job_id as id, h.state, h.task_identifier, h.queue_name, h.attempts,
      h.max_attempts, h.created_at, h.started_at, h.finished_at,
      extract(epoch from h.finished_at - h.started_at)::float8 as took,
      left(h.last_error, 300) as last_error,
      case when pg_column_size(h.result) <= %(preview_max)s
        then left(h.result::text, 300) end as result,
      pg_column_size(h.result) as result_size, h.result_error,
      left(h.cancel_reason, 300) as cancel_reason, h.timed_out
    from shown as s
    join {schema}._private_py_job_history as h on h.job_id = s.job_id
    order by s.job_id desc
  ) as r on true
"""

# The newest finished job (the primary key, backward: one row), or none:
# whether the history holds anything at all.
LATEST_FINISHED = """
  select h.job_id, h.finished_at
  from {schema}._private_py_job_history as h
  order by h.job_id desc
  limit 1
"""

# A finished job's record (the history's primary key). Of its result (up to
# 64 MiB) the first %(cut)s characters are sent, with its whole length.
FINISHED_JOB = """
  select h.job_id as id, h.state, h.task_identifier, h.queue_name, h.key, h.priority,
    h.attempts, h.max_attempts, h.revision, h.flags,
    left(h.result::text, %(cut)s) as result, length(h.result::text) as result_length,
    h.result_error, h.last_error, h.created_at, h.run_at, h.started_at, h.finished_at,
    extract(epoch from h.finished_at - h.started_at)::float8 as took,
    h.pool_id, h.cancel_requested_at, h.cancel_reason, h.timed_out, h.expires_at,
    h.removed_by
  from {schema}._private_py_job_history as h
  where h.job_id = %(id)s::bigint
"""

# A job's attempt errors (migrations/py/000018.sql: each failed attempt on a
# Python pool, kept 7 days), with their tracebacks and the operators' retries
# among them (000023.sql), newest first, through their job_id index: the
# %(limit)s newest, each cut at %(cut)s characters, and how many there are.
ATTEMPT_ERRORS = """
  select e.attempt, e.failed_at, left(e.error, %(cut)s) as error,
    length(e.error) > %(cut)s as cut, e.pool_id, e.traceback, e.retried_by,
    count(*) over () as total
  from {schema}._private_py_job_errors as e
  where e.job_id = %(id)s::bigint
  order by e.id desc
  limit %(limit)s
"""

# The pools with a heartbeat row (migrations/py/000002.sql, 000004.sql,
# 000025.sql): one small row per running Python pool, read whole (a sequential
# scan of that table, not of the jobs), at most %(limit)s. A row whose beat is
# older than its timeout is a dead pool that no live pool has released yet.
# The counters are null for pools of older versions; the rate is over the
# pool's last interval. signed: the pool holds a session sign;
# sign_missing_for: seconds since another pool found it missing (null: held).
HEARTBEATS = """
  select h.pool_id, h.hostname, h.pid, h.started_at, h.beat_at,
    extract(epoch from h.timeout)::float8 as timeout,
    extract(epoch from now() - h.beat_at)::float8 as silent_for,
    h.beat_at >= now() - h.timeout as alive,
    h.concurrency, h.task_identifiers, h.version, h.jobs_done, h.stuck_job_ids,
    h.sign_key is not null as signed,
    extract(epoch from now() - h.sign_missing_since)::float8 as sign_missing_for,
    case when h.beat_before is not null and h.beat_at > h.beat_before
      and h.jobs_done_before is not null
      then (h.jobs_done - h.jobs_done_before)
        / extract(epoch from h.beat_at - h.beat_before)::float8
    end as rate
  from {schema}._private_py_heartbeats as h
  order by h.started_at, h.pool_id
  limit %(limit)s
"""

# Holders of named queues among the first %(window)s queues by id
# (job_queues_pkey1): every queue is one row, so this is every holder unless
# there are more queues than the window.
QUEUE_HOLDERS = """
  select q.locked_by, count(*)::bigint as queues, min(q.locked_at) as locked_since
  from (
    select q.locked_by, q.locked_at from {schema}._private_job_queues as q
    order by q.id
    limit %(window)s
  ) as q
  where q.locked_at is not null
  group by q.locked_by
"""

# Whether a pool's heartbeat says it is alive (the heartbeats' primary key).
POOL_ALIVE = """
  select h.beat_at >= now() - h.timeout as alive,
    extract(epoch from now() - h.beat_at)::float8 as silent_for
  from {schema}._private_py_heartbeats as h
  where h.pool_id = %(pool_id)s::text
"""

# The cron items the workers know and when each last ran (known_crontabs_pkey,
# the first %(limit)s by identifier).
CRONTAB = """
  select k.identifier, k.known_since, k.last_execution,
    extract(epoch from now() - k.last_execution)::float8 as since
  from {schema}._private_known_crontabs as k
  order by k.identifier
  limit %(limit)s
"""

# The schedules in the database (migrations/py/000027.sql: one small row per
# schedule an operator or an application added), the first %(limit)s by
# identifier (their primary key), with the columns of
# worker_cli.jobs.schedule.SCHEDULE_COLUMNS.
SCHEDULES = """
  select s.identifier, s.pattern, s.task_identifier, s.payload, s.tz, s.fill, s.queue_name,
    s.priority, s.max_attempts, s.job_key, s.paused, s.version, s.created_at, s.updated_at,
    s.known_since, s.last_execution, s.last_run_at
  from {schema}._private_py_schedules as s
  order by s.identifier
  limit %(limit)s
"""

# A job's kept logs (migrations/py/000027.sql: the lines its task logged in an
# attempt, at most 64 KiB each, kept 7 days), newest first, through their
# job_id index: the %(limit)s newest, and how many there are.
JOB_LOGS = """
  select l.id, l.attempt, l.outcome, l.logged_at, l.lines, l.dropped, count(*) over () as total
  from {schema}._private_py_job_logs as l
  where l.job_id = %(id)s::bigint
  order by l.id desc
  limit %(limit)s
"""

# The newest CHART_READ history rows and live jobs (each through its primary
# key, backward), as events: completed, failed, cancelled, added, each at its
# time, with the wait of a completed job; then counted per bucket from
# %(start)s, %(step)s seconds each, up to %(end)s.
CHART_BUCKETS = """
  with h as materialized (
    select h.job_id, h.state, h.task_identifier, h.created_at, h.run_at, h.started_at,
      h.finished_at
    from {schema}._private_py_job_history as h
    order by h.job_id desc
    limit %(read)s
  ),
  j as materialized (
    select j.id, j.task_id, j.created_at, j.updated_at, j.attempts, j.max_attempts, j.locked_at
    from {schema}._private_jobs as j
    order by j.id desc
    limit %(read)s
  ),
  jt as (
    select j.*, t.identifier
    from j join {schema}._private_tasks as t on t.id = j.task_id
    where %(task)s::text is null or t.identifier = %(task)s::text
  ),
  ht as (
    select h.* from h where %(task)s::text is null or h.task_identifier = %(task)s::text
  ),
  e as materialized (
    select e.failed_at, e.retried, e.task_identifier
    from {schema}._private_py_job_errors as e
    order by e.id desc
    limit %(read)s
  ),
  events as (
    select h.finished_at as at,
      case h.state when 'succeeded' then 'completed' else h.state end as kind,
      case when h.state = 'succeeded' and h.started_at is not null and isfinite(h.run_at)
        then greatest(extract(epoch from h.started_at - h.run_at), 0) end as wait
    from ht as h
    union all
    select h.created_at, 'added', null from ht as h
    union all
    select j.created_at, 'added', null from jt as j
    union all
    select j.updated_at, 'failed', null from jt as j
    where j.attempts >= j.max_attempts and j.locked_at is null
    union all
    select e.failed_at, 'retried', null from e
    where e.retried and (%(task)s::text is null or e.task_identifier = %(task)s::text)
  )
  select floor(extract(epoch from e.at - %(start)s::timestamptz) / %(step)s)::int as bucket,
    count(*) filter (where e.kind = 'completed') as completed,
    count(*) filter (where e.kind = 'failed') as failed,
    count(*) filter (where e.kind = 'cancelled') as cancelled,
    count(*) filter (where e.kind = 'added') as added,
    count(*) filter (where e.kind = 'retried') as retried,
    max(e.wait)::float8 as max_wait
  from events as e
  where e.at >= %(start)s::timestamptz and e.at < %(end)s::timestamptz
  group by 1
  order by 1
"""

# How much of each table the chart read: the rows read, and the created_at of
# the lowest id read (the primary keys, backward; two rows by id).
CHART_COVERAGE = """
  with h as (
    select h.job_id from {schema}._private_py_job_history as h
    order by h.job_id desc limit %(read)s
  ),
  j as (
    select j.id from {schema}._private_jobs as j order by j.id desc limit %(read)s
  ),
  e as (
    select e.id from {schema}._private_py_job_errors as e order by e.id desc limit %(read)s
  )
  select
    (select count(*) from h) as history_read,
    (select x.created_at from {schema}._private_py_job_history as x
      where x.job_id = (select min(h.job_id) from h)) as history_from,
    (select count(*) from j) as live_read,
    (select x.created_at from {schema}._private_jobs as x
      where x.id = (select min(j.id) from j)) as live_from,
    (select count(*) from e) as errors_read,
    (select x.failed_at from {schema}._private_py_job_errors as x
      where x.id = (select min(e.id) from e)) as errors_from
"""
