"""The SQL statements this package sends, each named after what it does.

Every statement is a template over the schema name; :func:`compose` turns it
into a ``psycopg.sql.Composed`` with the name quoted by ``sql.Identifier``.
Schema DDL lives in ``migrations/*.sql``, not here.
"""

from __future__ import annotations

from functools import cache
from typing import LiteralString

from psycopg import sql

__all__ = ["compose"]

# The functions return _private_jobs rows; job_names then looks up the task
# identifiers and queue names behind them. It must be a separate statement: a
# task or queue the function creates is invisible to the statement calling it.
job_names = """
  select 'task' as kind, t.id, t.identifier as name
  from {schema}._private_tasks as t
  where t.id = any(%(task_ids)s::int[])
  union all
  select 'queue', q.id, q.queue_name
  from {schema}._private_job_queues as q
  where q.id = any(%(queue_ids)s::int[])
"""


def _returning_jobs(call: LiteralString) -> LiteralString:
    return "select j.* from " + call + " as j"


add_job = _returning_jobs(
    """{schema}.add_job(
      identifier => %(identifier)s,
      payload => %(payload)s::json,
      queue_name => %(queue_name)s,
      run_at => %(run_at)s,
      max_attempts => %(max_attempts)s,
      job_key => %(job_key)s,
      priority => %(priority)s,
      flags => %(flags)s::text[],
      job_key_mode => %(job_key_mode)s
    )"""
)

# The specs travel as one JSON array and become job_spec[] in the server.
add_jobs = _returning_jobs(
    """{schema}.add_jobs(
      array(
        select spec
        from json_populate_recordset(null::{schema}.job_spec, %(specs)s::json) as spec
      ),
      %(job_key_preserve_run_at)s
    )"""
)

remove_job = _returning_jobs("{schema}.remove_job(%(job_key)s)") + " where j.id is not null"

complete_jobs = _returning_jobs("{schema}.complete_jobs(%(job_ids)s::bigint[])")

permanently_fail_jobs = _returning_jobs(
    "{schema}.permanently_fail_jobs(%(job_ids)s::bigint[], %(error_message)s)"
)

reschedule_jobs = _returning_jobs(
    """{schema}.reschedule_jobs(
      %(job_ids)s::bigint[],
      run_at => %(run_at)s,
      priority => %(priority)s,
      attempts => %(attempts)s,
      max_attempts => %(max_attempts)s
    )"""
)

force_unlock_workers = "select {schema}.force_unlock_workers(%(worker_ids)s::text[])"

# Cleanup: forget task identifiers no job uses (except those to keep).
gc_task_identifiers = """
  delete from {schema}._private_tasks as t
  where not exists (select 1 from {schema}._private_jobs as j where j.task_id = t.id)
    and t.identifier <> all(%(keep)s::text[])
"""

# Cleanup: forget unlocked queues no job is in.
gc_job_queues = """
  delete from {schema}._private_job_queues as q
  where q.locked_at is null
    and not exists (select 1 from {schema}._private_jobs as j where j.job_queue_id = q.id)
"""

# Cleanup: delete permanently failed jobs that nobody holds.
delete_permafailed_jobs = """
  delete from {schema}._private_jobs as j
  where j.attempts >= j.max_attempts and j.locked_at is null
"""


@cache
def compose(statement: LiteralString, schema: str) -> sql.Composed:
    """Return ``statement`` with ``{schema}`` replaced by the quoted schema name.

    Cached: the worker composes the same few statements for every batch.
    """
    return sql.SQL(statement).format(schema=sql.Identifier(schema))


# --- The worker's own statements ---------------------------------------------

# Register the identifiers of the loaded tasks (without consuming identity
# values for known ones) and return their ids.
register_tasks = """
  with new as (
    insert into {schema}._private_tasks (identifier)
    select i from unnest(%(identifiers)s::text[]) as i
    where not exists (select 1 from {schema}._private_tasks as t where t.identifier = i)
    on conflict do nothing
    returning id, identifier
  )
  select id, identifier from new
  union
  select id, identifier from {schema}._private_tasks where identifier = any(%(identifiers)s::text[])
"""

# Lock up to %(limit)s runnable jobs for this pool: available, due, of our
# tasks, without forbidden flags, and either queue-less or in an available
# named queue. At most one job per named queue is taken, and its queue is
# locked in the same statement, so a named queue runs strictly one job at a
# time across every worker (Python or Node). Rows another worker is locking
# right now are skipped, not waited for.
get_jobs = """
  with candidates as (
    select j.id, j.job_queue_id, j.priority, j.run_at
    from {schema}._private_jobs as j
    where j.is_available = true
      and j.run_at <= now()
      and j.task_id = any(%(task_ids)s::int[])
      and (
        j.job_queue_id is null
        or j.job_queue_id in (
          select q.id from {schema}._private_job_queues as q where q.is_available = true
        )
      )
      and (%(forbidden_flags)s::text[] is null or j.flags is null
           or not (j.flags ?| %(forbidden_flags)s::text[]))
    -- Exactly the key of jobs_main_index, so this is an index scan that stops
    -- after %(limit)s rows (adding "id" would sort the whole table).
    order by j.priority, j.run_at
    limit %(limit)s
    for update of j skip locked
  ),
  queues as (
    select q.id, q.queue_name
    from {schema}._private_job_queues as q
    where q.id in (select c.job_queue_id from candidates as c)
      and q.is_available = true
    for update skip locked
  ),
  chosen as (
    select distinct on (c.job_queue_id, case when c.job_queue_id is null then c.id end)
      c.id, c.job_queue_id, queues.queue_name
    from candidates as c
    left join queues on queues.id = c.job_queue_id
    where c.job_queue_id is null or queues.id is not null
    order by c.job_queue_id, case when c.job_queue_id is null then c.id end,
             c.priority, c.run_at, c.id
  ),
  lock_queues as (
    update {schema}._private_job_queues as q
    set locked_at = now(), locked_by = %(pool_id)s
    from chosen
    where q.id = chosen.job_queue_id
  )
  update {schema}._private_jobs as j
  set attempts = j.attempts + 1, locked_at = now(), locked_by = %(pool_id)s
  from chosen
  where j.id = chosen.id
  returning j.id, j.job_queue_id, j.task_id, j.payload, j.priority, j.run_at, j.attempts,
    j.max_attempts, j.last_error, j.created_at, j.updated_at, j.key, j.locked_at,
    j.locked_by, j.revision, j.flags, j.is_available, chosen.queue_name
"""

# Success: delete the jobs and unlock their queues (where this pool holds them).
complete_batch = """
  with done as (
    delete from {schema}._private_jobs as j
    where j.id = any(%(job_ids)s::bigint[])
    returning j.job_queue_id
  )
  update {schema}._private_job_queues as q
  set locked_at = null, locked_by = null
  where q.id in (select done.job_queue_id from done) and q.locked_by = %(pool_id)s
"""

# Failure: record the error, back off exp(min(attempts, 10)) seconds, release
# the lock. A replacement payload (the failed items of a batch job) is stored.
# attempts is not touched: it was counted when the job was fetched.
fail_batch = """
  with failure as (
    select *
    from unnest(%(job_ids)s::bigint[], %(messages)s::text[], %(payloads)s::json[])
      as f(id, message, payload)
  ),
  failed as (
    update {schema}._private_jobs as j
    set last_error = failure.message,
        run_at = greatest(now(), j.run_at) + exp(least(j.attempts, 10)) * interval '1 second',
        payload = coalesce(failure.payload, j.payload),
        locked_at = null,
        locked_by = null,
        updated_at = now()
    from failure
    where j.id = failure.id and j.locked_by = %(pool_id)s
    returning j.job_queue_id
  )
  update {schema}._private_job_queues as q
  set locked_at = null, locked_by = null
  where q.id in (select failed.job_queue_id from failed) and q.locked_by = %(pool_id)s
"""

# Give back fetched jobs that never started (shutdown), restoring the attempt.
return_jobs = """
  with returned as (
    update {schema}._private_jobs as j
    set attempts = greatest(0, j.attempts - 1), locked_at = null, locked_by = null
    where j.id = any(%(job_ids)s::bigint[]) and j.locked_by = %(pool_id)s
    returning j.job_queue_id
  )
  update {schema}._private_job_queues as q
  set locked_at = null, locked_by = null
  where q.id in (select returned.job_queue_id from returned) and q.locked_by = %(pool_id)s
"""

# Free jobs and queues whose lock is older than 4 hours (a crashed worker).
release_stale_locks = """
  with jobs as (
    update {schema}._private_jobs as j
    set locked_at = null, locked_by = null, run_at = greatest(j.run_at, now())
    where j.locked_at < now() - %(lock_timeout)s::interval
    returning j.id
  ),
  queues as (
    update {schema}._private_job_queues as q
    set locked_at = null, locked_by = null
    where q.locked_at < now() - %(lock_timeout)s::interval
    returning q.id
  )
  select (select count(*) from jobs) as jobs, (select count(*) from queues) as queues
"""


# --- Cron ---------------------------------------------------------------------

known_crontabs = """
  select identifier, known_since, last_execution from {schema}._private_known_crontabs
"""

# New cron identifiers become known now; they are never backfilled.
register_crontabs = """
  insert into {schema}._private_known_crontabs (identifier, known_since)
  select i, %(now)s from unnest(%(identifiers)s::text[]) as i
  on conflict do nothing
"""

# Add the cron jobs due at %(ts)s. Each item's last_execution is advanced to
# ts first, and only the items whose row actually moved get a job: any number
# of workers (Python or Node) running the same crontab add each job once.
schedule_cron_jobs = """
  with specs as (
    select *
    from json_to_recordset(%(specs)s::json) as s(
      identifier text, task text, payload json, queue_name text, max_attempts smallint,
      priority smallint, job_key text, job_key_mode text
    )
  ),
  advanced as (
    insert into {schema}._private_known_crontabs as k (identifier, known_since, last_execution)
    select s.identifier, %(ts)s, %(ts)s from specs as s
    on conflict (identifier) do update set last_execution = excluded.last_execution
    where k.last_execution is null or k.last_execution < excluded.last_execution
    returning k.identifier
  )
  select ({schema}.add_job(
    s.task, s.payload, s.queue_name, %(ts)s, s.max_attempts, s.job_key, s.priority, null,
    s.job_key_mode
  )).id
  from specs as s
  join advanced on advanced.identifier = s.identifier
"""
