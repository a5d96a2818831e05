"""The ``cleanup`` tasks' statements (graphile-worker's GC_TASK_IDENTIFIERS,
GC_JOB_QUEUES, DELETE_PERMAFAILED_JOBS; GC_UNIQUE_LOCKS), and their forms
that keep the Python-only tables right."""

from __future__ import annotations

# Cleanup: forget task identifiers no job uses (except those to keep).
GC_TASK_IDENTIFIERS = """
  delete from {schema}._private_tasks as t
  where not exists (select 1 from {schema}._private_jobs as j where j.task_id = t.id)
    and t.identifier <> all(%(keep)s::text[])
"""

# Cleanup: forget unlocked queues no job is in.
GC_JOB_QUEUES = """
  delete from {schema}._private_job_queues as q
  where q.locked_at is null
    and not exists (select 1 from {schema}._private_jobs as j where j.job_queue_id = q.id)
"""

# Cleanup: delete permanently failed jobs that nobody holds.
DELETE_PERMAFAILED_JOBS = """
  delete from {schema}._private_jobs as j
  where j.attempts >= j.max_attempts and j.locked_at is null
"""

# DELETE_PERMAFAILED_JOBS, and the uniqueness locks of the deleted jobs: a
# job row that disappears otherwise looks like a success.
DELETE_PERMAFAILED_JOBS_RELEASING_UNIQUE_LOCKS = """
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
GC_UNIQUE_LOCKS = "select {schema}.py_gc_unique_locks(%(max_rows)s)"

# The cleanup's DELETE_PERMAFAILED_JOBS with the lifecycle installed: the
# permanently failed jobs are archived in the history (state failed, kept 7
# days) as they are deleted, and their uniqueness locks released. A job whose
# last attempt went past its timeout (last_error 'JobTimeout: ...', as the
# worker writes it) is recorded as timed out.
ARCHIVE_PERMAFAILED_JOBS = """
  with deleted as (
    delete from {schema}._private_jobs as j
    where j.attempts >= j.max_attempts and j.locked_at is null
    returning j.*
  ),
  archived as (
    insert into {schema}._private_py_job_history (
      job_id, state, task_identifier, queue_name, key, priority, attempts, max_attempts,
      revision, flags, last_error, created_at, run_at, finished_at, timed_out, expires_at
    )
    select d.id, 'failed', t.identifier, q.queue_name, d.key, d.priority, d.attempts,
      d.max_attempts, d.revision, d.flags, d.last_error, d.created_at, d.run_at, d.updated_at,
      coalesce(d.last_error like 'JobTimeout: %%', false), now() + interval '7 days'
    from deleted as d
    join {schema}._private_tasks as t on t.id = d.task_id
    left join {schema}._private_job_queues as q on q.id = d.job_queue_id
    on conflict (job_id) do nothing
    returning job_id, expires_at
  ),
  expiry as (
    insert into {schema}._private_py_job_history_expiry (expires_at, job_ids)
    select min(r.expires_at), array_agg(r.job_id)
    from (select s.job_id, s.expires_at, (row_number() over () - 1) / 1000 as chunk
          from archived as s) as r
    group by r.chunk
  )
  delete from {schema}._private_py_unique_locks as l
  where l.job_id in (select deleted.id from deleted)
"""
