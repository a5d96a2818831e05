-- Trace contexts of jobs (Python-only; Node never reads this table).
--
-- When an application turns on trace propagation (worker_cli.tracing), add_job
-- stores the trace context of its caller here, in the same statement that adds
-- the job, keyed by the job's id; the job's payload is left exactly as given,
-- so a Node task reading it sees nothing new. A worker with tracing on reads
-- the contexts of the jobs it fetches (one statement per fetch) and makes each
-- job's span a child of its caller's.
--
-- No foreign key to _private_jobs on purpose: ON DELETE CASCADE would make
-- every completion of every worker, Node's included, look here. Instead the
-- worker with tracing on deletes the rows of the jobs it completed (at its
-- next fetch), and every 8-10 minutes the rows whose job is gone (completed by
-- a Node worker, a worker without tracing, an administrator). Job ids are
-- identity values and never reused, so a leftover row never meets a new job.
create table {{schema}}._private_py_job_trace_contexts (
  job_id bigint primary key,
  -- The propagator's carrier: {"traceparent": "00-...", "tracestate": ...}.
  context jsonb not null,
  added_at timestamptz not null default now()
);
alter table {{schema}}._private_py_job_trace_contexts enable row level security;
