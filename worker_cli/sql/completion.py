"""The success statements (the completer's, through
:mod:`worker_cli.worker.pipeline.result_writer`), each written whole: history off
(``COMPLETE_BATCH``, ``COMPLETE_BATCH_WITHOUT_QUEUES``) and history on
(``COMPLETE_BATCH_RECORDING`` and its three lighter forms); the result
writer chooses among them.

Each ends with the waiters' notifications: one NOTIFY per batch, on the
channel "<schema>:py:finished" (%(channel)s, see
:func:`worker_cli.schema.channels.finished_channel`), listing the ids of the
batch's jobs someone waits for (notify_on_finish), at most 300 a
notification (a payload must stay under 8000 bytes: 300 ids of 19 digits and
a comma are 6000). Jobs nobody waits for send nothing: the options table is
read through its primary key with the batch's ids, and it is usually empty;
with no job waited for, the aggregate is null and no notification is sent.
The options of the deleted jobs are deleted with them. A named queue is
unlocked only for a job whose row this pool still held: after a failover to
a standby that had not received a fetch, a job's row may be unlocked (or the
queue held for another of this pool's jobs), and unlocking its queue would
let a second job of the queue start beside that one."""

from __future__ import annotations

# Success: delete the jobs and unlock their named queues.
COMPLETE_BATCH = """
  with done as (
    delete from {schema}._private_jobs as j
    where j.id = any(%(job_ids)b::bigint[])
    returning j.id, j.job_queue_id, j.locked_by
  ),
  unlocked as (
    update {schema}._private_job_queues as q
    set locked_at = null, locked_by = null
    where q.id in (select done.job_queue_id from done where done.locked_by = %(pool_id)s)
      and q.locked_by = %(pool_id)s
  ),
  finished as (
    delete from {schema}._private_py_job_options as o
    where o.job_id = any(%(job_ids)b::bigint[])
    returning o.job_id, o.notify_on_finish
  )
  select pg_notify(%(channel)s, array_to_string(w.ids[i:i + 299], ','))
  from (
    select array_agg(f.job_id) as ids from finished as f where f.notify_on_finish
  ) as w
  cross join generate_series(1, coalesce(cardinality(w.ids), 0), 300) as i
"""

# The same for a batch in which no job is in a named queue (as fetched: a
# locked job's queue never changes), the common case: without the queues'
# update, about 0.3 µs of server CPU less per job.
COMPLETE_BATCH_WITHOUT_QUEUES = """
  with done as (
    delete from {schema}._private_jobs as j
    where j.id = any(%(job_ids)b::bigint[])
  ),
  finished as (
    delete from {schema}._private_py_job_options as o
    where o.job_id = any(%(job_ids)b::bigint[])
    returning o.job_id, o.notify_on_finish
  )
  select pg_notify(%(channel)s, array_to_string(w.ids[i:i + 299], ','))
  from (
    select array_agg(f.job_id) as ids from finished as f where f.notify_on_finish
  ) as w
  cross join generate_series(1, coalesce(cardinality(w.ids), 0), 300) as i
"""

# Success with history on: the same, and each deleted job recorded as
# succeeded in _private_py_job_history, in the same statement (one commit
# for both), with its result: the jobs of %(result_ids)s returned a value
# (their JSON text in %(results)s) or one that was not kept (%(result_errors)s);
# those of %(timed_out)s returned after their timeout. One row of the expiry
# ledger lists them all (a batch holds at most WRITE_AT_MOST = 1,000 jobs). As
# COMPLETE_BATCH, it deletes the jobs' options and notifies
# their waiters.
COMPLETE_BATCH_RECORDING = """
  with done as (
    delete from {schema}._private_jobs as j
    where j.id = any(%(job_ids)b::bigint[])
    returning j.id, j.job_queue_id, j.task_id, j.key, j.priority, j.attempts,
      j.max_attempts, j.revision, j.flags, j.created_at, j.run_at, j.locked_at, j.locked_by
  ),
  recorded as (
    insert into {schema}._private_py_job_history (
      job_id, state, task_identifier, queue_name, key, priority, attempts, max_attempts,
      revision, flags, result, result_error, created_at, run_at, started_at, finished_at,
      pool_id, timed_out, expires_at
    )
    select d.id, 'succeeded', t.identifier, q.queue_name, d.key, d.priority, d.attempts,
      d.max_attempts, d.revision, d.flags, r.result::json, r.result_error, d.created_at,
      d.run_at, d.locked_at, now(), %(pool_id)s, d.id = any(%(timed_out)s::bigint[]),
      now() + %(keep)s::interval
    from done as d
    join {schema}._private_tasks as t on t.id = d.task_id
    left join {schema}._private_job_queues as q on q.id = d.job_queue_id
    left join unnest(
      %(result_ids)b::bigint[], %(results)s::text[], %(result_errors)s::text[]
    ) as r (id, result, result_error) on r.id = d.id
  ),
  expiry as (
    insert into {schema}._private_py_job_history_expiry (expires_at, job_ids)
    select now() + %(keep)s::interval, array_agg(d.id) from done as d having count(*) > 0
  ),
  unlocked as (
    update {schema}._private_job_queues as q
    set locked_at = null, locked_by = null
    where q.id in (select done.job_queue_id from done where done.locked_by = %(pool_id)s)
      and q.locked_by = %(pool_id)s
  ),
  finished as (
    delete from {schema}._private_py_job_options as o
    where o.job_id = any(%(job_ids)b::bigint[])
    returning o.job_id, o.notify_on_finish
  )
  select pg_notify(%(channel)s, array_to_string(w.ids[i:i + 299], ','))
  from (
    select array_agg(f.job_id) as ids from finished as f where f.notify_on_finish
  ) as w
  cross join generate_series(1, coalesce(cardinality(w.ids), 0), 300) as i
"""

# The same for a batch in which no job returned a value (all results null).
COMPLETE_BATCH_RECORDING_NO_RESULTS = """
  with done as (
    delete from {schema}._private_jobs as j
    where j.id = any(%(job_ids)b::bigint[])
    returning j.id, j.job_queue_id, j.task_id, j.key, j.priority, j.attempts,
      j.max_attempts, j.revision, j.flags, j.created_at, j.run_at, j.locked_at, j.locked_by
  ),
  recorded as (
    insert into {schema}._private_py_job_history (
      job_id, state, task_identifier, queue_name, key, priority, attempts, max_attempts,
      revision, flags, result, result_error, created_at, run_at, started_at, finished_at,
      pool_id, timed_out, expires_at
    )
    select d.id, 'succeeded', t.identifier, q.queue_name, d.key, d.priority, d.attempts,
      d.max_attempts, d.revision, d.flags, null::json, null::text, d.created_at,
      d.run_at, d.locked_at, now(), %(pool_id)s, d.id = any(%(timed_out)s::bigint[]),
      now() + %(keep)s::interval
    from done as d
    join {schema}._private_tasks as t on t.id = d.task_id
    left join {schema}._private_job_queues as q on q.id = d.job_queue_id
  ),
  expiry as (
    insert into {schema}._private_py_job_history_expiry (expires_at, job_ids)
    select now() + %(keep)s::interval, array_agg(d.id) from done as d having count(*) > 0
  ),
  unlocked as (
    update {schema}._private_job_queues as q
    set locked_at = null, locked_by = null
    where q.id in (select done.job_queue_id from done where done.locked_by = %(pool_id)s)
      and q.locked_by = %(pool_id)s
  ),
  finished as (
    delete from {schema}._private_py_job_options as o
    where o.job_id = any(%(job_ids)b::bigint[])
    returning o.job_id, o.notify_on_finish
  )
  select pg_notify(%(channel)s, array_to_string(w.ids[i:i + 299], ','))
  from (
    select array_agg(f.job_id) as ids from finished as f where f.notify_on_finish
  ) as w
  cross join generate_series(1, coalesce(cardinality(w.ids), 0), 300) as i
"""

# The same two for a batch in which no job is in a named queue (as fetched: a
# locked job's queue never changes), the common case.
COMPLETE_BATCH_RECORDING_WITHOUT_QUEUES = """
  with done as (
    delete from {schema}._private_jobs as j
    where j.id = any(%(job_ids)b::bigint[])
    returning j.id, j.job_queue_id, j.task_id, j.key, j.priority, j.attempts,
      j.max_attempts, j.revision, j.flags, j.created_at, j.run_at, j.locked_at, j.locked_by
  ),
  recorded as (
    insert into {schema}._private_py_job_history (
      job_id, state, task_identifier, queue_name, key, priority, attempts, max_attempts,
      revision, flags, result, result_error, created_at, run_at, started_at, finished_at,
      pool_id, timed_out, expires_at
    )
    select d.id, 'succeeded', t.identifier, null::text, d.key, d.priority, d.attempts,
      d.max_attempts, d.revision, d.flags, r.result::json, r.result_error, d.created_at,
      d.run_at, d.locked_at, now(), %(pool_id)s, d.id = any(%(timed_out)s::bigint[]),
      now() + %(keep)s::interval
    from done as d
    join {schema}._private_tasks as t on t.id = d.task_id
    left join unnest(
      %(result_ids)b::bigint[], %(results)s::text[], %(result_errors)s::text[]
    ) as r (id, result, result_error) on r.id = d.id
  ),
  expiry as (
    insert into {schema}._private_py_job_history_expiry (expires_at, job_ids)
    select now() + %(keep)s::interval, array_agg(d.id) from done as d having count(*) > 0
  ),
  finished as (
    delete from {schema}._private_py_job_options as o
    where o.job_id = any(%(job_ids)b::bigint[])
    returning o.job_id, o.notify_on_finish
  )
  select pg_notify(%(channel)s, array_to_string(w.ids[i:i + 299], ','))
  from (
    select array_agg(f.job_id) as ids from finished as f where f.notify_on_finish
  ) as w
  cross join generate_series(1, coalesce(cardinality(w.ids), 0), 300) as i
"""

COMPLETE_BATCH_RECORDING_NO_RESULTS_WITHOUT_QUEUES = """
  with done as (
    delete from {schema}._private_jobs as j
    where j.id = any(%(job_ids)b::bigint[])
    returning j.id, j.job_queue_id, j.task_id, j.key, j.priority, j.attempts,
      j.max_attempts, j.revision, j.flags, j.created_at, j.run_at, j.locked_at, j.locked_by
  ),
  recorded as (
    insert into {schema}._private_py_job_history (
      job_id, state, task_identifier, queue_name, key, priority, attempts, max_attempts,
      revision, flags, result, result_error, created_at, run_at, started_at, finished_at,
      pool_id, timed_out, expires_at
    )
    select d.id, 'succeeded', t.identifier, null::text, d.key, d.priority, d.attempts,
      d.max_attempts, d.revision, d.flags, null::json, null::text, d.created_at,
      d.run_at, d.locked_at, now(), %(pool_id)s, d.id = any(%(timed_out)s::bigint[]),
      now() + %(keep)s::interval
    from done as d
    join {schema}._private_tasks as t on t.id = d.task_id
  ),
  expiry as (
    insert into {schema}._private_py_job_history_expiry (expires_at, job_ids)
    select now() + %(keep)s::interval, array_agg(d.id) from done as d having count(*) > 0
  ),
  finished as (
    delete from {schema}._private_py_job_options as o
    where o.job_id = any(%(job_ids)b::bigint[])
    returning o.job_id, o.notify_on_finish
  )
  select pg_notify(%(channel)s, array_to_string(w.ids[i:i + 299], ','))
  from (
    select array_agg(f.job_id) as ids from finished as f where f.notify_on_finish
  ) as w
  cross join generate_series(1, coalesce(cardinality(w.ids), 0), 300) as i
"""
