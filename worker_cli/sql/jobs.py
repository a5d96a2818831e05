"""The statements of the job operations (WorkerUtils, the admin commands):
adding, removing, rescheduling, failing and completing jobs through
graphile-worker's functions, unique adds (migrations/py/000001.sql), the
names behind job rows, and a job's state and attempt errors."""

from __future__ import annotations

from typing import LiteralString

# The functions return _private_jobs rows; JOB_NAMES then looks up the task
# identifiers and queue names behind them. It must be a separate statement: a
# task or queue the function creates is invisible to the statement calling it.
JOB_NAMES = """
  select 'task' as kind, t.id, t.identifier as name
  from {schema}._private_tasks as t
  where t.id = any(%(task_ids)s::int[])
  union all
  select 'queue', q.id, q.queue_name
  from {schema}._private_job_queues as q
  where q.id = any(%(queue_ids)s::int[])
"""

# Add one job (graphile-worker's add_job); its row, in JOB_COLUMNS.
ADD_JOB = """
  select j.id, j.job_queue_id, j.task_id, j.payload, j.priority, j.run_at, j.attempts,
    j.max_attempts, j.last_error, j.created_at, j.updated_at, j.key, j.locked_at, j.locked_by,
    j.revision, j.flags, j.is_available
  from {schema}.add_job(
    identifier => %(identifier)s,
    payload => %(payload)s::json,
    queue_name => %(queue_name)s,
    run_at => %(run_at)s,
    max_attempts => %(max_attempts)s,
    job_key => %(job_key)s,
    priority => %(priority)s,
    flags => %(flags)s::text[],
    job_key_mode => %(job_key_mode)s
  ) as j
"""

# Add jobs (add_jobs): the specs travel as one JSON array and become
# job_spec[] in the server.
ADD_JOBS = """
  select j.id, j.job_queue_id, j.task_id, j.payload, j.priority, j.run_at, j.attempts,
    j.max_attempts, j.last_error, j.created_at, j.updated_at, j.key, j.locked_at, j.locked_by,
    j.revision, j.flags, j.is_available
  from {schema}.add_jobs(
    array(
      select spec
      from json_populate_recordset(null::{schema}.job_spec, %(specs)s::json) as spec
    ),
    %(job_key_preserve_run_at)s
  ) as j
"""

# Remove the job with this key (remove_job): its row, if there was one.
REMOVE_JOB = """
  select j.id, j.job_queue_id, j.task_id, j.payload, j.priority, j.run_at, j.attempts,
    j.max_attempts, j.last_error, j.created_at, j.updated_at, j.key, j.locked_at, j.locked_by,
    j.revision, j.flags, j.is_available
  from {schema}.remove_job(%(job_key)s) as j
  where j.id is not null
"""

# Complete jobs by id (complete_jobs: deleted).
COMPLETE_JOBS = """
  select j.id, j.job_queue_id, j.task_id, j.payload, j.priority, j.run_at, j.attempts,
    j.max_attempts, j.last_error, j.created_at, j.updated_at, j.key, j.locked_at, j.locked_by,
    j.revision, j.flags, j.is_available
  from {schema}.complete_jobs(%(job_ids)s::bigint[]) as j
"""

# Fail jobs by id for good (permanently_fail_jobs), with this error.
PERMANENTLY_FAIL_JOBS = """
  select j.id, j.job_queue_id, j.task_id, j.payload, j.priority, j.run_at, j.attempts,
    j.max_attempts, j.last_error, j.created_at, j.updated_at, j.key, j.locked_at, j.locked_by,
    j.revision, j.flags, j.is_available
  from {schema}.permanently_fail_jobs(%(job_ids)s::bigint[], %(error_message)s) as j
"""

# Reschedule jobs by id (reschedule_jobs; a null field is kept).
RESCHEDULE_JOBS = """
  select j.id, j.job_queue_id, j.task_id, j.payload, j.priority, j.run_at, j.attempts,
    j.max_attempts, j.last_error, j.created_at, j.updated_at, j.key, j.locked_at, j.locked_by,
    j.revision, j.flags, j.is_available
  from {schema}.reschedule_jobs(
    %(job_ids)s::bigint[],
    run_at => %(run_at)s,
    priority => %(priority)s,
    attempts => %(attempts)s,
    max_attempts => %(max_attempts)s
  ) as j
"""

FORCE_UNLOCK_WORKERS = "select {schema}.force_unlock_workers(%(worker_ids)s::text[])"

# Add one job under a uniqueness rule (py_add_job): UNIQUE_RESULT_COLUMNS, then
# the existing or new job's JOB_COLUMNS.
ADD_UNIQUE_JOB = """
  select r.job_id, r.conflict, r.conflict_state, r.replaced,
    (r.job).id, (r.job).job_queue_id, (r.job).task_id, (r.job).payload, (r.job).priority,
    (r.job).run_at, (r.job).attempts, (r.job).max_attempts, (r.job).last_error,
    (r.job).created_at, (r.job).updated_at, (r.job).key, (r.job).locked_at, (r.job).locked_by,
    (r.job).revision, (r.job).flags, (r.job).is_available
  from {schema}.py_add_job(
    identifier => %(identifier)s,
    payload => %(payload)s::json,
    queue_name => %(queue_name)s,
    run_at => %(run_at)s,
    max_attempts => %(max_attempts)s,
    job_key => %(job_key)s,
    priority => %(priority)s,
    flags => %(flags)s::text[],
    job_key_mode => %(job_key_mode)s,
    unique_rule => %(unique_rule)s::jsonb
  ) as r
"""

# The same for jobs (py_add_jobs): one result per spec, and its spec_index last
# (after the job's columns): the caller orders by it (order by spec_index),
# after wrapping the statement if it carries a trace context
# (trace_context.carry).
ADD_UNIQUE_JOBS = """
  select r.job_id, r.conflict, r.conflict_state, r.replaced,
    (r.job).id, (r.job).job_queue_id, (r.job).task_id, (r.job).payload, (r.job).priority,
    (r.job).run_at, (r.job).attempts, (r.job).max_attempts, (r.job).last_error,
    (r.job).created_at, (r.job).updated_at, (r.job).key, (r.job).locked_at, (r.job).locked_by,
    (r.job).revision, (r.job).flags, (r.job).is_available,
    r.spec_index
  from {schema}.py_add_jobs(
    array(
      select spec
      from json_populate_recordset(null::{schema}.job_spec, %(specs)s::json) as spec
    ),
    %(unique_rules)s::jsonb,
    %(job_key_preserve_run_at)s
  ) as r
"""

# REMOVE_JOB, and the uniqueness lock its job held: a job an administrator
# removed does not block duplicates.
REMOVE_JOB_RELEASING_UNIQUE_LOCK = """
  with removed as (
    select j.* from {schema}.remove_job(%(job_key)s) as j where j.id is not null
  ),
  released as (
    delete from {schema}._private_py_unique_locks as l
    where l.job_id in (select removed.id from removed)
  )
  select removed.id, removed.job_queue_id, removed.task_id, removed.payload, removed.priority,
    removed.run_at, removed.attempts, removed.max_attempts, removed.last_error,
    removed.created_at, removed.updated_at, removed.key, removed.locked_at, removed.locked_by,
    removed.revision, removed.flags, removed.is_available
  from removed
"""

# The record of removed jobs (migrations/py/000023.sql), continuing a
# statement whose CTE "removed" holds the rows remove_job or complete_jobs
# returned: each one they deleted (not one a worker holds, which they only kept
# from retrying) recorded in the history as removed (removed_by %(by)s: 'api',
# 'cli', 'dashboard'; kept a day; listed in the expiry ledger, one row: at most
# 1,000 jobs), and the uniqueness locks of all of them released (a job an
# administrator removed does not block its duplicates).
_RECORD_REMOVED: LiteralString = """,
  recorded as (
    insert into {schema}._private_py_job_history (
      job_id, state, task_identifier, queue_name, key, priority, attempts, max_attempts,
      revision, flags, last_error, created_at, run_at, finished_at, removed_by, expires_at
    )
    select r.id, 'removed', t.identifier, q.queue_name, r.key, r.priority, r.attempts,
      r.max_attempts, r.revision, r.flags, r.last_error, r.created_at, r.run_at, now(),
      %(by)s::text, now() + interval '1 day'
    from removed as r
    join {schema}._private_tasks as t on t.id = r.task_id
    left join {schema}._private_job_queues as q on q.id = r.job_queue_id
    where r.locked_at is null or r.locked_at < now() - interval '4 hours'
    on conflict (job_id) do nothing
    returning job_id
  ),
  expiry as (
    insert into {schema}._private_py_job_history_expiry (expires_at, job_ids)
    select now() + interval '1 day', array_agg(r.job_id) from recorded as r
    having count(*) > 0
  ),
  released as (
    delete from {schema}._private_py_unique_locks as l
    where l.job_id in (select removed.id from removed)
  )
"""

# REMOVE_JOB_RELEASING_UNIQUE_LOCK, and a job it deleted recorded in the
# history as removed (_RECORD_REMOVED; removed_by %(by)s, 'api' from the
# utilities).
REMOVE_JOB_RECORDED = (
    """
  with removed as materialized (
    select j.* from {schema}.remove_job(%(job_key)s) as j where j.id is not null
  )"""
    + _RECORD_REMOVED
    + """
  select removed.id, removed.job_queue_id, removed.task_id, removed.payload, removed.priority,
    removed.run_at, removed.attempts, removed.max_attempts, removed.last_error,
    removed.created_at, removed.updated_at, removed.key, removed.locked_at, removed.locked_by,
    removed.revision, removed.flags, removed.is_available
  from removed
"""
)

# Whether the schema records removals and operators' retries (Python migration
# 23: the history's removed_by); the schema name is a bound value here.
ON_CALL_INSTALLED = """
  select exists (
    select 1 from pg_attribute as a
    where a.attrelid = to_regclass(format('%%I._private_py_job_history', %(schema)s::text))
      and a.attname = 'removed_by' and not a.attisdropped
  )
"""

# Whether the schema has the unique-jobs table (Python migration 1); the schema
# name is a bound value here, as in status.INSTALLED.
UNIQUE_TABLES_INSTALLED = """
  select to_regclass(format('%%I._private_py_unique_locks', %(schema)s::text)) is not null
"""

# The state (and result) of one job: migrations/py/000007.sql.
# A job's record (py_job_status), and its progress (migrations/py/000027.sql;
# null columns when it reported none).
JOB_STATUS = """
  select s.*, p.done, p.total, p.message, p.updated_at
  from {schema}.py_job_status(%(job_id)s) as s
  left join {schema}._private_py_job_progress as p on p.job_id = %(job_id)s::bigint
"""

# A job's attempt errors (migrations/py/000018.sql), with their tracebacks and
# the operators' retries among them (000023.sql), oldest first, through their
# job_id index (AttemptError's fields, in order).
JOB_ERRORS = """
  select e.attempt, e.failed_at, e.error, e.retried, e.task_identifier, e.pool_id,
    e.traceback, e.retried_by
  from {schema}._private_py_job_errors as e
  where e.job_id = %(job_id)s::bigint
  order by e.id
"""

# Whether the schema has the options table (Python migration 7); the schema
# name is a bound value here.
JOB_OPTIONS_INSTALLED = """
  select to_regclass(format('%%I._private_py_job_options', %(schema)s::text)) is not null
"""

# What `graphile-worker job` shows beside the record: the job's payload as
# stored (its text; null once it has left the jobs table: the history keeps
# none), and how it was removed (a history row in state 'removed':
# migrations/py/000023.sql). Primary-key lookups.
JOB_EXTRAS = """
  select
    (select j.payload::text from {schema}._private_jobs as j where j.id = %(job_id)s::bigint),
    (select h.removed_by from {schema}._private_py_job_history as h
     where h.job_id = %(job_id)s::bigint and h.state = 'removed')
"""
