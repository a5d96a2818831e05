"""The metrics' workflows by state (:mod:`worker_cli.observe.queue_depth`
reads it with the queue depth, in the same cached transaction)."""

from __future__ import annotations

# The running workflows, counted up to %(cap)s through their partial index
# (_private_py_workflows_running: an index-only scan that stops there); then
# the workflows that finished in the last day, by state, among the %(cap)s
# that finished last (_private_py_workflows_finished_at, backward, from now:
# at most %(cap)s entries read). One row per state that has any.
WORKFLOWS_BY_STATE = """
  select 'running' as state, count(*)::bigint as workflows
  from (
    select 1 from {schema}._private_py_workflows as w
    where w.state = 'running'
    limit %(cap)s
  ) as r
  union all
  select f.state, count(*)::bigint
  from (
    select w.state from {schema}._private_py_workflows as w
    where w.state <> 'running' and w.finished_at > now() - interval '1 day'
    order by w.finished_at desc
    limit %(cap)s
  ) as f
  group by f.state
"""
