"""The statements of the admin subcommands (``graphile-worker jobs``,
``retry``, ``reschedule``, ``fail``, ``remove``, ``cancel``) and the
dashboard's bulk actions.

Jobs are chosen by filters (task, named queue, state, key, ids; a null
parameter turns a filter off) and listed, counted, or walked by id in
batches: one statement each, the state (none, or one of :data:`STATES`:
py_job_state's word, a pause counted) a parameter like the other filters.
The actions go through graphile-worker's own admin functions
(``reschedule_jobs``, ``permanently_fail_jobs``, ``complete_jobs``), so a
job locked by a worker (less than 4 hours ago) is left alone exactly as
those functions leave it; each action statement takes one batch of ids and
returns each id, in the order given, with what became of it: changed; locked
(a worker holds it: left alone); missing (no such job); unchanged (the
action does not apply to it). The job rows read there
are those from before the statement.
"""

from __future__ import annotations

from typing import LiteralString

from .jobs import _RECORD_REMOVED

#: The states of a job in the jobs table (py_job_state, migrations/py/
#: functions.sql), as every command prints them: each job is exactly one.
LIVE_STATES: tuple[str, ...] = ("waiting", "scheduled", "retrying", "paused", "running", "failed")
#: The other words a command prints for a job: finished (the history, ``job
#: ID``) or gone without a trace (``unknown``). ``--state`` takes them too;
#: they select no job of the jobs table.
FINISHED_STATES: tuple[str, ...] = ("succeeded", "cancelled", "removed", "unknown")
#: Every word ``--state`` takes (earlier versions' words are aliases too:
#: :data:`worker_cli.jobs.job_state.STATE_ALIASES`).
STATES: tuple[str, ...] = LIVE_STATES + FINISHED_STATES

# Up to %(limit)s jobs matching the filters, newest (highest id) first, with
# their task, queue, state and payload (`jobs --json` prints it whole; the
# table leaves it out) (jobs_pkey1, backward).
LIST_JOBS: LiteralString = """
  select j.id, t.identifier as task_identifier, q.queue_name,
    {schema}.py_job_state(j.locked_at, j.attempts, j.max_attempts, j.run_at, p.paused_by)
      as state,
    case when j.locked_at is null and j.attempts < j.max_attempts then p.paused_by end
      as paused_by,
    j.attempts, j.max_attempts, j.priority, j.run_at, j.created_at, j.key,
    j.locked_by, j.locked_at, j.last_error, j.payload
  from {schema}._private_jobs as j
  join {schema}._private_tasks as t on t.id = j.task_id
  left join {schema}._private_job_queues as q on q.id = j.job_queue_id
  cross join lateral (
    select {schema}.py_paused_by(j.task_id, j.job_queue_id) as paused_by
  ) as p
  where
    (%(task)s::text is null or j.task_id = (
      select t.id from {schema}._private_tasks as t where t.identifier = %(task)s::text))
    and (%(queue)s::text is null or j.job_queue_id = (
      select q.id from {schema}._private_job_queues as q where q.queue_name = %(queue)s::text))
    and (%(key)s::text is null or j.key = %(key)s::text)
    and (%(ids)s::bigint[] is null or j.id = any(%(ids)s::bigint[]))
    and (%(state)s::text is null or %(state)s::text = {schema}.py_job_state(
      j.locked_at, j.attempts, j.max_attempts, j.run_at, p.paused_by))
  order by j.id desc
  limit %(limit)s
"""

# How many jobs match the filters, how many of them a worker holds (the
# actions will skip them), and the highest id (the actions go no further: a
# job added after the count is not touched).
COUNT_JOBS: LiteralString = """
  select count(*),
      count(*) filter (where j.locked_at is not null and j.locked_at >= now() - interval '4
      hours'), coalesce(max(j.id), 0)
  from {schema}._private_jobs as j
  where
    (%(task)s::text is null or j.task_id = (
      select t.id from {schema}._private_tasks as t where t.identifier = %(task)s::text))
    and (%(queue)s::text is null or j.job_queue_id = (
      select q.id from {schema}._private_job_queues as q where q.queue_name = %(queue)s::text))
    and (%(key)s::text is null or j.key = %(key)s::text)
    and (%(ids)s::bigint[] is null or j.id = any(%(ids)s::bigint[]))
    and (%(state)s::text is null or %(state)s::text = {schema}.py_job_state(
      j.locked_at, j.attempts, j.max_attempts, j.run_at,
      {schema}.py_paused_by(j.task_id, j.job_queue_id)))
"""

# The ids of the next %(batch)s matching jobs above %(after)s, up to
# %(upto)s, in id order (jobs_pkey1): the actions walk the matches so; by
# state (None: any).
NEXT_BATCH: LiteralString = """
  select j.id
  from {schema}._private_jobs as j
  where
    (%(task)s::text is null or j.task_id = (
      select t.id from {schema}._private_tasks as t where t.identifier = %(task)s::text))
    and (%(queue)s::text is null or j.job_queue_id = (
      select q.id from {schema}._private_job_queues as q where q.queue_name = %(queue)s::text))
    and (%(key)s::text is null or j.key = %(key)s::text)
    and (%(ids)s::bigint[] is null or j.id = any(%(ids)s::bigint[]))
    and (%(state)s::text is null or %(state)s::text = {schema}.py_job_state(
      j.locked_at, j.attempts, j.max_attempts, j.run_at,
      {schema}.py_paused_by(j.task_id, j.job_queue_id)))
    and j.id > %(after)s and j.id <= %(upto)s
  order by j.id
  limit %(batch)s
"""

# The id of the job with this key (graphile-worker's job_key is unique).
JOB_ID_BY_KEY = """
  select j.id from {schema}._private_jobs as j where j.key = %(key)s::text
"""

# The end of each action's statement (but cancel's): each id asked for, in
# order, with its outcome: changed (in "acted", the action's CTE of the jobs it
# changed), missing (no such job), locked (a worker holds it: left alone), or
# unchanged.
_OUTCOMES: LiteralString = """
  select i.id,
    case
      when a.id is not null then 'changed'
      when j.id is null then 'missing'
      when j.locked_at is not null and j.locked_at >= now() - interval '4 hours' then 'locked'
      else 'unchanged'
    end
  from unnest(%(ids)s::bigint[]) with ordinality as i (id, n)
  left join acted as a on a.id = i.id
  left join {schema}._private_jobs as j on j.id = i.id
  order by i.n
"""

# retry's jobs (target) and the jobs it made runnable now with their attempts
# reset (acted): a job due later is due now, one due already keeps its run_at.
_RETRIED: LiteralString = """
  with target as materialized (
    select j.id, j.run_at > now() as later, j.attempts, j.task_id
    from {schema}._private_jobs as j
    where j.id = any(%(ids)s::bigint[])
  ),
  acted as materialized (
    select r.id from {schema}.reschedule_jobs(
      array(select t.id from target as t where t.later), run_at => now(), attempts => 0
    ) as r
    union all
    select r.id from {schema}.reschedule_jobs(
      array(select t.id from target as t where not t.later), attempts => 0
    ) as r
  )"""

#: The action statements by subcommand ("remove+unique": with the unique-jobs
#: table installed; "retry+marked" and "remove+recorded": with the on-call
#: objects of migrations/py/000023.sql as well). retry: runnable now with its
#: attempts reset to 0 (max_attempts kept; its last_error kept); a job already
#: due keeps its run_at (its place in line); "retry+marked" also marks, among
#: the attempt errors of a job attempted before, where its attempt numbers
#: start again at 1 (a row with retried_by %(by)s: 'cli', 'dashboard'; its
#: attempt the attempts it had). reschedule: the fields given (null: kept);
#: run_at is %(run_at)s, or now() plus %(delay)s. fail: attempts used up,
#: last_error "<reason> (was: <last_error>)" (the reason alone for a job
#: that never failed), so the real error is kept; permanently_fail_jobs once
#: per distinct message; a job already failed for good is left as it is
#: (unchanged). remove: complete_jobs (the jobs are deleted); with the
#: uniqueness locks of the removed jobs (a job an administrator removed does
#: not block its duplicates, as remove_job); "remove+recorded" also records
#: each in the history as removed (removed_by %(by)s, kept a day; listed in
#: the expiry ledger: a batch is at most 1,000 ids, one ledger row).
ACTIONS: dict[str, LiteralString] = {
    "retry": _RETRIED + _OUTCOMES,
    "retry+marked": _RETRIED
    + """,
  marked as (
    insert into {schema}._private_py_job_errors (
      job_id, task_identifier, attempt, retried, retried_by
    )
    select t.id, k.identifier, t.attempts, false, %(by)s::text
    from target as t
    join {schema}._private_tasks as k on k.id = t.task_id
    where t.attempts > 0 and t.id in (select a.id from acted as a)
  )
"""
    + _OUTCOMES,
    "reschedule": """
  with acted as materialized (
    select r.id from {schema}.reschedule_jobs(
      %(ids)s::bigint[],
      run_at => coalesce(%(run_at)s::timestamptz, now() + %(delay)s::interval),
      priority => %(priority)s::int,
      attempts => %(attempts)s::int,
      max_attempts => %(max_attempts)s::int
    ) as r
  )
"""
    + _OUTCOMES,
    "fail": """
  with target as materialized (
    select j.id,
      case when j.last_error is null then %(reason)s::text
        else %(reason)s::text || ' (was: ' || j.last_error || ')' end as message
    from {schema}._private_jobs as j
    where j.id = any(%(ids)s::bigint[]) and j.attempts < j.max_attempts
  ),
  acted as materialized (
    select f.id
    from (
      select t.message, array_agg(t.id) as ids from target as t group by t.message
    ) as g
    cross join lateral {schema}.permanently_fail_jobs(g.ids, g.message) as f
  )
"""
    + _OUTCOMES,
    "remove": """
  with acted as materialized (
    select c.id from {schema}.complete_jobs(%(ids)s::bigint[]) as c
  )
"""
    + _OUTCOMES,
    "remove+unique": """
  with acted as materialized (
    select c.id from {schema}.complete_jobs(%(ids)s::bigint[]) as c
  ),
  released as (
    delete from {schema}._private_py_unique_locks as l
    where l.job_id in (select a.id from acted as a)
  )
"""
    + _OUTCOMES,
    # cancel: py_cancel_jobs (migrations/py/functions.sql); its states as
    # outcomes: cancelled now (the job row was there before the statement) is
    # changed, running (told to stop) is stopped, a job finished already (in
    # the history, cancelled before included) is unchanged, unknown is missing.
    "cancel": """
  with acted as materialized (
    select c.id, c.state from {schema}.py_cancel_jobs(%(ids)s::bigint[], %(reason)s::text) as c
  )
  select i.id,
    case
      when a.state = 'cancelled' and j.id is not null then 'changed'
      when a.state = 'running' then 'stopped'
      when a.state = 'unknown' then 'missing'
      else 'unchanged'
    end
  from unnest(%(ids)s::bigint[]) with ordinality as i (id, n)
  join (select distinct on (acted.id) acted.id, acted.state from acted) as a on a.id = i.id
  left join {schema}._private_jobs as j on j.id = i.id
  order by i.n
""",
    "remove+recorded": """
  with removed as materialized (
    select c.* from {schema}.complete_jobs(%(ids)s::bigint[]) as c
  ),
  acted as (select removed.id from removed)"""
    + _RECORD_REMOVED
    + _OUTCOMES,
}

# remove --key: graphile-worker's remove_job (a job a worker holds keeps
# running, but loses its key and will not be retried); the job, and whether a
# worker held it (so it was not deleted).
REMOVE_BY_KEY = """
  select j.id, j.locked_at is not null and j.locked_at >= now() - interval '4 hours'
  from {schema}.remove_job(%(key)s::text) as j
  where j.id is not null
"""

# REMOVE_BY_KEY, and the uniqueness lock of its job (as
# jobs.REMOVE_JOB_RELEASING_UNIQUE_LOCK).
REMOVE_BY_KEY_RELEASING = """
  with removed as materialized (
    select j.* from {schema}.remove_job(%(key)s::text) as j where j.id is not null
  ),
  released as (
    delete from {schema}._private_py_unique_locks as l
    where l.job_id in (select removed.id from removed)
  )
  select j.id, j.locked_at is not null and j.locked_at >= now() - interval '4 hours'
  from removed as j
"""

# REMOVE_BY_KEY_RELEASING, a job it deleted recorded in the history as removed
# (removed_by %(by)s, kept a day), as the remove action's
# (migrations/py/000023.sql).
REMOVE_BY_KEY_RECORDED = (
    """
  with removed as materialized (
    select j.* from {schema}.remove_job(%(key)s::text) as j where j.id is not null
  )"""
    + _RECORD_REMOVED
    + """
  select j.id, j.locked_at is not null and j.locked_at >= now() - interval '4 hours'
  from removed as j
"""
)
