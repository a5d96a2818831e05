-- Job lifecycle: history and results, cancel requests, per-job options, and
-- one state for any job id (Python-only; Node never reads these objects).
--
-- Nothing here is on Node's tables: no trigger, no foreign key. A Python pool
-- writes a finished job's history row in the same statement that deletes its
-- live row (the completer's batch); a job Node completes, or one an admin
-- function removes, leaves no history, and its state is 'unknown'. Job ids
-- are identity values and never reused, so a row here never meets a new job.

-- One row per finished job: succeeded (with its result), cancelled, or failed
-- (a permanently failed job archived by the cleanup). Retention is fixed when
-- the row is written (expires_at); expired rows are deleted in bounded
-- batches by whichever pool wins the pruning lock.
create table {{schema}}._private_py_job_history (
  job_id bigint primary key,
  state text not null check (state in ('succeeded', 'cancelled', 'failed')),
  task_identifier text not null,
  queue_name text,
  key text,
  priority smallint not null,
  attempts smallint not null,
  max_attempts smallint not null,
  revision int not null,
  flags jsonb,
  -- The task's return value, as JSON; null with result_error set when it
  -- could not be kept (too large, not JSON), null alone when it was None.
  result json,
  result_error text,
  last_error text,
  created_at timestamptz not null,
  run_at timestamptz not null,
  -- When its last attempt was locked (the job started).
  started_at timestamptz,
  finished_at timestamptz not null,
  -- The worker pool that finished it (null: cancelled while waiting).
  pool_id text,
  cancel_requested_at timestamptz,
  cancel_reason text,
  timed_out boolean not null default false,
  expires_at timestamptz not null
);
create index _private_py_job_history_expires_at
  on {{schema}}._private_py_job_history (expires_at);
alter table {{schema}}._private_py_job_history enable row level security;

-- Cancel requests of jobs that were running when cancelled: the pool running
-- the job is told (NOTIFY "<schema>:py:cancel", and a poll as the safety
-- net), and the job's outcome is recorded as cancelled (unless it succeeds).
create table {{schema}}._private_py_cancellations (
  job_id bigint primary key,
  requested_at timestamptz not null default now(),
  reason text,
  -- The pool holding the job's lock when the cancel was asked for.
  pool_id text
);
alter table {{schema}}._private_py_cancellations enable row level security;

-- Options of single jobs, written only when not the default (a timeout, a
-- waiter to notify when it finishes). Rows of jobs that are gone are deleted
-- with the trace contexts' (every 8-10 minutes).
create table {{schema}}._private_py_job_options (
  job_id bigint primary key,
  timeout interval,
  notify_on_finish boolean not null default false,
  added_at timestamptz not null default now()
);
alter table {{schema}}._private_py_job_options enable row level security;

-- Functions live in functions.sql (one definition each, applied after the
-- last pending revision): this revision added py_job_status.
