"""The statements of jobs' progress (``_private_py_job_progress``,
migrations/py/000027.sql): the worker's progress writer, the readers (a job's
record, ``wait_for_job``, the dashboard) and the pruner."""

from __future__ import annotations

# The progress writer's batch: each job's latest report since the last write
# (coalesced by the worker), one row per job, in one statement.
WRITE_PROGRESS = """
  insert into {schema}._private_py_job_progress as p (job_id, done, total, message, updated_at)
  select r.job_id, r.done, r.total, r.message, now()
  from unnest(
    %(job_ids)s::bigint[], %(dones)s::float8[], %(totals)s::float8[], %(messages)s::text[]
  ) as r(job_id, done, total, message)
  on conflict (job_id) do update
  set done = excluded.done, total = excluded.total, message = excluded.message,
    updated_at = excluded.updated_at
"""

# One job's progress (done, total, message, updated_at), or no row.
JOB_PROGRESS = """
  select p.done, p.total, p.message, p.updated_at
  from {schema}._private_py_job_progress as p
  where p.job_id = %(job_id)s::bigint
"""

# Delete, in one bounded batch, progress not updated for 7 days whose job has
# left the jobs table (its history, if any, is 7 days old too: a failed job's
# is kept that long, a success's a day by default); how many.
PRUNE_PROGRESS = """
  with pruned as (
    delete from {schema}._private_py_job_progress as p
    where p.job_id in (
      select o.job_id
      from {schema}._private_py_job_progress as o
      where o.updated_at < now() - interval '7 days'
        and not exists (select 1 from {schema}._private_jobs as j where j.id = o.job_id)
      order by o.updated_at
      limit %(limit)s
    )
    returning 1
  )
  select count(*) from pruned
"""
