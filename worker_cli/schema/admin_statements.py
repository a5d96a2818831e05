"""The statements of the admin subcommands (``graphile-worker jobs``,
``retry``, ``reschedule``, ``fail``, ``remove``): templates over the schema
name, composed with :func:`.statements.compose`.

Jobs are chosen by filters (task, named queue, state, key, ids) and listed,
counted, or walked by id in batches. The actions go through graphile-worker's
own admin functions (``reschedule_jobs``, ``permanently_fail_jobs``,
``complete_jobs``), so a job locked by a worker (less than 4 hours ago) is
left alone exactly as those functions leave it; each action statement takes
one batch of ids and says what became of each.
"""

from __future__ import annotations

from typing import LiteralString

__all__ = [
    "ACTIONS",
    "STATES",
    "count_jobs",
    "job_id_by_key",
    "list_jobs",
    "next_batch",
    "remove_by_key",
    "remove_by_key_releasing",
]

#: The states ``--state`` takes, as ``graphile-worker status`` counts them
#: (worker_cli.observe.status_statements.STATE_COUNTS): every job is exactly one
#: of waiting, scheduled, locked and permanently_failed; retrying is the
#: waiting and scheduled jobs attempted before. Predicates on the row ``j``.
STATES: dict[str, LiteralString] = {
    "waiting": "j.locked_at is null and j.attempts < j.max_attempts and j.run_at <= now()",
    "scheduled": "j.locked_at is null and j.attempts < j.max_attempts and j.run_at > now()",
    "locked": "j.locked_at is not null",
    "permanently_failed": "j.locked_at is null and j.attempts >= j.max_attempts",
    "retrying": "j.locked_at is null and j.attempts < j.max_attempts and j.attempts > 0",
}

# The state of the row j: one of the first four STATES.
_STATE: LiteralString = """case
      when j.locked_at is not null then 'locked'
      when j.attempts >= j.max_attempts then 'permanently_failed'
      when j.run_at <= now() then 'waiting'
      else 'scheduled' end"""

# What graphile-worker's admin functions leave alone: a job locked less than
# 4 hours ago (an older lock is a crashed worker's).
_HELD: LiteralString = "j.locked_at is not null and j.locked_at >= now() - interval '4 hours'"

# The filters a null parameter turns off: task, named queue, key, ids.
_FILTERS: LiteralString = """
    (%(task)s::text is null or j.task_id = (
      select t.id from {schema}._private_tasks as t where t.identifier = %(task)s::text))
    and (%(queue)s::text is null or j.job_queue_id = (
      select q.id from {schema}._private_job_queues as q where q.queue_name = %(queue)s::text))
    and (%(key)s::text is null or j.key = %(key)s::text)
    and (%(ids)s::bigint[] is null or j.id = any(%(ids)s::bigint[]))"""


def _where(state: str | None) -> LiteralString:
    """The where clause of the filters, and of ``state`` (one of STATES) if given."""
    if state is None:
        return "\n  where" + _FILTERS
    return "\n  where" + _FILTERS + "\n    and (" + STATES[state] + ")"


def list_jobs(state: str | None) -> LiteralString:
    """Up to %(limit)s jobs matching the filters, newest (highest id) first,
    with their task, queue and state (jobs_pkey1, backward)."""
    return (
        """
  select j.id, t.identifier as task_identifier, q.queue_name, """
        + _STATE
        + """ as state,
    (j.locked_at is null and j.attempts < j.max_attempts and j.attempts > 0) as retrying,
    j.attempts, j.max_attempts, j.priority, j.run_at, j.created_at, j.key,
    j.locked_by, j.locked_at, j.last_error
  from {schema}._private_jobs as j
  join {schema}._private_tasks as t on t.id = j.task_id
  left join {schema}._private_job_queues as q on q.id = j.job_queue_id"""
        + _where(state)
        + """
  order by j.id desc
  limit %(limit)s
"""
    )


def count_jobs(state: str | None) -> LiteralString:
    """How many jobs match the filters, how many of them a worker holds (the
    actions will skip them), and the highest id (the actions go no further:
    a job added after the count is not touched)."""
    return (
        """
  select count(*), count(*) filter (where """
        + _HELD
        + """), coalesce(max(j.id), 0)
  from {schema}._private_jobs as j"""
        + _where(state)
    )


def next_batch(state: str | None) -> LiteralString:
    """The ids of the next %(batch)s matching jobs above %(after)s, up to
    %(upto)s, in id order (jobs_pkey1): the actions walk the matches so."""
    return (
        """
  select j.id
  from {schema}._private_jobs as j"""
        + _where(state)
        + """
    and j.id > %(after)s and j.id <= %(upto)s
  order by j.id
  limit %(batch)s
"""
    )


# The id of the job with this key (graphile-worker's job_key is unique).
job_id_by_key = "select j.id from {schema}._private_jobs as j where j.key = %(key)s::text"


def _outcomes(
    target: LiteralString, acted: LiteralString, after: LiteralString = ""
) -> LiteralString:
    """A statement acting on the jobs %(ids)s: ``target`` (CTEs before
    ``acted``, each followed by a comma; may be empty), ``acted`` (a select of
    the changed jobs' ids) and ``after`` (CTEs after it, each after a comma).
    Returns each id, in the order given, with what became of it:
    changed; locked (a worker holds it: left alone); missing (no such job);
    unchanged (the action does not apply to it). The job rows read here are
    those from before the statement."""
    return (
        """
  with """
        + target
        + """acted as materialized ("""
        + acted
        + """
  )"""
        + after
        + """
  select i.id,
    case
      when a.id is not null then 'changed'
      when j.id is null then 'missing'
      when """
        + _HELD
        + """ then 'locked'
      else 'unchanged'
    end
  from unnest(%(ids)s::bigint[]) with ordinality as i (id, n)
  left join acted as a on a.id = i.id
  left join {schema}._private_jobs as j on j.id = i.id
  order by i.n
"""
    )


# retry: runnable now with its attempts reset to 0 (max_attempts kept; its
# last_error kept); a job already due keeps its run_at (its place in line).
_retry = _outcomes(
    """target as materialized (
    select j.id, j.run_at > now() as later
    from {schema}._private_jobs as j
    where j.id = any(%(ids)s::bigint[])
  ),
  """,
    """
    select r.id from {schema}.reschedule_jobs(
      array(select t.id from target as t where t.later), run_at => now(), attempts => 0
    ) as r
    union all
    select r.id from {schema}.reschedule_jobs(
      array(select t.id from target as t where not t.later), attempts => 0
    ) as r""",
)

# reschedule: the fields given (null: kept); run_at is %(run_at)s, or now()
# plus %(delay)s.
_reschedule = _outcomes(
    "",
    """
    select r.id from {schema}.reschedule_jobs(
      %(ids)s::bigint[],
      run_at => coalesce(%(run_at)s::timestamptz, now() + %(delay)s::interval),
      priority => %(priority)s::int,
      attempts => %(attempts)s::int,
      max_attempts => %(max_attempts)s::int
    ) as r""",
)

# fail: attempts used up, last_error "<reason> (was: <last_error>)" (the
# reason alone for a job that never failed), so the real error is kept;
# permanently_fail_jobs once per distinct message. A job already failed for
# good is left as it is (unchanged): its error is not wrapped again.
_fail = _outcomes(
    """target as materialized (
    select j.id,
      case when j.last_error is null then %(reason)s::text
        else %(reason)s::text || ' (was: ' || j.last_error || ')' end as message
    from {schema}._private_jobs as j
    where j.id = any(%(ids)s::bigint[]) and j.attempts < j.max_attempts
  ),
  """,
    """
    select f.id
    from (
      select t.message, array_agg(t.id) as ids from target as t group by t.message
    ) as g
    cross join lateral {schema}.permanently_fail_jobs(g.ids, g.message) as f""",
)

# remove: complete_jobs (the jobs are deleted).
_remove = _outcomes("", "\n    select c.id from {schema}.complete_jobs(%(ids)s::bigint[]) as c")

# remove, and the uniqueness locks of the removed jobs (a job an
# administrator removed does not block its duplicates, as remove_job).
_remove_releasing = _outcomes(
    "",
    "\n    select c.id from {schema}.complete_jobs(%(ids)s::bigint[]) as c",
    """,
  released as (
    delete from {schema}._private_py_unique_locks as l
    where l.job_id in (select a.id from acted as a)
  )""",
)

#: The action statements by subcommand ("remove+unique": with the unique-jobs
#: table installed).
ACTIONS: dict[str, LiteralString] = {
    "retry": _retry,
    "reschedule": _reschedule,
    "fail": _fail,
    "remove": _remove,
    "remove+unique": _remove_releasing,
}

# remove --key: graphile-worker's remove_job (a job a worker holds keeps
# running, but loses its key and will not be retried); the job, and whether a
# worker held it (so it was not deleted).
remove_by_key = (
    """
  select j.id, """
    + _HELD
    + """
  from {schema}.remove_job(%(key)s::text) as j
  where j.id is not null
"""
)

# remove_by_key, and the uniqueness lock of its job (as
# statements.remove_job_releasing_unique_lock).
remove_by_key_releasing = (
    """
  with removed as materialized (
    select j.* from {schema}.remove_job(%(key)s::text) as j where j.id is not null
  ),
  released as (
    delete from {schema}._private_py_unique_locks as l
    where l.job_id in (select removed.id from removed)
  )
  select j.id, """
    + _HELD
    + """
  from removed as j
"""
)
