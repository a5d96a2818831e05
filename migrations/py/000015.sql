-- Concurrency and rate limits across every Python pool (Python-only; Node
-- never reads these objects, and its workers ignore the limits).
--
-- A limit applies to a task identifier (kind 'task') or a named queue (kind
-- 'queue'), optionally per value of a payload field (partition_by: each
-- value, say each account_id, has its own limit; a job without the field
-- counts under the empty value), or to an operation that tasks do in their
-- body (kind 'operation': helpers.limit(name, partition), see
-- py_limit_acquire). It caps
--   max_running: jobs of the key (or partition) locked at once, by any pool;
--   max_starts per period: starts in any window of that length. Every start
--     counts whatever its outcome; a retry or snooze counts again when it
--     starts again.
-- The table is the single source of truth: the utilities, the CLI and the
-- pools' own declarations (@task_options(limit=...)) write it; every change
-- is announced on "<schema>:py:control" (payload 'limits').
create table {{schema}}._private_py_limits (
  kind text not null
    constraint _private_py_limits_kind_check check (kind in ('queue', 'task', 'operation')),
  name text not null
    constraint _private_py_limits_name_check check (length(name) between 1 and 128),
  max_running int constraint _private_py_limits_running_check check (max_running between 1 and 10000),
  max_starts int constraint _private_py_limits_starts_check check (max_starts between 1 and 10000),
  period interval
    constraint _private_py_limits_period_check check (period > interval '0' and period <= interval '1 day'),
  partition_by text
    constraint _private_py_limits_partition_check check (length(partition_by) between 1 and 128),
  updated_at timestamptz not null default now(),
  constraint _private_py_limits_pkey primary key (kind, name),
  constraint _private_py_limits_rate_check check ((max_starts is null) = (period is null)),
  constraint _private_py_limits_some_check check (max_running is not null or max_starts is not null)
);

-- The state of each limit (one row per partition value, '' without
-- partition_by): the ids of the jobs it let start that may still be running
-- (those no longer locked are dropped as it is read), and the times of its
-- latest starts (at most max_starts) with the ids of the jobs started then
-- (started[i] at starts[i]). Written by a fetch holding the limit's row lock,
-- and by py_uncount_starts.
create table {{schema}}._private_py_limit_state (
  kind text not null,
  name text not null,
  partition text not null,
  running bigint[] not null default '{}',
  starts timestamptz[] not null default '{}',
  started bigint[] not null default '{}',
  constraint _private_py_limit_state_pkey primary key (kind, name, partition)
);

-- Functions live in functions.sql (one definition each, applied after the
-- last pending revision): this revision added py_set_limit, py_remove_limit,
-- py_fetch_limited_jobs, py_uncount_starts, py_limits_next_start,
-- py_limit_acquire and py_limit_release, and changed py_fetch_jobs to leave
-- limited tasks and queues to py_fetch_limited_jobs.
