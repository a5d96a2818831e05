"""The metrics' schedules in the database: when each last fired, and its lag
(:mod:`worker_cli.observe.prometheus` reads it with the queue depth, as
often: at most once per cache time, whatever the scrapes)."""

from __future__ import annotations

# The schedules (migrations/py/000027.sql: one small row each), the first
# %(limit)s by identifier (their primary key): the unix time their last job
# was added (last_run_at), and how long after its instant that was
# (last_run_at - last_execution, the lag); both null until it first fires.
SCHEDULE_RUNS = """
  select s.identifier, extract(epoch from s.last_run_at)::float8 as last_run_at,
    case when s.last_run_at is not null and s.last_execution is not null
      then greatest(extract(epoch from s.last_run_at - s.last_execution), 0)::float8
    end as lag
  from {schema}._private_py_schedules as s
  order by s.identifier
  limit %(limit)s
"""
