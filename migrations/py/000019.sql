-- The expiry ledger's id lists (py/000011.sql) stored uncompressed.
--
-- A ledger row lists the ids of up to 1,000 finished jobs (8 bytes each):
-- over the 2 kB at which PostgreSQL compresses a value, so every row the
-- completer wrote went through pglz first, about 0.14 ms for a batch of 500
-- (0.3 µs a job, a tenth of what history costs a drain) for a list that then
-- went out of line anyway. Stored as "external" a list goes out of line
-- (TOAST) without trying to compress it. Rows already written stay as they
-- are; both read the same.
alter table {{schema}}._private_py_job_history_expiry
  alter column job_ids set storage external;
