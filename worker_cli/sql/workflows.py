"""Workflows (migrations/py/000026.sql; their functions in py/functions.sql):
adding one, reading one or a page of them, their steps' outcomes as the
worker records them, a running step's parents, cancel, retry, the repair
sweep and the pruning of finished ones."""

from __future__ import annotations

# Add a workflow: %(steps)s is a JSON array of {ref, spec, run_if, after}
# (worker_cli.jobs.workflow.Workflow.records). Its id.
ADD_WORKFLOW = """
  select {schema}.py_add_workflow(%(name)s, %(steps)s::jsonb)
"""

# A workflow's row (WORKFLOW_COLUMNS).
WORKFLOW = """
  select w.id, w.name, w.state, w.steps, w.steps_left, w.succeeded, w.failed, w.cancelled,
    w.skipped, w.error, w.cancel_requested_at, w.cancel_reason, w.created_at, w.finished_at
  from {schema}._private_py_workflows as w
  where w.id = %(workflow_id)s::bigint
"""

# Its steps, in the order they were added (STEP_COLUMNS): a step with a job
# has its job's live state word (py_job_state) while the job is there; one
# whose job is gone before its outcome was recorded reads 'unknown' until the
# repair sweep records it.
WORKFLOW_STEPS = """
  select s.ref,
    case when s.state <> 'queued' then s.state
      when j.id is null then 'unknown'
      else {schema}.py_job_state(j.locked_at, j.attempts, j.max_attempts, j.run_at,
        case when j.locked_at is null and j.attempts < j.max_attempts
          then {schema}.py_paused_by(j.task_id, j.job_queue_id) end)
    end,
    s.task_identifier, s.run_if, s.job_id, s.result, coalesce(s.error, j.last_error),
    coalesce(
      (select array_agg(p.ref order by p.position)
       from {schema}._private_py_workflow_edges as e
       join {schema}._private_py_workflow_steps as p on p.id = e.parent_id
       where e.child_id = s.id),
      '{{}}'),
    s.retries, s.created_at, s.queued_at, s.finished_at
  from {schema}._private_py_workflow_steps as s
  left join {schema}._private_jobs as j on j.id = s.job_id and s.state = 'queued'
  where s.workflow_id = %(workflow_id)s::bigint
  order by s.position
"""

# A page of workflows, newest first (WORKFLOW_COLUMNS), of one state or any.
LIST_WORKFLOWS = """
  select w.id, w.name, w.state, w.steps, w.steps_left, w.succeeded, w.failed, w.cancelled,
    w.skipped, w.error, w.cancel_requested_at, w.cancel_reason, w.created_at, w.finished_at
  from {schema}._private_py_workflows as w
  where (%(state)s::text is null or w.state = %(state)s::text)
    and (%(before)s::bigint is null or w.id < %(before)s::bigint)
  order by w.id desc
  limit %(limit)s
"""

# Lock the workflows of these step jobs (before their job rows: the
# completer's failures, see py_workflow_lock).
LOCK_WORKFLOWS = "select {schema}.py_workflow_lock(%(job_ids)s::bigint[])"

# The steps of these jobs succeeded with these results (JSON text; null:
# None or not kept): recorded and their workflows advanced, in the
# completer's transaction, before their jobs are deleted.
SETTLE_SUCCEEDED = """
  select {schema}.py_workflow_settle(%(job_ids)s::bigint[], %(results)s::json[])
"""

# The steps of these jobs ended some other way (failed for good, cancelled) or
# not yet (retried): read from their rows, after the failure statements.
SETTLE = "select {schema}.py_workflow_settle(%(job_ids)s::bigint[])"

# What a fetched step job's task sees (helpers.parents, helpers.workflow_id),
# for a batch of step jobs in one statement: each job's workflow and ref, and
# each of its parents' ref, state, result (JSON text: the fetch connection
# reads json raw) and error (none: a root step).
STEP_CONTEXTS = """
  select s.job_id, s.workflow_id, s.ref, p.ref, p.state, p.result::text, p.error
  from {schema}._private_py_workflow_steps as s
  left join {schema}._private_py_workflow_edges as e on e.child_id = s.id
  left join {schema}._private_py_workflow_steps as p on p.id = e.parent_id
  where s.job_id = any(%(job_ids)b::bigint[])
"""

# Dynamic fan-out (helpers.add_steps): the number of steps added.
EXTEND_WORKFLOW = """
  select {schema}.py_workflow_extend(
    %(workflow_id)s::bigint, %(from_ref)s, %(steps)s::jsonb, %(hold_dependents)s
  )
"""

CANCEL_WORKFLOW = "select {schema}.py_cancel_workflow(%(workflow_id)s::bigint, %(reason)s)"

RETRY_WORKFLOW = "select {schema}.py_retry_workflow(%(workflow_id)s::bigint)"

# The repair sweep: steps whose job ended unseen (a Node worker, an admin
# function); how many it recorded.
REPAIR_WORKFLOWS = "select {schema}.py_workflow_repair(%(max_steps)s)"

# Delete up to %(max_rows)s workflows that finished in %(state)s longer than
# %(keep)s ago (their steps and links go with them); how many.
PRUNE_WORKFLOWS = """
  with gone as (
    delete from {schema}._private_py_workflows as w
    where w.id in (
      select o.id from {schema}._private_py_workflows as o
      where o.state = %(state)s and o.finished_at < now() - %(keep)s::interval
      order by o.finished_at
      limit %(max_rows)s
    )
    returning 1
  )
  select count(*) from gone
"""
