"""Pauses (migrations/py/000014.sql): pausing and resuming a named queue or a
task identifier fleet-wide, listing the pauses, and the pools' upkeep of
them."""

from __future__ import annotations

#: ``locked_by`` of a named queue held for a pause (``hold_queue_lock``).
HELD_BY = "py:paused"


# Pause one queue or task (again: the new resume_at, reason and hold replace
# the old); the pause's row. py_pause tells the pools.
PAUSE = """
  select p.kind, p.name, p.paused_at, p.resume_at, p.reason, p.hold_queue_lock
  from {schema}.py_pause(
    %(kind)s::text, %(name)s::text,
    coalesce(%(resume_at)s::timestamptz, now() + %(resume_in)s::interval), %(reason)s::text,
    %(hold_queue_lock)s::boolean
  ) as p
"""

# Resume one queue or task: whether it was paused.
RESUME = "select {schema}.py_resume(%(kind)s::text, %(name)s::text)"

# The pauses in force (those whose resume_at has passed are over, deleted or not).
LIST_PAUSES = """
  select p.kind, p.name, p.paused_at, p.resume_at, p.reason, p.hold_queue_lock
  from {schema}._private_py_pauses as p
  where p.resume_at is null or p.resume_at > now()
  order by p.kind, p.name
"""

# What a pool reads each poll: the pauses in force, and whether the upkeep
# has work (a pause that ended, or a queue to hold).
POOL_PAUSES = """
  select p.kind, p.name, p.resume_at is null or p.resume_at > now() as in_force,
    p.hold_queue_lock
  from {schema}._private_py_pauses as p
"""

# The upkeep (py_hold_paused_queues): pauses that ended, queues held and freed.
HOLD_PAUSED_QUEUES = "select ended, locked, unlocked from {schema}.py_hold_paused_queues()"
