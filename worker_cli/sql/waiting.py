"""Waiting for jobs (``wait_for_job``; the options table of
migrations/py/000007.sql): a waiter's interest, and the sweep of left-over
options rows."""

from __future__ import annotations

# A waiter's interest in a job (wait_for_job): its id gets notify_on_finish,
# if the job is visible (else nothing is written: the waiter tries again at
# its next poll). Returns 1 when the job is visible, 0 when not.
REGISTER_WAITER = """
  with job as (
    select j.id from {schema}._private_jobs as j where j.id = %(job_id)s
  ),
  registered as (
    insert into {schema}._private_py_job_options as o (job_id, notify_on_finish)
    select job.id, true from job
    on conflict (job_id) do update set notify_on_finish = true
    where not o.notify_on_finish
  )
  select count(*) from job
"""

# Options rows whose job is gone, a bounded number at a time (the sweeper,
# every 8-10 minutes). A success deletes its job's options in its own
# statement; what is left comes from jobs finished otherwise (a Node worker,
# an admin function) or a waiter registering as its job finished. Rows
# younger than 10 minutes are kept: their job may be in a transaction not
# committed yet.
COLLECT_JOB_OPTIONS = """
  delete from {schema}._private_py_job_options as o
  where o.job_id in (
    select x.job_id
    from {schema}._private_py_job_options as x
    where x.added_at < now() - interval '10 minutes'
      and not exists (select 1 from {schema}._private_jobs as j where j.id = x.job_id)
    limit %(limit)s
  )
"""
