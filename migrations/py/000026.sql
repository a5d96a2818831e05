-- Workflows (issue 45): jobs that wait for other jobs, with their results
-- passed down.
--
-- A workflow is a graph of steps. A step becomes a job (through add_jobs)
-- only when it may run, so a waiting step is no row of Node's table: no Node
-- worker, admin function or job_key can start it early. Each step keeps its
-- own outcome and result here, so the history's retention cannot break a
-- running workflow. A step's job carries the flag "py:workflow" (a Python
-- worker tells it by that, with no extra read); the step knows its job by
-- job_id.
--
-- Locks: a workflow's row is locked before any of its steps' job rows
-- (py_workflow_lock), by every function that changes its steps: two
-- completers finishing two parents of one child take turns, and nothing
-- that ends a step's job can deadlock with another.

-- One row per workflow, its counts kept by the functions that end its steps
-- (a page of workflows never counts steps).
--   state        running until every step is final; then failed if a step
--                failed, else cancelled if one was cancelled, else succeeded
--   steps_left   steps not final yet (blocked or with a job)
create table {{schema}}._private_py_workflows (
  id bigint primary key generated always as identity,
  name text,
  state text not null default 'running'
    check (state in ('running', 'succeeded', 'failed', 'cancelled')),
  steps int not null,
  steps_left int not null,
  succeeded int not null default 0,
  failed int not null default 0,
  cancelled int not null default 0,
  skipped int not null default 0,
  -- Asked to cancel (cancel_workflow): no step of it starts any more.
  cancel_requested_at timestamptz,
  cancel_reason text,
  -- Why it could not advance, if its resolution failed (it ends failed).
  error text,
  created_at timestamptz not null default now(),
  finished_at timestamptz
);
create index _private_py_workflows_running
  on {{schema}}._private_py_workflows (id) where state = 'running';
-- The pruning of finished workflows (with the history's retention of their
-- final state), and the lists of finished ones.
create index _private_py_workflows_finished_at
  on {{schema}}._private_py_workflows (finished_at) where state <> 'running';
alter table {{schema}}._private_py_workflows enable row level security;

-- One row per step. Steps and links are found by id (a single-column key):
-- a workflow's steps are added faster than statistics are gathered, and a
-- plan that looked them up by (workflow_id, ref) with a stale estimate of one
-- step per workflow read the whole workflow for each step (13 s for 2,000).
--   spec         the job it becomes: a job_spec record as JSON (identifier,
--                payload, queue_name, run_at, max_attempts, priority, flags)
--                and its timeout in seconds, if it has one
--   run_if       succeeded (every parent succeeded), finished (whatever they
--                ended as), failed (at least one failed or was cancelled)
--   state        blocked (no job yet), queued (its job exists: the job's own
--                state says more), succeeded, failed, cancelled, skipped
--   parents_*    how many parents it has, how many are not final yet, and
--                how many ended failed or cancelled, and skipped
create table {{schema}}._private_py_workflow_steps (
  id bigint primary key generated always as identity,
  workflow_id bigint not null
    references {{schema}}._private_py_workflows (id) on delete cascade,
  ref text not null,
  -- Its place in the order the steps were added.
  position int not null,
  task_identifier text not null,
  spec jsonb not null,
  run_if text not null check (run_if in ('succeeded', 'finished', 'failed')),
  state text not null default 'blocked'
    check (state in ('blocked', 'queued', 'succeeded', 'failed', 'cancelled', 'skipped')),
  parents int not null default 0,
  parents_left int not null default 0,
  parents_failed int not null default 0,
  parents_skipped int not null default 0,
  job_id bigint,
  -- What it returned (succeeded), or why it failed, was cancelled or skipped.
  result json,
  error text,
  -- How many times retry_workflow ran it again.
  retries int not null default 0,
  created_at timestamptz not null default now(),
  queued_at timestamptz,
  finished_at timestamptz,
  unique (workflow_id, ref)
);
create unique index _private_py_workflow_steps_job_id
  on {{schema}}._private_py_workflow_steps (job_id);
-- A workflow's steps in the order they were added (its pages).
create index _private_py_workflow_steps_position
  on {{schema}}._private_py_workflow_steps (workflow_id, position);
-- The steps with a job: what the repair sweep looks at.
create index _private_py_workflow_steps_queued
  on {{schema}}._private_py_workflow_steps (job_id) where state = 'queued';
alter table {{schema}}._private_py_workflow_steps enable row level security;

-- One row per link: the step child_id waits for the step parent_id (of the
-- same workflow).
create table {{schema}}._private_py_workflow_edges (
  parent_id bigint not null
    references {{schema}}._private_py_workflow_steps (id) on delete cascade,
  child_id bigint not null
    references {{schema}}._private_py_workflow_steps (id) on delete cascade,
  primary key (parent_id, child_id)
);
create index _private_py_workflow_edges_child
  on {{schema}}._private_py_workflow_edges (child_id);
alter table {{schema}}._private_py_workflow_edges enable row level security;

-- Functions (py/functions.sql): added py_workflow_lock, py_workflow_insert,
-- py_add_workflow,
-- py_workflow_start, py_workflow_advance, py_workflow_settle, py_workflow_break,
-- py_workflow_repair, py_workflow_extend, py_cancel_workflow,
-- py_retry_workflow; changed py_cancel_jobs (a cancelled step's workflow
-- advances in the same transaction).
