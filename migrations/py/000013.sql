-- Snoozes (Python-only; Node never reads these objects).
--
-- A task raising Snooze(seconds) runs again later without spending an
-- attempt (its attempts count goes back down, as when a worker gives a job
-- back at shutdown). How many times a job has snoozed is kept with its
-- options, so that a task's RetryPolicy(max_snoozes=N) can turn the snooze
-- after the N-th into a failure. The row goes with the job's other options.
alter table {{schema}}._private_py_job_options add column snoozes int not null default 0;
