-- Every attempt's error (Python-only; Node never reads these objects).
--
-- graphile-worker keeps one error per job (last_error): each failed attempt's
-- replaces the one before. A Python pool's failure statement (and its sweep
-- of a dead pool's jobs) also appends the attempt's error here, in the same
-- statement, so an operator sees every attempt's error, and the dashboard
-- counts retried attempts per minute from it (recorded nowhere else). Keyed
-- by job id, no foreign key: the job row may be deleted, archived or pruned
-- independently. Only failures write here: a job that
-- succeeds costs nothing. Rows are kept 7 days (as a failed job's history),
-- pruned in bounded batches from the oldest id (the primary key) by the
-- history pruner. Failures of jobs run by Node workers are not recorded.
-- Only job_id is required: a row the failure statement could not complete
-- must never make it fail (it writes the outcomes of a whole batch).
create table {{schema}}._private_py_job_errors (
  id bigint generated always as identity primary key,
  job_id bigint not null,
  task_identifier text,
  attempt int,
  failed_at timestamptz not null default now(),
  error text,
  -- true: the job was to run again (attempts left); false: the attempt ended
  -- it (failed for good, or cancelled)
  retried boolean not null default false,
  pool_id text
);
create index _private_py_job_errors_job_id on {{schema}}._private_py_job_errors (job_id);
