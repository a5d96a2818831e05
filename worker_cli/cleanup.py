"""``cleanup``: what each task deletes, and the batched sweep of uniqueness locks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, LiteralString, TypeAlias

import psycopg

from . import statements

__all__ = ["CLEANUP_STATEMENTS", "CleanupTask", "check_cleanup_tasks", "delete_unique_locks"]

CleanupTask: TypeAlias = Literal[
    "GC_TASK_IDENTIFIERS", "GC_JOB_QUEUES", "DELETE_PERMAFAILED_JOBS", "GC_UNIQUE_LOCKS"
]

#: Each task's statement, in the order they run.
CLEANUP_STATEMENTS: dict[str, LiteralString] = {
    # Permafailed jobs first, so the queues and tasks they used can go too.
    "DELETE_PERMAFAILED_JOBS": statements.delete_permafailed_jobs,
    "GC_JOB_QUEUES": statements.gc_job_queues,
    "GC_TASK_IDENTIFIERS": statements.gc_task_identifiers,
    # Not a statement: see delete_unique_locks.
    "GC_UNIQUE_LOCKS": statements.gc_unique_locks,
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


async def delete_unique_locks(conn: psycopg.AsyncConnection[Any], schema: str) -> int:
    """Delete the uniqueness locks that can never block again, a few hundred per
    transaction (``conn`` is in autocommit mode) until none is left; return how
    many. Locks busy with a concurrent add are left for the next run."""
    query = statements.compose(statements.gc_unique_locks, schema)
    total = 0
    while True:
        cur = await conn.execute(query, {"max_rows": GC_UNIQUE_BATCH})
        row = await cur.fetchone()
        deleted = int(row[0]) if row else 0
        total += deleted
        if deleted < GC_UNIQUE_BATCH:
            return total
