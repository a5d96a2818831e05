"""The statements of the job lifecycle (Python-only objects of
migrations/py/000007.sql): history and results, a job's state, pruning,
waiters (registering, their channel, collecting left-over options).
Templates over the schema name, composed with :func:`.statements.compose`."""

from __future__ import annotations

import hashlib
from typing import LiteralString

from . import statements
from .ledger import expiry_ledger


def _complete_recording(results: bool, queues: bool = True) -> LiteralString:
    """The success statement with history on; ``results``: some jobs of the
    batch returned a value (without, the statement leaves out the join that
    finds each job's result: about 0.3 µs of server CPU per job); ``queues``:
    some are in a named queue (without, it leaves out the join that names
    their queue and the queues' update: about 0.4 µs)."""
    if queues:
        queue_column: LiteralString = "q.queue_name"
        queue_join: LiteralString = """
    left join {schema}._private_job_queues as q on q.id = d.job_queue_id"""
        unlock: LiteralString = statements.unlock_queues
    else:
        queue_column, queue_join, unlock = "null::text", "", ""
    if results:
        result_columns: LiteralString = "r.result::json, r.result_error"
        result_join: LiteralString = """
    left join unnest(
      %(result_ids)b::bigint[], %(results)s::text[], %(result_errors)s::text[]
    ) as r (id, result, result_error) on r.id = d.id"""
    else:
        result_columns, result_join = "null::json, null::text", ""
    return (
        """
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
    select d.id, 'succeeded', t.identifier, """
        + queue_column
        + """, d.key, d.priority, d.attempts,
      d.max_attempts, d.revision, d.flags, """
        + result_columns
        + """, d.created_at,
      d.run_at, d.locked_at, now(), %(pool_id)s, d.id = any(%(timed_out)s::bigint[]),
      now() + %(keep)s::interval
    from done as d
    join {schema}._private_tasks as t on t.id = d.task_id"""
        + queue_join
        + result_join
        + """
  ),
  expiry as (
    insert into {schema}._private_py_job_history_expiry (expires_at, job_ids)
    select now() + %(keep)s::interval, array_agg(d.id) from done as d having count(*) > 0
  ),"""
        + unlock
        + statements.finished_options
        + statements.notify_waiters
    )


# Success with history on: the same, and each deleted job recorded as
# succeeded in _private_py_job_history, in the same statement (one commit
# for both), with its result: the jobs of %(result_ids)s returned a value
# (their JSON text in %(results)s) or one that was not kept (%(result_errors)s);
# those of %(timed_out)s returned after their timeout. One row of the expiry
# ledger lists them all (a batch holds at most WRITE_AT_MOST = 1,000 jobs). As
# statements.complete_batch, it deletes the jobs' options and notifies
# their waiters.
complete_batch_recording = _complete_recording(results=True)
# The same for a batch in which no job returned a value (all results null).
complete_batch_recording_no_results = _complete_recording(results=False)
# The same two for a batch in which no job is in a named queue (as fetched: a
# locked job's queue never changes), the common case.
complete_batch_recording_without_queues = _complete_recording(results=True, queues=False)
complete_batch_recording_no_results_without_queues = _complete_recording(
    results=False, queues=False
)

# Delete expired history rows, if this session wins the pruning lock (one
# pool prunes at a time): the oldest expired rows of the expiry ledger (at
# most %(scan)s of them, through its expires_at index: bounded whatever the
# tables hold), as many as list together fewer than %(limit)s ids before the
# last one (at least one row; a row lists at most 1,000), and the history
# rows of their ids (primary key). Returns how many history rows were
# deleted (null when another pool holds the lock), how many ledger rows, and
# how many ids they listed.
prune_history = """
  with allowed as (
    select pg_try_advisory_xact_lock(%(lock_namespace)s, hashtext(%(schema)s::text)) as won
  ),
  oldest as (
    select e.id, e.job_ids,
      sum(cardinality(e.job_ids)) over (order by e.expires_at, e.id) as running
    from (
      select x.id, x.job_ids, x.expires_at
      from {schema}._private_py_job_history_expiry as x
      where x.expires_at < now() and (select allowed.won from allowed)
      order by x.expires_at, x.id
      limit %(scan)s
    ) as e
  ),
  due as (
    delete from {schema}._private_py_job_history_expiry as e
    where e.id = any(array(
      select o.id from oldest as o where o.running - cardinality(o.job_ids) < %(limit)s
    ))
    returning e.job_ids
  ),
  pruned as (
    delete from {schema}._private_py_job_history as h
    where h.job_id in (select unnest(due.job_ids) from due)
    returning 1
  )
  select
    case when (select allowed.won from allowed) then (select count(*) from pruned) end as pruned,
    (select count(*) from due) as ledger_rows,
    (select coalesce(sum(cardinality(due.job_ids)), 0) from due) as listed
"""

# Delete expired attempt errors (migrations/py/000018.sql: kept 7 days), if
# this session wins the pruning lock: of the %(limit)s oldest rows by id (the
# primary key: bounded whatever the table holds), those that failed more than
# 7 days ago. Ids follow failed_at closely (assigned as each row is written),
# so a batch that deletes fewer than it read has reached the kept rows.
# Returns how many were deleted (null when another pool holds the lock) and
# how many were read.
prune_attempt_errors = """
  with allowed as (
    select pg_try_advisory_xact_lock(%(lock_namespace)s, hashtext(%(schema)s::text)) as won
  ),
  oldest as (
    select e.id, e.failed_at
    from {schema}._private_py_job_errors as e
    where (select allowed.won from allowed)
    order by e.id
    limit %(limit)s
  ),
  pruned as (
    delete from {schema}._private_py_job_errors as e
    where e.id in (select o.id from oldest as o where o.failed_at < now() - interval '7 days')
    returning 1
  )
  select
    case when (select allowed.won from allowed) then (select count(*) from pruned) end as pruned,
    (select count(*) from oldest) as read
"""

# A job's attempt errors (migrations/py/000018.sql), oldest first, through
# their job_id index (AttemptError's fields, in order).
job_errors = """
  select e.attempt, e.failed_at, e.error, e.retried, e.task_identifier, e.pool_id
  from {schema}._private_py_job_errors as e
  where e.job_id = %(job_id)s::bigint
  order by e.id
"""

# The state (and result) of one job: migrations/py/000007.sql.
job_status = "select * from {schema}.py_job_status(%(job_id)s)"

# The cleanup's DELETE_PERMAFAILED_JOBS with the lifecycle installed: the
# permanently failed jobs are archived in the history (state failed, kept 7
# days) as they are deleted, and their uniqueness locks released. A job whose
# last attempt went past its timeout (last_error 'JobTimeout: ...', as the
# worker writes it) is recorded as timed out.
archive_permafailed_jobs = (
    """
  with deleted as (
    delete from {schema}._private_jobs as j
    where j.attempts >= j.max_attempts and j.locked_at is null
    returning j.*
  ),
  archived as (
    insert into {schema}._private_py_job_history (
      job_id, state, task_identifier, queue_name, key, priority, attempts, max_attempts,
      revision, flags, last_error, created_at, run_at, finished_at, timed_out, expires_at
    )
    select d.id, 'failed', t.identifier, q.queue_name, d.key, d.priority, d.attempts,
      d.max_attempts, d.revision, d.flags, d.last_error, d.created_at, d.run_at, d.updated_at,
      coalesce(d.last_error like 'JobTimeout: %%', false), now() + interval '7 days'
    from deleted as d
    join {schema}._private_tasks as t on t.id = d.task_id
    left join {schema}._private_job_queues as q on q.id = d.job_queue_id
    on conflict (job_id) do nothing
    returning job_id, expires_at
  ),"""
    + expiry_ledger("archived")
    + """
  delete from {schema}._private_py_unique_locks as l
  where l.job_id in (select deleted.id from deleted)
"""
)

# Whether the schema has the lifecycle's objects (Python migration 7).
lifecycle_installed = """
  select to_regclass(format('%%I._private_py_job_history', %(schema)s::text)) is not null
"""

# The cancel requests of the jobs a pool holds (worker_cli/worker/cancel_watch.py).
cancel_requests = """
  select c.job_id, c.reason
  from {schema}._private_py_cancellations as c
  where c.pool_id = %(pool_id)s
"""

# Upkeep (with the pruning, by whichever pool wins its lock): a job with a
# cancel request that is no longer locked (its Node worker failed it, its
# crashed pool's jobs were released) is recorded as cancelled; requests of
# jobs that are gone (the job succeeded) are deleted.
finalize_cancelled = (
    """
  with cancelled as (
    delete from {schema}._private_jobs as j
    using {schema}._private_py_cancellations as c
    where c.job_id = j.id and j.locked_at is null
    returning j.*, c.requested_at, c.reason
  ),
  recorded as (
    insert into {schema}._private_py_job_history (
      job_id, state, task_identifier, queue_name, key, priority, attempts, max_attempts,
      revision, flags, last_error, created_at, run_at, finished_at, cancel_requested_at,
      cancel_reason, expires_at
    )
    select d.id, 'cancelled', t.identifier, q.queue_name, d.key, d.priority, d.attempts,
      d.max_attempts, d.revision, d.flags, d.last_error, d.created_at, d.run_at, now(),
      d.requested_at, d.reason, now() + interval '1 day'
    from cancelled as d
    join {schema}._private_tasks as t on t.id = d.task_id
    left join {schema}._private_job_queues as q on q.id = d.job_queue_id
    on conflict (job_id) do nothing
    returning job_id, expires_at
  ),"""
    + expiry_ledger("recorded")
    + """,
  released as (
    delete from {schema}._private_py_unique_locks as l
    where l.job_id in (select cancelled.id from cancelled)
  ),
  stale_requests as (
    delete from {schema}._private_py_cancellations as c
    where not exists (select 1 from {schema}._private_jobs as j where j.id = c.job_id)
       or c.job_id in (select cancelled.id from cancelled)
  )
  select count(*) from cancelled
"""
)

# Cancel jobs (migrations/py/000008.sql): each id with its state after the call.
cancel_jobs = "select id, state from {schema}.py_cancel_jobs(%(job_ids)s::bigint[], %(reason)s)"

# A waiter's interest in a job (wait_for_job): its id gets notify_on_finish,
# if the job is visible (else nothing is written: the waiter tries again at
# its next poll). Returns 1 when the job is visible, 0 when not.
register_waiter = """
  with job as (
    select j.id from {schema}._private_jobs as j where j.id = %(job_id)s
  ),
  registered as (
    insert into {schema}._private_py_job_options as o (job_id, notify_on_finish)
    select job.id, true from job
    on conflict (job_id) do update set notify_on_finish = true
    where not o.notify_on_finish
  )
  select count(*) from job
"""

# Options rows whose job is gone, a bounded number at a time (the sweeper,
# every 8-10 minutes). A success deletes its job's options in its own
# statement; what is left comes from jobs finished otherwise (a Node worker,
# an admin function) or a waiter registering as its job finished. Rows
# younger than 10 minutes are kept: their job may be in a transaction not
# committed yet.
collect_job_options = """
  delete from {schema}._private_py_job_options as o
  where o.job_id in (
    select x.job_id
    from {schema}._private_py_job_options as x
    where x.added_at < now() - interval '10 minutes'
      and not exists (select 1 from {schema}._private_jobs as j where j.id = x.job_id)
    limit %(limit)s
  )
"""

#: The longest channel name PostgreSQL takes, in bytes (NAMEDATALEN - 1).
_CHANNEL_BYTES = 63


def channel(schema: str, kind: str) -> str:
    """The NOTIFY channel ``<schema>:py:<kind>`` (``finished``: waiters are told
    jobs finished; ``cancel``: pools are told jobs were cancelled). A schema
    name too long for PostgreSQL's 63 bytes is cut between characters, and a
    hash of the whole name appended (two long names sharing a beginning still
    get two channels). The SQL function ``py_channel(kind)``
    (migrations/py/000008.sql) gives the same name."""
    suffix = f":py:{kind}"
    name = schema + suffix
    if len(name.encode()) <= _CHANNEL_BYTES:
        return name
    digest = hashlib.sha256(schema.encode()).hexdigest()[:8]
    room = _CHANNEL_BYTES - len(suffix) - len(digest) - 1
    cut = schema.encode()[:room].decode(errors="ignore")
    return f"{cut}~{digest}{suffix}"


def finished_channel(schema: str) -> str:
    """The channel of finished jobs (see :func:`channel`)."""
    return channel(schema, "finished")


# A failure whose task says on_timeout="cancel": a cancel request for each job
# (this pool's, still locked by it), sent with the failure statement in one
# transaction, so that the failure statement records it as cancelled (never
# retried), with the reason %(reasons)s. Primary-key lookups only.
request_cancels = """
  insert into {schema}._private_py_cancellations as c (job_id, reason, pool_id)
  select j.id,
    (select r.reason from unnest(%(job_ids)s::bigint[], %(reasons)s::text[]) as r (id, reason)
     where r.id = j.id limit 1),
    j.locked_by
  from {schema}._private_jobs as j
  where j.id = any(%(job_ids)s::bigint[]) and j.locked_by = %(pool_id)s
  on conflict (job_id) do nothing
"""
