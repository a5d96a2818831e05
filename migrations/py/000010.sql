-- The dashboard's Finished view (Python-only; Node never reads the history).
--
-- The finished jobs, newest first: a keyset on (finished_at, job_id), read
-- backward from the page's cursor and between the view's time filters, so a
-- page examines at most a fixed window of rows whatever the history holds
-- (the task and state filters are applied inside that window, as the job
-- list's are). job_id breaks the ties: a batch of jobs completed or cancelled
-- together shares one finished_at (one now()), and a page boundary may fall
-- inside it.
--
-- Its cost is paid by every finished job (each success writes a history row
-- when history is on): one more entry in one more B-tree, appended at its
-- right-hand end (finished_at is the time of the writing transaction), about
-- 30 bytes of index per row; expired rows leave it as the pruning deletes them
-- (vacuum). Measured in the README's "Dashboard" section.
create index _private_py_job_history_finished_at
  on {{schema}}._private_py_job_history (finished_at, job_id);
