"""The dashboard's statements about workflows (its Workflows pages), and the
index each one reads; the rest of its statements are in
:mod:`worker_cli.sql.dashboard`, under the same rule: every statement is
bounded, whatever the tables hold, and none scans a table sequentially.
``tests/dashboard/test_dashboard_queries.py`` EXPLAINs each one on 50,000
workflows, one of them of 10,000 steps, and checks the index named here.

The indexes read (migrations/py/000026.sql):

- ``_private_py_workflows_pkey`` (``id``): a workflow's page; the list's
  window of the newest workflows;
- ``_private_py_workflows_running`` (``id`` where ``state = 'running'``): the
  list of running workflows;
- ``_private_py_workflow_steps_position`` (``workflow_id, position``): a
  page of a workflow's steps, a range read in the order they were added;
- ``_private_py_workflow_edges_child`` (``child_id``): the links into the
  steps drawn;
- ``jobs_pkey1`` (``_private_jobs.id``): a step's job, for its live state.
"""

from __future__ import annotations

# The columns of a workflow as the pages show it.
_WORKFLOW_COLUMNS = """
    w.id, w.name, w.state, w.steps, w.steps_left, w.succeeded, w.failed, w.cancelled,
    w.skipped, left(w.error, %(cut)s) as error, w.cancel_requested_at,
    left(w.cancel_reason, %(cut)s) as cancel_reason, w.created_at, w.finished_at"""

# A page of the Workflows list, newest first, of one state or any, by keyset
# on id (below %(before)s). _private_py_workflows_pkey, backward: at most
# %(window)s workflows below the cursor are examined (`scanned`), whatever the
# filter, and up to %(limit)s of them that match are returned; `examined` and
# `lowest` say how far the window went, so the page can offer to search older
# ones when a rare state found fewer. The running ones have an index of their
# own: RUNNING_WORKFLOWS_PAGE.
WORKFLOWS_PAGE = (
    """
  with scanned as materialized (
    select w.id, w.state
    from {schema}._private_py_workflows as w
    where w.id < %(before)s::bigint
    order by w.id desc
    limit %(window)s
  ),
  window_end as (
    select count(*)::int as examined, min(s.id) as lowest from scanned as s
  ),
  shown as materialized (
    select s.id
    from scanned as s
    where %(state)s::text is null or s.state = %(state)s::text
    order by s.id desc
    limit %(limit)s
  )
  select e.examined, e.lowest, r.*
  from window_end as e
  left join lateral (
    select"""
    + _WORKFLOW_COLUMNS
    + """
    from shown as s
    join {schema}._private_py_workflows as w on w.id = s.id
    order by s.id desc
  ) as r on true
"""
)

# A page of the running workflows, newest first, below %(before)s:
# _private_py_workflows_running (the partial index of the running ones),
# backward, %(limit)s entries at most; exact, no window.
RUNNING_WORKFLOWS_PAGE = (
    """
  select"""
    + _WORKFLOW_COLUMNS
    + """
  from {schema}._private_py_workflows as w
  where w.state = 'running' and w.id < %(before)s::bigint
  order by w.id desc
  limit %(limit)s
"""
)

# One workflow, its error and cancel reason cut at %(cut)s characters
# (_private_py_workflows_pkey).
WORKFLOW = (
    """
  select"""
    + _WORKFLOW_COLUMNS
    + """
  from {schema}._private_py_workflows as w
  where w.id = %(id)s::bigint
"""
)

# Up to %(limit)s of a workflow's steps after position %(after)s, in the order
# they were added (positions count from 1), each with its id.
# _private_py_workflow_steps_position: a range read of %(limit)s steps in
# position order (`page`, materialized). A step with a job has its job's live
# state (py_job_state, with the pause holding it), read by id for each of the
# page's steps that has one (jobs_pkey1: a lateral subquery, kept one by
# `limit 1`, so the planner cannot make it a hash join over the jobs); one
# whose job is gone before its outcome was recorded reads 'unknown' until the
# repair sweep records it (as sql/workflows.py's WORKFLOW_STEPS). `error` is
# the first line of its error (or of its job's last error while it has a
# job), at most 200 characters.
WORKFLOW_STEPS_PAGE = """
  with page as materialized (
    select s.id, s.position, s.ref, s.state, s.task_identifier, s.run_if, s.job_id, s.parents,
      s.retries, left(s.error, 2000) as error, s.queued_at, s.finished_at
    from {schema}._private_py_workflow_steps as s
    where s.workflow_id = %(workflow_id)s::bigint and s.position > %(after)s::int
    order by s.position
    limit %(limit)s
  )
  select p.id, p.position, p.ref,
    case when p.state <> 'queued' then p.state else coalesce(j.state, 'unknown') end as state,
    p.task_identifier, p.run_if, p.job_id, p.parents, p.retries,
    left(split_part(coalesce(p.error, j.last_error), chr(10), 1), 200) as error,
    p.queued_at, p.finished_at
  from page as p
  left join lateral (
    select
      {schema}.py_job_state(j.locked_at, j.attempts, j.max_attempts, j.run_at,
        case when j.locked_at is null and j.attempts < j.max_attempts
          then {schema}.py_paused_by(j.task_id, j.job_queue_id) end) as state,
      left(j.last_error, 2000) as last_error
    from {schema}._private_jobs as j
    where j.id = p.job_id and p.state = 'queued'
    limit 1
  ) as j on true
  order by p.position
"""

# The links into the steps %(ids)s whose parent is one of them too: the
# edges among the steps drawn. _private_py_workflow_edges_child, entered by
# child_id, once per step: at most %(limit)s links into those steps are read
# in all (`incoming`), so a step waiting for thousands of others costs no
# more; `read` says how many were, so that the page can say when some may be
# left out (one row with null ids when none is among the steps).
WORKFLOW_EDGES = """
  with incoming as materialized (
    select e.parent_id, e.child_id
    from unnest(%(ids)s::bigint[]) as c (id)
    cross join lateral (
      select e.parent_id, e.child_id
      from {schema}._private_py_workflow_edges as e
      where e.child_id = c.id
      limit %(limit)s
    ) as e
    limit %(limit)s
  ),
  counted as (
    select count(*)::int as read from incoming
  )
  select c.read, i.parent_id, i.child_id
  from counted as c
  left join incoming as i on i.parent_id = any(%(ids)s::bigint[])
"""
