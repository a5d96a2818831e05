"""``cleanup``: what each task deletes, and the batched sweep of uniqueness locks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, LiteralString, TypeAlias

from ..db.plan import Plan, query
from ..sql import cleanup as cleanup_sql
from ..sql import compose

__all__ = ["CLEANUP_STATEMENTS", "CleanupTask", "check_cleanup_tasks", "delete_unique_locks"]

CleanupTask: TypeAlias = Literal[
    "GC_TASK_IDENTIFIERS", "GC_JOB_QUEUES", "DELETE_PERMAFAILED_JOBS", "GC_UNIQUE_LOCKS"
]

#: Each task's statement, in the order they run.
CLEANUP_STATEMENTS: dict[str, LiteralString] = {
    # Permafailed jobs first, so the queues and tasks they used can go too.
    "DELETE_PERMAFAILED_JOBS": cleanup_sql.DELETE_PERMAFAILED_JOBS,
    "GC_JOB_QUEUES": cleanup_sql.GC_JOB_QUEUES,
    "GC_TASK_IDENTIFIERS": cleanup_sql.GC_TASK_IDENTIFIERS,
    # Not a statement: see delete_unique_locks.
    "GC_UNIQUE_LOCKS": cleanup_sql.GC_UNIQUE_LOCKS,
}

#: Uniqueness locks deleted per transaction by delete_unique_locks.
GC_UNIQUE_BATCH = 500


def check_cleanup_tasks(tasks: Sequence[str]) -> None:
    """Refuse task names that are not cleanup tasks."""
    unknown = [task for task in tasks if task not in CLEANUP_STATEMENTS]
    if unknown:
        raise ValueError(
            f"unknown cleanup task(s) {', '.join(unknown)}; "
            f"expected {', '.join(CLEANUP_STATEMENTS)}"
        )


def delete_unique_locks(schema: str) -> Plan[int]:
    """Delete the uniqueness locks that can never block again, a few hundred per
    statement until none is left; return how many. In autocommit mode each
    batch is its own transaction (WorkerUtils runs it so on its own
    connections); inside the caller's transaction they all join it. Locks busy
    with a concurrent add are left for the next run."""
    statement = compose(cleanup_sql.GC_UNIQUE_LOCKS, schema)
    total = 0
    while True:
        rows = yield from query(statement, {"max_rows": GC_UNIQUE_BATCH})
        deleted = int(rows[0][0]) if rows else 0
        total += deleted
        if deleted < GC_UNIQUE_BATCH:
            return total
