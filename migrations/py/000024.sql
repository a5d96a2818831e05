-- Declared limits (issue 43; Python-only: Node never reads this table).
--
-- The limit each task declares in code (@task_options(limit=...)), as a pool
-- starting with that task last applied it to _private_py_limits. A pool
-- applies a declaration only when it is new or differs from the one recorded
-- here; otherwise it leaves the stored limit as it is, so that an operator's
-- change or removal (the CLI, the dashboard, the utilities) stands until the
-- task's declaration itself changes. A pool whose task no longer declares a
-- limit deletes the task's row (its stored limit stays), so that a later
-- declaration applies again.
--
-- declaration: {"max_running", "max_starts", "per_seconds", "partition_by"}
-- (null where the limit does not say); declared_at: when it was applied.
create table {{schema}}._private_py_declared_limits (
  task_identifier text not null
    constraint _private_py_declared_limits_pkey primary key,
  declaration jsonb not null,
  declared_at timestamptz not null default now()
);
alter table {{schema}}._private_py_declared_limits enable row level security;
