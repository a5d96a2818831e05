"""The cron scheduler's statements (``_private_known_crontabs``), and the
dashboard's run of one cron item."""

from __future__ import annotations

KNOWN_CRONTABS = """
  select identifier, known_since, last_execution from {schema}._private_known_crontabs
"""

# New cron identifiers become known now; they are never backfilled.
REGISTER_CRONTABS = """
  insert into {schema}._private_known_crontabs (identifier, known_since)
  select i, %(now)s from unnest(%(identifiers)s::text[]) as i
  on conflict do nothing
"""

# Add the cron jobs due at %(ts)s. Each item's last_execution is advanced to
# ts first, and only the items whose row actually moved get a job: any number
# of workers (Python or Node) running the same crontab add each job once.
SCHEDULE_CRON_JOBS = """
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

# The scheduler's add (SCHEDULE_CRON_JOBS), for one item, without
# advancing its _private_known_crontabs row.
RUN_CRON_ITEM = """
  select j.id, j.run_at <= now() as due
  from {schema}.add_job(
    %(task)s::text, %(payload)s::json, %(queue_name)s::text, %(run_at)s::timestamptz,
    %(max_attempts)s::int, %(job_key)s::text, %(priority)s::int, null::text[],
    %(job_key_mode)s::text
  ) as j
"""
