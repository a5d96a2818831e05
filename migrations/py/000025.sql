-- A worker pool's session sign (issue 44): a killed worker's jobs come back in
-- seconds, not after its heartbeat timeout.
--
-- A pool holds a session-level advisory lock, (x'67775073' "gwPs", sign_key),
-- on its heartbeat's connection for as long as it runs. A process that dies
-- on its host loses its sessions at once, and with them the lock; only a host
-- that vanishes leaves its sessions (and the lock) to the heartbeat timeout.
-- Other pools look for the lock in pg_locks: a pool whose sign is missing
-- for its declared grace is declared dead like a silent one (its row deleted,
-- its jobs and queues released).
--   sign_key            the lock's second key (null: the pool holds no sign,
--                       a pool of an earlier version or behind a pooler in
--                       transaction mode without --listen-url; only the
--                       heartbeat timeout applies to it)
--   sign_server_start   pg_postmaster_start_time() of the server the lock was
--                       taken on: after a restart or a failover every lock is
--                       gone, and a sign taken before does not count until
--                       its pool takes it again
--   sign_grace          how long the sign may be missing before the pool is
--                       declared dead (time to reconnect, declared by the pool)
--   sign_missing_since  when another pool first found the sign missing (null:
--                       held when last looked for)
alter table {{schema}}._private_py_heartbeats
  add column sign_key int,
  add column sign_server_start timestamptz,
  add column sign_grace interval,
  add column sign_missing_since timestamptz;
