-- Heartbeats of running worker pools (opt-in: --heartbeat-interval). Each pool
-- with heartbeats on keeps one row, beat_at refreshed every interval. A row whose
-- beat_at is older than the timeout its pool declared belongs to a dead pool:
-- any live pool deletes it and releases the jobs and queues locked_by that pool.
-- Pools without a row (Node workers, pools with heartbeats off) are never touched.
create table {{schema}}._private_py_heartbeats (
  pool_id text primary key,
  started_at timestamptz not null default now(),
  beat_at timestamptz not null default now(),
  timeout interval not null,
  hostname text,
  pid int
);
alter table {{schema}}._private_py_heartbeats enable row level security;
