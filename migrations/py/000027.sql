-- Long jobs you can watch, and schedules you can change without a deploy
-- (issue 46). Python-only objects; Node never reads them, and nothing here
-- touches Node's tables.

-- A job's progress (helpers.progress): one row per job, written by the
-- worker's progress writer (coalesced: at most a few writes a second per job,
-- never by the completion's statement). Kept across retries; the row stays
-- when the job finishes, so a finished job's record (its history) shows its
-- last progress. Keyed by job id, no foreign key (as _private_py_job_errors):
-- rows whose job is gone are pruned after 7 days.
--   done, total  total null: done is a fraction (0 to 1)
create table {{schema}}._private_py_job_progress (
  job_id bigint primary key,
  done double precision not null,
  total double precision,
  message text,
  updated_at timestamptz not null default now()
);
create index _private_py_job_progress_updated_at
  on {{schema}}._private_py_job_progress (updated_at);

-- The lines a task logged through helpers.logger during one attempt
-- (--job-logs failed: failed attempts only, written by the failure
-- statement; all: successes too). At most the worker's cap per attempt (the
-- oldest lines dropped: `dropped` says how many). Pruned with the attempt
-- errors (7 days, oldest id first).
--   outcome  failed | succeeded | cancelled
create table {{schema}}._private_py_job_logs (
  id bigint generated always as identity primary key,
  job_id bigint not null,
  attempt int,
  outcome text not null,
  logged_at timestamptz not null default now(),
  lines text not null,
  dropped int not null default 0
);
create index _private_py_job_logs_job_id on {{schema}}._private_py_job_logs (job_id);

-- Schedules in the database: cron items an application or an operator adds,
-- changes, pauses and removes at run time (add_schedule, the CLI, the
-- dashboard). Every Python worker reads them (told on the channel
-- py_channel('schedules'), and polling) and fires them as crontab lines; the
-- UPDATE of last_execution decides which worker adds an instant's job (any
-- number of workers add it once). version grows with every change: a worker
-- that has not seen the change yet cannot fire the old pattern.
--   pattern          five time fields, as in a crontab
--   fill             the backfill period (crontab's ?fill=)
--   known_since      the schedule fires at instants from here on (its
--                    creation; a resume moves it to the resume: the paused
--                    time is never backfilled)
--   last_execution   the last instant it fired (UTC)
--   last_run_at      when that job was added (minus last_execution: the lag)
create table {{schema}}._private_py_schedules (
  identifier text primary key,
  pattern text not null,
  task_identifier text not null,
  payload json,
  tz text,
  fill interval not null default interval '0',
  queue_name text,
  priority smallint,
  max_attempts smallint,
  job_key text,
  paused boolean not null default false,
  version bigint not null default 1,
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now(),
  known_since timestamptz not null default now(),
  last_execution timestamptz,
  last_run_at timestamptz
);
