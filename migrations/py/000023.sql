-- On-call (issue 43; Python-only: Node never reads these objects).
--
-- Each failed attempt's traceback beside its error (last_error keeps the
-- message only, as graphile-worker writes it): the worker stores at most the
-- last 8,000 characters of it (the innermost frames and the exception).
-- A row with retried_by set is no attempt's error but an operator's retry
-- (`graphile-worker retry`, the dashboard's bulk retry): the job's attempts
-- were reset there, and the attempt numbers after it start again at 1;
-- retried_by says how ('cli', 'dashboard', 'api').
alter table {{schema}}._private_py_job_errors
  add column traceback text,
  add column retried_by text;

-- The attempt a job was at when it was asked to cancel while running:
-- py_cancel_jobs then sets its attempts to max_attempts (as Node's remove_job
-- does, so that nobody retries it); its history and its attempt error keep
-- the attempt it really was.
alter table {{schema}}._private_py_cancellations add column attempts smallint;

-- Removals recorded: a job an operator removes (`graphile-worker remove`,
-- the dashboard's delete, WorkerUtils.remove_job) leaves a history row in
-- state 'removed', with how it was removed (removed_by: 'cli', 'dashboard',
-- 'api'), kept a day. Rows written before satisfy the new check, which is
-- not validated against them (no scan of a large history).
alter table {{schema}}._private_py_job_history
  drop constraint _private_py_job_history_state_check;
alter table {{schema}}._private_py_job_history
  add constraint _private_py_job_history_state_check
  check (state in ('succeeded', 'cancelled', 'failed', 'removed')) not valid;
alter table {{schema}}._private_py_job_history add column removed_by text;

-- Functions live in functions.sql: this revision changed py_cancel_jobs (it
-- keeps the running job's attempt) and py_job_status (a running job asked to
-- cancel shows the attempt it is at).
