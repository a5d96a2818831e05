-- The worker's fetch looks jobs up per task (statements.get_jobs): without
-- this index, a backlog of due jobs of a task this worker does not run (a
-- million jobs for a task only another deployment handles, say) lies ahead
-- of its own jobs in jobs_main_index, and every fetch would walk all of it.
-- Node's statements do not depend on it; it only adds an entry per available
-- job on insert (made available again on retry).
-- id is a key column: get_jobs orders by (priority, run_at, id), and jobs
-- added in one statement share their run_at.
create index if not exists _private_py_jobs_task_order
  on {{schema}}._private_jobs (task_id, priority, run_at, id)
  include (job_queue_id)
  where is_available;
