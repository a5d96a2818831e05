"""Limits (migrations/py/000015.sql and 000020.sql): setting, removing and
listing them, the worker's fetch under them, and operation limits."""

from __future__ import annotations

# Set (or replace) one limit; the stored limit and its use (read by
# py_limit_use, migrations/py/000020.sql: this statement's own snapshot would
# not see the running jobs py_set_limit has just counted).
SET_LIMIT = """
  select l.kind, l.name, l.max_running, l.max_starts, l.period, l.partition_by, l.updated_at,
      u.running, u.recent_starts, u.partitions
  from {schema}.py_set_limit(
    %(kind)s::text, %(name)s::text, %(max_running)s::int, %(max_starts)s::int,
    %(period)s::interval, %(partition_by)s::text
  ) as l
  cross join lateral {schema}.py_limit_use(l.kind, l.name, l.period) as u
"""

# Remove one limit: whether there was one.
REMOVE_LIMIT = "select {schema}.py_remove_limit(%(kind)s::text, %(name)s::text)"

# Every limit and its use, by kind and name.
LIST_LIMITS = """
    select l.kind, l.name, l.max_running, l.max_starts, l.period, l.partition_by, l.updated_at,
    (select count(*) from {schema}._private_py_limit_state as s
      cross join lateral unnest(s.running) as r(id)
      join {schema}._private_jobs as j on j.id = r.id and j.locked_at is not null
      where s.kind = l.kind and s.name = l.name)::int
      + (select coalesce(sum(le.slots), 0) from {schema}._private_py_limit_leases as le
      where le.kind = l.kind and le.name = l.name)::int,
    (select count(*) from {schema}._private_py_limit_state as s
      cross join lateral unnest(s.starts) as x(at)
      where s.kind = l.kind and s.name = l.name and x.at > clock_timestamp() - l.period)::int,
    (select count(*) from {schema}._private_py_limit_state as s
      where s.kind = l.kind and s.name = l.name)::int

  from {schema}._private_py_limits as l
  order by l.kind, l.name
"""

# The limits and their use, bounded, for the dashboard's panel and the
# metrics: at most %(limit)s limits (by kind and name, the primary key of
# _private_py_limits), and of each at most %(partitions)s partition values
# (state rows, by the primary key of _private_py_limit_state), whose running
# jobs are looked up by the jobs' primary key ("= any(array)": an index scan,
# never a join that could hash the jobs table; a running array holds at most
# max_running ids). Per limit: its jobs running and its starts in the current
# window over the partitions read, the busiest partition's of each, and how
# many partitions were read (more than the caller shows: there are more).
LIMIT_USAGE = """
    select l.kind, l.name, l.max_running, l.max_starts, l.period, l.partition_by, l.updated_at,
    (coalesce(u.running, 0) + le.slots)::int as running,
    greatest(coalesce(u.busiest_running, 0), le.busiest)::int as busiest_running,
    coalesce(u.recent_starts, 0)::int as recent_starts,
    coalesce(u.busiest_starts, 0)::int as busiest_starts, u.partitions::int as partitions
  from (
    select * from {schema}._private_py_limits as l order by l.kind, l.name limit %(limit)s
  ) as l
  cross join lateral (
    select sum(p.running) as running, max(p.running) as busiest_running,
      sum(p.starts) as recent_starts, max(p.starts) as busiest_starts, count(*) as partitions
    from (
      select
        (select count(*) from {schema}._private_jobs as j
          where j.id = any(s.running) and j.locked_at is not null) as running,
        (select count(*) from unnest(s.starts) as x(at)
          where x.at > clock_timestamp() - l.period) as starts
      from {schema}._private_py_limit_state as s
      where s.kind = l.kind and s.name = l.name
      order by s.partition
      limit %(partitions)s
    ) as p
  ) as u
  cross join lateral (
    select coalesce(sum(p.slots), 0) as slots, coalesce(max(p.slots), 0) as busiest
    from (
      select sum(le.slots) as slots from {schema}._private_py_limit_leases as le
      where le.kind = l.kind and le.name = l.name
      group by le.partition
    ) as p
  ) as le
  order by l.kind, l.name
"""

# The limits of tasks and queues (the pool then fetches limited jobs too),
# whether each limits starts (its jobs then have a start deadline), and
# whether its slots can be leased (py_fetch_leased_jobs: max_running
# without max_starts), and whether it has partition_by.
LIMITS_EXIST = """
  select l.kind, l.name, l.max_starts is not null,
    l.max_running is not null and l.max_starts is null, l.partition_by is not null
  from {schema}._private_py_limits as l
  where l.kind in ('task', 'queue')
"""

# Lock up to %(limit)s runnable jobs of limited tasks and queues (see
# py_fetch_limited_jobs); the columns of fetch.GET_JOBS.
FETCH_LIMITED = """
  select * from {schema}.py_fetch_limited_jobs(
    %(task_ids)s::int[], %(forbidden_flags)s::text[], %(limit)s::int, %(pool_id)s::text
  )
"""

# The same on the worker's clock (use_local_time).
FETCH_LIMITED_AT = """
  select * from {schema}.py_fetch_limited_jobs(
    %(task_ids)s::int[], %(forbidden_flags)s::text[], %(limit)s::int, %(pool_id)s::text,
    %(now)s::timestamptz
  )
"""

# Lock up to %(limit)s runnable jobs of each leased task ahead and set this
# pool's leases of their limits' keys (see py_fetch_leased_jobs); the
# columns of fetch.GET_JOBS. One element per key the pool leases or holds
# jobs of: its task (%(key_tasks)s), partition value, and the pool's
# holding, running and queued counts.
FETCH_LEASED = """
  select * from {schema}.py_fetch_leased_jobs(
    %(task_ids)s::int[], %(forbidden_flags)s::text[], %(limit)s::int, %(pool_id)s::text,
    %(key_tasks)s::text[], %(key_parts)s::text[], %(holding)s::int[], %(running)s::int[],
    %(queued)s::int[], %(concurrency)s::int
  )
"""

# The same on the worker's clock (use_local_time).
FETCH_LEASED_AT = """
  select * from {schema}.py_fetch_leased_jobs(
    %(task_ids)s::int[], %(forbidden_flags)s::text[], %(limit)s::int, %(pool_id)s::text,
    %(key_tasks)s::text[], %(key_parts)s::text[], %(holding)s::int[], %(running)s::int[],
    %(queued)s::int[], %(concurrency)s::int, %(now)s::timestamptz
  )
"""

# This pool's leases: how many jobs of each key (task, partition value) it
# may run from now on.
POOL_LEASES = """
  select le.name, le.partition, le.target
  from {schema}._private_py_limit_leases as le
  where le.pool_id = %(pool_id)s::text and le.kind = 'task'
"""

# The partition values of jobs fetched under leases of partitioned limits
# (as py_fetch_leased_jobs keyed them: py_limit_partition).
LEASED_PARTITIONS = """
  select j.id, {schema}.py_limit_partition(j.payload, l.partition_by)
  from {schema}._private_jobs as j
  join {schema}._private_tasks as t on t.id = j.task_id
  join {schema}._private_py_limits as l on l.kind = 'task' and l.name = t.identifier
  where j.id = any(%(job_ids)s::bigint[]) and l.partition_by is not null
"""

# Seconds until a full rate limit of these tasks (or of a queue) has room for
# %(wanted)s starts again (null: none is full by its rate).
NEXT_START = """
  select extract(epoch from {schema}.py_limits_next_start(%(task_ids)s::int[], %(wanted)s::int)
    - clock_timestamp())::float8
"""

# Remove the starts of jobs given back without starting (py_uncount_starts).
UNCOUNT_STARTS = "select {schema}.py_uncount_starts(%(job_ids)s::bigint[], %(pool_id)s::text)"

# An operation limit, inside a task (helpers.limit): null when taken, else the
# seconds to wait (-1: no such limit).
ACQUIRE_OPERATION = """
  select {schema}.py_limit_acquire(%(name)s::text, %(partition)s::text, %(holder)s::bigint)
"""

# The holder's slot of an operation limit is free again.
RELEASE_OPERATION = """
  select {schema}.py_limit_release(%(name)s::text, %(partition)s::text, %(holder)s::bigint)
"""

# Declared limits (migrations/py/000024.sql): whether the table is there (a
# schema before it: a pool applies every declaration that differs, as before).
DECLARED_LIMITS_INSTALLED = """
  select to_regclass(format('%%I._private_py_declared_limits', %(schema)s::text)) is not null
"""

# The declarations recorded for these tasks.
DECLARED_LIMITS = """
  select d.task_identifier, d.declaration
  from {schema}._private_py_declared_limits as d
  where d.task_identifier = any(%(tasks)s::text[])
"""

# Record a task's declaration as applied (two pools starting at once both
# write it: the last one stays).
RECORD_DECLARED_LIMIT = """
  insert into {schema}._private_py_declared_limits as d (task_identifier, declaration)
  values (%(task)s::text, %(declaration)s::jsonb)
  on conflict (task_identifier) do update
    set declaration = excluded.declaration, declared_at = now()
"""

# Forget the declarations of tasks that declare no limit any more (their
# stored limits stay).
FORGET_DECLARED_LIMITS = """
  delete from {schema}._private_py_declared_limits
  where task_identifier = any(%(tasks)s::text[])
"""
