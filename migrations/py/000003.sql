-- The worker's fetch: py_get_jobs and the index it reads.
--
-- _private_py_jobs_task_order: the fetch looks jobs up per task. Without it,
-- a backlog of due jobs of a task this worker does not run (a million jobs
-- for a task only another deployment handles, say) lies ahead of its own
-- jobs in jobs_main_index, and every fetch would walk all of it. Node's
-- statements do not use it; it adds an entry per available job on insert
-- (and when a failed job becomes available again).
-- id is a key column: the fetch orders by (priority, run_at, id), and jobs
-- added in one statement share their run_at.
-- The predicate spells out is_available (a generated column: locked_at is
-- null and attempts < max_attempts) on purpose: py_get_jobs uses the same
-- words, so this is the only partial index the planner can match there;
-- jobs_main_index ("where is_available = true") cannot be picked by mistake.
create index if not exists _private_py_jobs_task_order
  on {{schema}}._private_jobs (task_id, priority, run_at, id)
  include (job_queue_id)
  where locked_at is null and attempts < max_attempts;

-- Functions live in functions.sql (one definition each, applied after the
-- last pending revision): this revision added the four-argument py_get_jobs.
