"""The SQL statements this package sends, each named after what it does.

Every statement is a template over the schema name; :func:`compose` turns it
into a ``psycopg.sql.Composed`` with the name quoted by ``sql.Identifier``.
Schema DDL lives in ``migrations/*.sql``, not here.
"""

from __future__ import annotations

from functools import cache
from typing import LiteralString

from psycopg import sql

__all__ = ["JOB_COLUMNS", "UNIQUE_RESULT_COLUMNS", "compose"]

# The columns of a job row, in this order, as every statement returning jobs
# selects them: the first fields of job.Job, which reads them by position.
JOB_COLUMNS: tuple[LiteralString, ...] = (
    "id",
    "job_queue_id",
    "task_id",
    "payload",
    "priority",
    "run_at",
    "attempts",
    "max_attempts",
    "last_error",
    "created_at",
    "updated_at",
    "key",
    "locked_at",
    "locked_by",
    "revision",
    "flags",
    "is_available",
)


def _job_columns(row: LiteralString) -> LiteralString:
    """The select list of :data:`JOB_COLUMNS`, taken from ``row`` (an alias or a
    parenthesised composite value)."""
    return ", ".join(row + "." + column for column in JOB_COLUMNS)


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
    return "select " + _job_columns("j") + " from " + call + " as j"


# add_job's arguments, shared by add_job and py_add_job (add_unique_job).
_ADD_JOB_ARGUMENTS = """
      identifier => %(identifier)s,
      payload => %(payload)s::json,
      queue_name => %(queue_name)s,
      run_at => %(run_at)s,
      max_attempts => %(max_attempts)s,
      job_key => %(job_key)s,
      priority => %(priority)s,
      flags => %(flags)s::text[],
      job_key_mode => %(job_key_mode)s"""

add_job = _returning_jobs("{schema}.add_job(" + _ADD_JOB_ARGUMENTS + "\n    )")

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
# Arrays of job ids are sent in binary (%(job_ids)b): psycopg dumps a list of
# ints about three times faster that way than as text.

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

# Lock up to %(limit)s runnable jobs of our tasks for this pool, at most one
# per named queue, and return them with their queue names and their own
# timeouts. The statement is the function py_fetch_jobs
# (migrations/py/000009.sql), for its plan settings.
get_jobs = """
  select * from {schema}.py_fetch_jobs(
    %(task_ids)s::int[], %(forbidden_flags)s::text[], %(limit)s::int, %(pool_id)s::text
  )
"""

# The same on the worker's clock (use_local_time): %(now)s replaces the
# database's now().
get_jobs_at = """
  select * from {schema}.py_fetch_jobs(
    %(task_ids)s::int[], %(forbidden_flags)s::text[], %(limit)s::int, %(pool_id)s::text,
    %(now)s::timestamptz
  )
"""

# The fetch connection's session: job timestamps come in UTC (psycopg loads
# those several times faster than a named zone's), and the backend's start
# time, which with its pid names this session in pg_stat_activity (see
# end_lost_fetch_session).
fetch_session = """
  select set_config('TimeZone', 'UTC', false), a.backend_start
  from pg_stat_activity as a
  where a.pid = pg_backend_pid()
"""

# A fetch whose reply was lost (the connection dropped after the statement was
# sent) may have committed or not, or may still be running. Its session is
# ended first (it is this pool's own, identified by pid and start time, so a
# reused pid is never touched); once it is gone from pg_stat_activity, its
# transaction has ended one way or the other.
end_lost_fetch_session = """
  select pg_terminate_backend(a.pid)
  from pg_stat_activity as a
  where a.pid = %(pid)s and a.backend_start = %(backend_start)s
"""

lost_fetch_session_gone = """
  select not exists (
    select 1 from pg_stat_activity as a
    where a.pid = %(pid)s and a.backend_start = %(backend_start)s
  )
"""

# Then the jobs locked by this pool that it does not know about are the ones
# that fetch locked: returned in get_jobs' columns, to be run (their named
# queues are locked by this pool too). Not index-backed (locked_by has no
# index), but only ever sent after a lost reply.
lost_fetch_jobs = """
  select j.id, j.job_queue_id, j.task_id, j.payload, j.priority, j.run_at, j.attempts,
    j.max_attempts, j.last_error, j.created_at, j.updated_at, j.key, j.locked_at,
    j.locked_by, j.revision, j.flags, j.is_available, q.queue_name, o.timeout
  from {schema}._private_jobs as j
  left join {schema}._private_job_queues as q on q.id = j.job_queue_id
  left join {schema}._private_py_job_options as o on o.job_id = j.id
  where j.locked_by = %(pool_id)s and j.id <> all(%(known_ids)s::bigint[])
  order by j.priority, j.run_at, j.id
"""

# --- Waiters (migrations/py/000007.sql, _private_py_job_options) ---------------
# The result statements below end with one NOTIFY per batch, on the channel
# "<schema>:py:finished" (%(channel)s, see lifecycle.finished_channel), listing
# the ids of the batch's jobs someone waits for (notify_on_finish), at most
# 300 a notification (a payload must stay under 8000 bytes: 300 ids of 19
# digits and a comma are 6000). Jobs nobody waits for send nothing: the
# options table is read through its primary key with the batch's ids, and it
# is usually empty.

# A statement's "finished" CTE (job_id, notify_on_finish) becomes its NOTIFYs:
# the ids of the jobs waited for, gathered in one array, sent 300 at a time.
# With none, the aggregate is null and no notification is sent (no sort, no
# window: an aggregate of nothing costs a few microseconds).
notify_waiters = """
  select pg_notify(%(channel)s, array_to_string(w.ids[i:i + 299], ','))
  from (
    select array_agg(f.job_id) as ids from finished as f where f.notify_on_finish
  ) as w
  cross join generate_series(1, coalesce(cardinality(w.ids), 0), 300) as i
"""

# The options of the jobs a success deleted (the "done" CTE) are deleted with
# them; those of jobs someone waits for are notified.
finished_options = """
  finished as (
    delete from {schema}._private_py_job_options as o
    where o.job_id = any(%(job_ids)b::bigint[])
    returning o.job_id, o.notify_on_finish
  )"""


# The queues of the jobs a success deleted (the "done" CTE) are unlocked,
# where this pool holds them. A queue is unlocked only for a job whose row
# this pool still held: after a failover to a standby that had not received
# a fetch, a job's row may be unlocked (or the queue held for another of this
# pool's jobs), and unlocking its queue would let a second job of the queue
# start beside that one.
unlock_queues = """
  unlocked as (
    update {schema}._private_job_queues as q
    set locked_at = null, locked_by = null
    where q.id in (select done.job_queue_id from done where done.locked_by = %(pool_id)s)
      and q.locked_by = %(pool_id)s
  ),"""

# Success: delete the jobs and unlock their queues (unlock_queues).
complete_batch = (
    """
  with done as (
    delete from {schema}._private_jobs as j
    where j.id = any(%(job_ids)b::bigint[])
    returning j.id, j.job_queue_id, j.locked_by
  ),"""
    + unlock_queues
    + finished_options
    + notify_waiters
)

# The same for a batch in which no job is in a named queue (as fetched: a
# locked job's queue never changes), the common case: without the queues'
# update, about 0.3 µs of server CPU less per job.
complete_batch_without_queues = (
    """
  with done as (
    delete from {schema}._private_jobs as j
    where j.id = any(%(job_ids)b::bigint[])
  ),"""
    + finished_options
    + notify_waiters
)


# Free jobs and queues whose lock is older than 4 hours (a crashed worker).
# run_at is kept, as force_unlock_workers keeps it: a released job of a named
# queue is still the first of its queue, and runs before the jobs behind it.
# %(now)s: the worker's clock with use_local_time, else null (the database's).
release_stale_locks = """
  with jobs as (
    update {schema}._private_jobs as j
    set locked_at = null, locked_by = null
    where j.locked_at < coalesce(%(now)s::timestamptz, now()) - %(lock_timeout)s::interval
    returning j.id
  ),
  queues as (
    update {schema}._private_job_queues as q
    set locked_at = null, locked_by = null
    where q.locked_at < coalesce(%(now)s::timestamptz, now()) - %(lock_timeout)s::interval
    returning q.id
  )
  select (select count(*) from jobs) as jobs, (select count(*) from queues) as queues
"""

# The listener's channels: add_job notifies "jobs:insert"; a migration
# notifies "worker:migrate" (breaking ones stop the pool).
listen_jobs_insert = 'listen "jobs:insert"'
listen_worker_migrate = 'listen "worker:migrate"'


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


# --- Unique jobs (migrations/py/000001.sql) -------------------------------------
#
# None of the worker's statements above knows about these: jobs added without
# a rule cost nothing more.


# The first columns of a unique add's result rows; the existing or new job's
# JOB_COLUMNS follow (all null when the existing job has already succeeded).
UNIQUE_RESULT_COLUMNS: tuple[LiteralString, ...] = (
    "job_id",
    "conflict",
    "conflict_state",
    "replaced",
)


def _returning_unique_results(call: LiteralString, trailing: LiteralString = "") -> LiteralString:
    result = ", ".join("r." + column for column in UNIQUE_RESULT_COLUMNS)
    return (
        "select " + result + ", " + _job_columns("(r.job)") + trailing + " from " + call + " as r"
    )


add_unique_job = _returning_unique_results(
    "{schema}.py_add_job("
    + _ADD_JOB_ARGUMENTS
    + """,
      unique_rule => %(unique_rule)s::jsonb
    )"""
)

# One result per spec, and its spec_index last (after the job's columns): the
# caller orders by it (order by spec_index), after wrapping the statement if it
# carries a trace context (trace_context.carry).
add_unique_jobs = _returning_unique_results(
    """{schema}.py_add_jobs(
      array(
        select spec
        from json_populate_recordset(null::{schema}.job_spec, %(specs)s::json) as spec
      ),
      %(unique_rules)s::jsonb,
      %(job_key_preserve_run_at)s
    )""",
    ", r.spec_index",
)

# remove_job, and the uniqueness lock its job held: a job an administrator
# removed does not block duplicates.
remove_job_releasing_unique_lock = (
    """
  with removed as (
    select j.* from {schema}.remove_job(%(job_key)s) as j where j.id is not null
  ),
  released as (
    delete from {schema}._private_py_unique_locks as l
    where l.job_id in (select removed.id from removed)
  )
  select """
    + _job_columns("removed")
    + """ from removed
"""
)

# DELETE_PERMAFAILED_JOBS, and the uniqueness locks of the deleted jobs: a
# job row that disappears otherwise looks like a success.
delete_permafailed_jobs_releasing_unique_locks = """
  with deleted as (
    delete from {schema}._private_jobs as j
    where j.attempts >= j.max_attempts and j.locked_at is null
    returning j.id
  )
  delete from {schema}._private_py_unique_locks as l
  where l.job_id in (select deleted.id from deleted)
"""

# Delete up to %(max_rows)s uniqueness locks that can never block again;
# returns how many.
gc_unique_locks = "select {schema}.py_gc_unique_locks(%(max_rows)s)"

# --- Schema probing (worker_cli/schema.py) ----------------------------------------

# Whether the schema has the unique-jobs table (Python migration 1); the schema
# name is a bound value here, as in status_installed.
unique_tables_installed = """
  select to_regclass(format('%%I._private_py_unique_locks', %(schema)s::text)) is not null
"""

# --- Migrations (worker_cli/migrate.py; the scripts themselves are files) --------

# Serialises the Python migrators of one schema, until the transaction ends.
migration_lock = "select pg_advisory_xact_lock(%(namespace)s, hashtext(%(schema)s::text))"

# The latest revision and the latest breaking one (fails on a table older than
# graphile-worker 0.11, which has no "breaking" column).
migration_state = "select max(id), max(id) filter (where breaking) from {schema}.migrations"

migrations_recorded = "select exists (select 1 from {schema}.migrations)"

# Revisions 1-16 at once (base.sql), with Node's breaking flags.
record_base_migrations = """
  insert into {schema}.migrations (id, breaking)
  select n, n = any(%(breaking)s::int[]) from unnest(%(ids)s::int[]) as n
"""

migration_recorded = "select exists (select 1 from {schema}.migrations where id = %(id)s)"

record_migration = "insert into {schema}.migrations (id, breaking) values (%(id)s, %(breaking)s)"

py_migrations_recorded = "select id from {schema}._private_py_migrations"

py_migration_recorded = """
  select exists (select 1 from {schema}._private_py_migrations where id = %(id)s)
"""

record_py_migration = "insert into {schema}._private_py_migrations (id) values (%(id)s)"

# Tells listening workers (Node's too) that a revision was applied.
notify_migrated = "select pg_notify('worker:migrate', %(payload)s)"
