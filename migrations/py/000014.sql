-- Pauses (Python-only; Node never reads these objects).
--
-- A named queue or a task identifier is paused fleet-wide, in the database:
-- every Python pool's fetch (py_fetch_jobs, changed by this
-- revision) leaves the
-- paused queues' and tasks' jobs alone, from the first fetch whose snapshot
-- sees the pause; a pool started while it holds does not run them either,
-- and a restart does not undo it. Running jobs finish; add_job still adds.
-- name '*' pauses every named queue (kind 'queue') or every task (kind
-- 'task'). resume_at, when given, ends the pause by itself: the fetch ignores
-- a pause whose resume_at has passed, and the pools' upkeep deletes it.
--
-- hold_queue_lock (named queues only, opt-in) makes Node workers stop on the
-- queue too, through Node's own queue-lock protocol: the queue's row in
-- _private_job_queues is locked by 'py:paused' once no job of it runs (Node's
-- fetch takes only unlocked queues), refreshed by the Python pools' upkeep
-- about every hour. With no Python pool alive for 4 hours, Node's stale-lock
-- sweep unlocks it and Node runs the queue again: the pause fails open.
-- Resuming (or Node's force_unlock_workers('{py:paused}')) unlocks it.
create table {{schema}}._private_py_pauses (
  kind text not null constraint _private_py_pauses_kind_check check (kind in ('queue', 'task')),
  name text not null constraint _private_py_pauses_name_check check (length(name) between 1 and 128),
  paused_at timestamptz not null default now(),
  resume_at timestamptz,
  reason text,
  hold_queue_lock boolean not null default false,
  constraint _private_py_pauses_pkey primary key (kind, name),
  constraint _private_py_pauses_hold_check check (not hold_queue_lock or (kind = 'queue' and name <> '*'))
);

-- Functions live in functions.sql (one definition each, applied after the
-- last pending revision): this revision added py_hold_paused_queues, py_pause
-- and py_resume, and changed py_fetch_jobs to leave paused queues and tasks
-- alone.
