-- The history's cost per finished job: one row and its primary key, nothing
-- more (Python-only; Node never reads these objects).
--
-- Every success a Python pool records writes a history row in its completion
-- statement, so each index on the history is paid once per job, on the path
-- that finishes jobs. Two were: expires_at (for the pruning) and (finished_at,
-- job_id) (for the dashboard's Finished view). Measured on a drain of 200,000
-- jobs, each cost about 0.6 us of PostgreSQL CPU per job, a sixth of what
-- history on adds (README, "The cost of history"). Both go:
--   - the pruning finds expired rows through a ledger written once per
--     statement that records jobs (a completion batch, a cancel, an archive):
--     when its rows expire and their ids, at most 1,000 ids a ledger row;
--   - the Finished view pages through the primary key, newest job first.
drop index {{schema}}._private_py_job_history_finished_at;
drop index {{schema}}._private_py_job_history_expires_at;

create table {{schema}}._private_py_job_history_expiry (
  id bigint primary key generated always as identity,
  -- When the rows of job_ids expire (their expires_at).
  expires_at timestamptz not null,
  job_ids bigint[] not null check (cardinality(job_ids) between 1 and 1000)
);
create index _private_py_job_history_expiry_expires_at
  on {{schema}}._private_py_job_history_expiry (expires_at);
alter table {{schema}}._private_py_job_history_expiry enable row level security;

-- The rows already recorded, in ledger rows of up to 1,000 ids.
insert into {{schema}}._private_py_job_history_expiry (expires_at, job_ids)
select h.expires_at, array_agg(h.job_id order by h.job_id)
from (
  select x.job_id, x.expires_at,
    (row_number() over (partition by x.expires_at order by x.job_id) - 1) / 1000 as chunk
  from {{schema}}._private_py_job_history as x
) as h
group by h.expires_at, h.chunk;

-- Functions live in functions.sql (one definition each, applied after the
-- last pending revision): this revision changed py_cancel_jobs to list its
-- cancelled jobs in the ledger.
