"""The workflows' repair sweep, one loop of each pool: about every 2 seconds
it records the outcome of workflow steps whose jobs ended without their
workflow being told, and advances those workflows (``py_workflow_repair``).

A Python worker of this version tells a step's workflow in the transaction
that ends its job, so the sweep finds nothing after it. It is for the rest:
a step run by a Node worker (its row deleted on success, nothing of ours
written: the step succeeded with no result), one failed for good or removed
by an admin function, or run by a Python worker of an earlier version. Pools
that sweep at the same moment take turns on each workflow's lock; the second
finds nothing left to record.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from ...db.backoff import one_line
from ...sql import compose
from ...sql import workflows as workflows_sql

__all__ = ["REPAIR_BATCH", "WorkflowRepair"]

logger = logging.getLogger("graphile_worker")

#: Steps one sweep records at most (the rest at the next).
REPAIR_BATCH = 1000


class WorkflowRepair:
    """Runs the repair sweep every ``interval`` seconds (jittered by a quarter)."""

    def __init__(self, db: AsyncConnectionPool[Any], *, schema: str, interval: float = 2.0) -> None:
        self._db = db
        self._statement = compose(workflows_sql.REPAIR_WORKFLOWS, schema)
        self._interval = interval

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval * random.uniform(0.75, 1.25))
            await self.sweep()

    async def sweep(self) -> int | None:
        """One sweep: how many steps it recorded (None: the database failed,
        which is logged at debug level: the next sweep tries again)."""
        try:
            async with self._db.connection() as conn:
                cur = await conn.execute(self._statement, {"max_steps": REPAIR_BATCH})
                row = await cur.fetchone()
        except psycopg.Error as exc:
            logger.debug("The workflows' repair sweep failed: %s", one_line(exc))
            return None
        repaired = int(row[0]) if row and row[0] is not None else 0
        if repaired:
            logger.debug("Recorded the outcome of %d workflow step(s) ended elsewhere", repaired)
        return repaired
