"""The worker's side of trace contexts (``_private_py_job_trace_contexts``,
migrations/py/000006.sql; :class:`worker_cli.client.trace_context.JobContexts`);
the adding side is :mod:`worker_cli.sql.carried`."""

from __future__ import annotations

# The carriers of the jobs a fetch locked, and the rows of the jobs that
# succeeded since the previous fetch deleted (other ids: the fetched jobs are
# not done). Primary-key lookups only.
READ_CONTEXTS = """
  with done as (
    delete from {schema}._private_py_job_trace_contexts
    where job_id = any(%(done)s::bigint[])
  )
  select c.job_id, c.context
  from {schema}._private_py_job_trace_contexts as c
  where c.job_id = any(%(ids)s::bigint[])
"""

# Rows whose job is gone, a bounded number at a time. A row is written in
# the same statement as its job, so one without a job row is left over.
COLLECT_CONTEXTS = """
  delete from {schema}._private_py_job_trace_contexts as c
  where c.job_id in (
    select o.job_id from {schema}._private_py_job_trace_contexts as o
    where not exists (select 1 from {schema}._private_jobs as j where j.id = o.job_id)
    limit %(limit)s
  )
"""
