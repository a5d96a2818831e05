"""The job lifecycle's history (migrations/py/000007.sql, 000011.sql,
000018.sql): pruning expired history rows and attempt errors, and whether the
schema has the lifecycle's objects."""

from __future__ import annotations

# Delete expired history rows, if this session wins the pruning lock (one
# pool prunes at a time): the oldest expired rows of the expiry ledger (at
# most %(scan)s of them, through its expires_at index: bounded whatever the
# tables hold), as many as list together fewer than %(limit)s ids before the
# last one (at least one row; a row lists at most 1,000), and the history
# rows of their ids (primary key). Returns how many history rows were
# deleted (null when another pool holds the lock), how many ledger rows, and
# how many ids they listed.
PRUNE_HISTORY = """
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
PRUNE_ATTEMPT_ERRORS = """
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

# Whether the schema has the lifecycle's objects (Python migration 7).
LIFECYCLE_INSTALLED = """
  select to_regclass(format('%%I._private_py_job_history', %(schema)s::text)) is not null
"""
