"""The success statement (the completer's, through
:mod:`worker_cli.worker.pipeline.result_writer`), written whole: one statement
deletes a batch of succeeded jobs, unlocks their named queues, records them in
the history when it is on, deletes their options and tells their waiters.

The parts a batch does not need are switched off by a parameter, not left
out of the text: ``%(record)s`` (history on) and ``%(any_queued)s`` (some job
of the batch is in a named queue; as fetched: a locked job's queue never
changes). A condition on a parameter alone is a one-time filter in
PostgreSQL's plan: a part switched off is not run at all, so history off and
the common batch without named queues cost no more than statements written
without those parts (measured: the 200,000-job drain of issue 42's note).

The waiters' notifications: one NOTIFY per batch, on the
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

# Success: delete the jobs, unlock their named queues (%(any_queued)s), and
# with history on (%(record)s) record each deleted job as succeeded in
# _private_py_job_history, in the same statement (one commit for both), with
# its attempt (for a job asked to cancel that returned all the same, the
# attempt it was at when asked, not the max_attempts py_cancel_jobs put on its
# row; the request's time and reason are kept with it) and its result: the
# jobs of %(result_ids)s returned a value (their JSON text in %(results)s) or
# one that was not kept (%(result_errors)s); those of
# %(timed_out)s returned after their timeout. One row of the expiry ledger
# lists them all (a batch holds at most WRITE_AT_MOST = 1,000 jobs), kept
# %(keep)s. Then the jobs' options are deleted and their waiters told.
COMPLETE_BATCH = """
  with done as (
    delete from {schema}._private_jobs as j
    where j.id = any(%(job_ids)b::bigint[])
    returning j.id, j.job_queue_id, j.task_id, j.key, j.priority, j.attempts,
      j.max_attempts, j.revision, j.flags, j.created_at, j.run_at, j.locked_at, j.locked_by
  ),
  asked as materialized (  -- the batch's cancel requests: usually none (by primary key)
    select c.job_id, c.attempts, c.requested_at, c.reason
    from {schema}._private_py_cancellations as c
    where %(record)s and c.job_id = any(%(job_ids)b::bigint[])
  ),
  recorded as (
    insert into {schema}._private_py_job_history (
      job_id, state, task_identifier, queue_name, key, priority, attempts, max_attempts,
      revision, flags, result, result_error, created_at, run_at, started_at, finished_at,
      pool_id, timed_out, cancel_requested_at, cancel_reason, expires_at
    )
    select d.id, 'succeeded', t.identifier,
      (select q.queue_name from {schema}._private_job_queues as q where q.id = d.job_queue_id),
      d.key, d.priority, coalesce(c.attempts, d.attempts), d.max_attempts, d.revision, d.flags,
      r.result::json, r.result_error, d.created_at, d.run_at, d.locked_at, now(), %(pool_id)s,
      d.id = any(%(timed_out)s::bigint[]), c.requested_at, c.reason, now() + %(keep)s::interval
    from done as d
    join {schema}._private_tasks as t on t.id = d.task_id
    left join unnest(
      %(result_ids)s::bigint[], %(results)s::text[], %(result_errors)s::text[]
    ) as r (id, result, result_error) on r.id = d.id
    left join asked as c on c.job_id = d.id
    where %(record)s
  ),
  expiry as (
    insert into {schema}._private_py_job_history_expiry (expires_at, job_ids)
    select now() + %(keep)s::interval, array_agg(d.id)
    from done as d
    where %(record)s
    having count(*) > 0
  ),
  unlocked as (
    update {schema}._private_job_queues as q
    set locked_at = null, locked_by = null
    where %(any_queued)s
      and q.id in (select done.job_queue_id from done where done.locked_by = %(pool_id)s)
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
