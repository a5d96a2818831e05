-- Leases of a concurrency limit's slots (issue 48): a worker pool with
-- heartbeats holds `slots` of a task's max_running (counted as running, as
-- locked jobs in _private_py_limit_state.running are), fetches that task's
-- jobs ahead like any other, and starts them locally as long as it runs
-- fewer than `target` of them (target <= slots): no round trip per start.
-- Only for task limits without max_starts, while no queue has a limit
-- (py_fetch_leased_jobs); a partitioned limit is leased per partition value
-- (partition: its key, py_limit_partition; '' without partition_by). A lease goes with its pool's heartbeat
-- row (a pool declared dead loses its leases with its jobs' locks) and with
-- its limit; py_set_limit deletes a limit's leases (the jobs their pools
-- hold locked are counted instead).
--   slots      counted as running for this pool: at least what it may be
--              running now (never shrinks below what it held when it asked)
--   target     how many it may run from now on (a pool asked to share runs
--              fewer, and its slots follow at its next fetch)
--   wanted_at  last time this pool wanted more slots than it got: pools
--              holding slots then give up all but their share
create table {{schema}}._private_py_limit_leases (
  kind text not null,
  name text not null,
  partition text not null,
  pool_id text not null
    references {{schema}}._private_py_heartbeats (pool_id) on delete cascade,
  slots int not null check (slots >= 0),
  target int not null check (target >= 0 and target <= slots),
  wanted_at timestamptz,
  updated_at timestamptz not null default now(),
  primary key (kind, name, partition, pool_id),
  foreign key (kind, name) references {{schema}}._private_py_limits (kind, name)
    on delete cascade
);
create index _private_py_limit_leases_pool_id on {{schema}}._private_py_limit_leases (pool_id);
