"""The statements of schedules in the database (``_private_py_schedules``,
migrations/py/000027.sql): the utilities' add, remove, pause, resume and list,
and the worker's read and fire. Every change notifies
``py_channel('schedules')`` with the identifier, in its transaction: the
workers read the schedules again when it commits."""

from __future__ import annotations

_COLUMNS = """
  s.identifier, s.pattern, s.task_identifier, s.payload::text, s.tz, s.fill, s.queue_name,
  s.priority, s.max_attempts, s.job_key, s.paused, s.version, s.created_at, s.updated_at,
  s.known_since, s.last_execution, s.last_run_at
"""

# Whether a crontab item uses this identifier: one a Python or Node worker
# has recorded in _private_known_crontabs (add_schedule refuses it).
CRONTAB_IDENTIFIER = """
  select k.known_since
  from {schema}._private_known_crontabs as k
  where k.identifier = %(identifier)s::text
"""

# Add or replace a schedule. A replace keeps when it last fired (an instant
# never fires twice) and counts a version; one that resumes it moves
# known_since to now (the paused time is never backfilled).
UPSERT_SCHEDULE = (
    """
  with saved as (
    insert into {schema}._private_py_schedules as s (
      identifier, pattern, task_identifier, payload, tz, fill, queue_name, priority,
      max_attempts, job_key, paused
    )
    values (
      %(identifier)s::text, %(pattern)s::text, %(task_identifier)s::text,
      %(payload)s::json, %(tz)s::text, %(fill)s::interval, %(queue_name)s::text,
      %(priority)s::smallint, %(max_attempts)s::smallint, %(job_key)s::text, %(paused)s::bool
    )
    on conflict (identifier) do update
    set pattern = excluded.pattern, task_identifier = excluded.task_identifier,
      payload = excluded.payload, tz = excluded.tz, fill = excluded.fill,
      queue_name = excluded.queue_name, priority = excluded.priority,
      max_attempts = excluded.max_attempts, job_key = excluded.job_key,
      paused = excluded.paused, version = s.version + 1, updated_at = now(),
      known_since = case when s.paused and not excluded.paused then now() else s.known_since end
    returning """
    + _COLUMNS
    + """
  )
  select """
    + _COLUMNS
    + """, pg_notify({schema}.py_channel('schedules'), s.identifier)::text
  from saved as s
"""
)

# Remove a schedule: the identifier, or no row.
REMOVE_SCHEDULE = """
  with removed as (
    delete from {schema}._private_py_schedules as s
    where s.identifier = %(identifier)s::text
    returning s.identifier
  )
  select r.identifier, pg_notify({schema}.py_channel('schedules'), r.identifier)::text
  from removed as r
"""

# Pause or resume a schedule (%(paused)s); a resume moves known_since to now,
# so the paused time is never backfilled. The schedule, or no row.
SET_PAUSED = (
    """
  with changed as (
    update {schema}._private_py_schedules as s
    set paused = %(paused)s::bool,
      version = case when s.paused = %(paused)s::bool then s.version else s.version + 1 end,
      updated_at = case when s.paused = %(paused)s::bool then s.updated_at else now() end,
      known_since = case when s.paused and not %(paused)s::bool then now() else s.known_since end
    where s.identifier = %(identifier)s::text
    returning """
    + _COLUMNS
    + """
  )
  select """
    + _COLUMNS
    + """, pg_notify({schema}.py_channel('schedules'), s.identifier)::text
  from changed as s
"""
)

# Every schedule, by identifier (the utilities' list, the worker's read, the
# dashboard and the metrics). Each statement returning schedules gives the
# payload as its text, parsed schedule by schedule (Schedule.from_row): one
# whose payload Python cannot read (5,000 deep, 5,000 digits) is shown so,
# and skipped by the worker, alone.
LIST_SCHEDULES = (
    """
  select """
    + _COLUMNS
    + """
  from {schema}._private_py_schedules as s
  order by s.identifier
"""
)

# One schedule by identifier.
SCHEDULE = (
    """
  select """
    + _COLUMNS
    + """
  from {schema}._private_py_schedules as s
  where s.identifier = %(identifier)s::text
"""
)

# The crontab items among %(identifiers)s that are also database schedules
# (a worker refuses to start with them).
SCHEDULED_IDENTIFIERS = """
  select s.identifier
  from {schema}._private_py_schedules as s
  where s.identifier = any(%(identifiers)s::text[])
  order by s.identifier
"""

# Add the jobs of the schedules due at %(ts)s (%(specs)s: identifier, the
# version the worker read, the payload with its _cron). A schedule's
# last_execution is advanced to ts first, and only those whose row moved get
# a job: any number of workers add each instant's job once. A schedule
# changed since the worker read it (another version), paused, removed, or
# newer than ts (known_since) does not fire.
FIRE_SCHEDULES = """
  with specs as (
    select *
    from json_to_recordset(%(specs)s::json) as x(identifier text, version bigint, payload json)
  ),
  fired as (
    update {schema}._private_py_schedules as s
    set last_execution = %(ts)s::timestamptz, last_run_at = now()
    from specs
    where s.identifier = specs.identifier and s.version = specs.version and not s.paused
      and s.known_since <= %(ts)s::timestamptz
      and (s.last_execution is null or s.last_execution < %(ts)s::timestamptz)
    returning s.identifier, s.task_identifier, s.queue_name, s.max_attempts, s.job_key,
      s.priority, specs.payload
  )
  select f.identifier, ({schema}.add_job(
    f.task_identifier, f.payload, f.queue_name, %(ts)s::timestamptz, f.max_attempts, f.job_key,
    f.priority, null, null
  )).id
  from fired as f
"""
