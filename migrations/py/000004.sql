-- What a worker pool reports in its heartbeat, for the dashboard's Worker
-- pools page. All nullable: a pool of an older version leaves them null (its
-- beat statement sets none of them), and the row of such a pool still works.
--   concurrency        the pool's slots (-j)
--   task_identifiers   the tasks it runs
--   version            the graphile-worker (Python) version it runs
--   jobs_done          jobs it has run to an outcome (success or failure) so far
--   jobs_done_before,  the same counter and beat_at at the previous beat:
--   beat_before        (jobs_done - jobs_done_before) / (beat_at - beat_before)
--                      is the pool's rate over its last interval, on the
--                      database's clock
alter table {{schema}}._private_py_heartbeats
  add column concurrency int,
  add column task_identifiers text[],
  add column version text,
  add column jobs_done bigint,
  add column jobs_done_before bigint,
  add column beat_before timestamptz;
