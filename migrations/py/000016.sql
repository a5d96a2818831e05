-- Django Tasks (worker_cli.contrib.django): one row per enqueued Django task,
-- the TaskResult Django reads back (Python-only; Node never reads it).
--
-- The job itself is an ordinary graphile-worker job of the task identifier
-- 'django:<queue name>' whose payload names this row; the row is written in
-- the same statement as the job (in the caller's transaction), set RUNNING by
-- the worker when an attempt starts, and SUCCESSFUL, READY (a retry follows)
-- or FAILED when it ends. An attempt that ends without an outcome (a killed
-- worker) is reconciled from the job's state when the result is read, and
-- recorded as an error of that attempt when the job runs again.
create table {{schema}}._private_py_django_results (
  id uuid primary key,
  job_id bigint not null,
  -- The Django backend alias, queue name and task (its module path).
  backend text not null,
  queue_name text not null,
  task_path text not null,
  -- On Django's scale (-100..100, higher sooner): the job's is its negation.
  priority smallint not null,
  run_after timestamptz,
  -- json, not jsonb: arguments come back with their keys in the order given.
  args json not null,
  kwargs json not null,
  status text not null default 'READY'
    constraint _private_py_django_results_status_check
    check (status in ('READY', 'RUNNING', 'SUCCESSFUL', 'FAILED')),
  enqueued_at timestamptz not null default now(),
  started_at timestamptz,
  last_attempted_at timestamptz,
  finished_at timestamptz,
  return_value json,
  -- One {"exception_class_path", "traceback"} object per failed attempt.
  errors jsonb not null default '[]',
  -- The worker pool of each attempt, in order.
  worker_ids text[] not null default '{}'
);
-- Pruning finds finished rows by age.
create index _private_py_django_results_finished_at
  on {{schema}}._private_py_django_results (finished_at) where finished_at is not null;
alter table {{schema}}._private_py_django_results enable row level security;
