-- Stuck jobs in the heartbeat (Python-only; Node never reads these objects).
--
-- A job that goes on running when it should have stopped (a cancel request
-- ignored past its grace, a plain def task still running past its timeout's
-- grace) keeps its slot and its lock: only its pool knows it is stuck. Each
-- beat lists them (null: a pool of an earlier version, or heartbeats
-- without a report), so that the dashboard can show them.
alter table {{schema}}._private_py_heartbeats add column stuck_job_ids bigint[];
