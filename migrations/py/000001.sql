-- Unique jobs (Python-only; Node never reads these objects).
--
-- One row per uniqueness hash: the job that holds it, the states in which
-- that job blocks a duplicate, and when the hold ends (null: no time limit,
-- only as long as the job row exists). Nothing watches the jobs table: the
-- state of the holder is derived from its live row when a duplicate is
-- checked, and a row that is gone means the job succeeded (a Node or Python
-- worker deleted it). Job ids are identity values and never reused.
create table {{schema}}._private_py_unique_locks (
  hash bytea primary key,
  job_id bigint not null,
  states text[] not null,
  expires_at timestamptz,
  created_at timestamptz not null default now()
);
create index _private_py_unique_locks_job_id on {{schema}}._private_py_unique_locks (job_id);
create index _private_py_unique_locks_expires_at
  on {{schema}}._private_py_unique_locks (expires_at)
  where expires_at is not null;
alter table {{schema}}._private_py_unique_locks enable row level security;

-- Functions live in functions.sql (one definition each, applied after the
-- last pending revision): this revision added py_unique_rule, py_unique_list,
-- py_unique_hash, py_unique_state, py_unique_lock_key, py_add_job,
-- py_add_jobs and py_gc_unique_locks.
