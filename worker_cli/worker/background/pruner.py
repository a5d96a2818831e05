"""The pruner: deletes expired job history and attempt errors, whichever pool
wins the lock, and records as cancelled the jobs whose cancel request nobody
can act on.

Every 1 to 2 minutes (a random moment, so that pools started together do not
prune together) each pool tries; the one that wins a transaction-level
advisory lock deletes expired rows of ``_private_py_job_history`` in batches
of about :data:`BATCH`, found through the expiry ledger (one row per statement
that recorded jobs, listing their ids: migrations/py/000011.sql), at most
:data:`SCAN` ledger rows a batch through its ``expires_at`` index (bounded
whatever the tables hold), at most :data:`MAX_BATCHES` batches a turn, so a
backlog after a long stop is worked off over several turns without a long
transaction. The attempt errors (migrations/py/000018.sql) go the same way,
oldest id first, :data:`BATCH` rows a statement. No task has to be scheduled
for it, as procrastinate's and Celery's users must.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

from ...client.worker_utils import WorkerUtils
from ...sql import cancel as cancel_sql
from ...sql import compose
from ...sql import history as history_sql
from ...sql import job_logs as job_logs_sql
from ...sql import job_progress as job_progress_sql
from ...sql import workflows as workflows_sql

__all__ = ["BATCH", "MAX_BATCHES", "SCAN", "HistoryPruner"]

logger = logging.getLogger("graphile_worker")

#: History rows deleted by one statement (one transaction): ledger rows are
#: taken while they list fewer ids before them, so a batch deletes at least
#: one ledger row's and at most BATCH + 999 history rows.
BATCH = 10_000
#: Ledger rows one statement looks at, at most (a turn of one-job batches,
#: as a quiet pool writes, still deletes SCAN * MAX_BATCHES jobs).
SCAN = 10_000
#: Batches one turn deletes at most.
MAX_BATCHES = 20
#: How long a failed or cancelled workflow is kept (succeeded ones: as the
#: history's successes, ``keep_succeeded``).
KEEP_UNSUCCESSFUL_WORKFLOWS = timedelta(days=7)
#: First key of the pruning lock (the second is the schema's hash).
_LOCK_NAMESPACE = 0x67775068  # "gwPh"


class HistoryPruner:
    """Deletes expired history rows every ``interval`` seconds (a random value
    in the range)."""

    def __init__(
        self,
        utils: WorkerUtils,
        *,
        schema: str,
        interval: tuple[float, float],
        keep_succeeded: timedelta = timedelta(days=1),
    ) -> None:
        self._utils = utils
        self._keep_succeeded = keep_succeeded
        self._prune_workflows = compose(workflows_sql.PRUNE_WORKFLOWS, schema)
        self._schema = schema
        self._statement = compose(history_sql.PRUNE_HISTORY, schema)
        self._finalize = compose(cancel_sql.RECORD_CANCELLED, schema)
        self._prune_errors = compose(history_sql.PRUNE_ATTEMPT_ERRORS, schema)
        self._prune_logs = compose(job_logs_sql.PRUNE_JOB_LOGS, schema)
        self._prune_progress = compose(job_progress_sql.PRUNE_PROGRESS, schema)
        self._interval = interval

    async def run(self) -> None:
        low, high = self._interval
        while True:
            await asyncio.sleep(random.uniform(low, high))
            await self.prune()
            await self.prune_attempt_errors()
            await self.prune_job_logs()
            await self.finalize_cancelled()
            await self.prune_workflows()

    async def prune_workflows(self) -> int | None:
        """Delete finished workflows (with their steps and links): succeeded
        ones after the history's ``keep_succeeded``, failed and cancelled ones
        after :data:`KEEP_UNSUCCESSFUL_WORKFLOWS` (time to retry them). How
        many (None: the database failed, which is logged)."""
        total = 0
        try:
            for state, keep in (
                ("succeeded", self._keep_succeeded),
                ("failed", KEEP_UNSUCCESSFUL_WORKFLOWS),
                ("cancelled", KEEP_UNSUCCESSFUL_WORKFLOWS),
            ):
                async with self._utils.pool.connection() as conn:
                    cur = await conn.execute(
                        self._prune_workflows, {"state": state, "keep": keep, "max_rows": 1000}
                    )
                    row = await cur.fetchone()
                total += int(row[0]) if row else 0
        except psycopg.Error as exc:
            logger.warning("Pruning finished workflows failed: %s", exc)
            return None
        return total

    async def finalize_cancelled(self) -> int | None:
        """Record as cancelled the jobs with a cancel request that nobody holds
        any more (a Node worker failed one; a crashed pool's were released),
        and delete requests and options of jobs that are gone. Returns how
        many were recorded (None: the database failed, which is logged)."""
        try:
            async with self._utils.pool.connection() as conn:
                cur = await conn.execute(
                    self._finalize,
                    {"job_ids": None, "messages": None, "timed_out": [], "pool_id": None},
                )
                row = await cur.fetchone()
        except psycopg.Error as exc:
            logger.warning("Recording cancelled jobs failed: %s", exc)
            return None
        return int(row[0]) if row else 0

    async def prune(self, batch: int = BATCH, max_batches: int = MAX_BATCHES) -> int | None:
        """One turn: how many rows were deleted (None: another pool was pruning,
        or the database failed, which is logged; the next turn tries again)."""
        params = {"limit": batch, "scan": SCAN}

        def taken_all(row: tuple[Any, ...]) -> bool:
            _, ledger_rows, listed = row
            return bool(listed < batch and ledger_rows < SCAN)  # every expired ledger row

        total = await self._turn(self._statement, params, max_batches, taken_all, "job history")
        if total:
            logger.debug("Pruned %d expired job history row(s)", total)
        return total

    async def prune_attempt_errors(
        self, batch: int = BATCH, max_batches: int = MAX_BATCHES
    ) -> int | None:
        """One turn over the attempt errors (``_private_py_job_errors``, kept 7
        days): how many rows were deleted (None: another pool was pruning, or
        the database failed, which is logged)."""

        def kept_next(row: tuple[Any, ...]) -> bool:
            deleted, read = row
            return bool(deleted < read or read < batch)  # the oldest rows left are kept

        return await self._turn(
            self._prune_errors, {"limit": batch}, max_batches, kept_next, "attempt errors"
        )

    async def prune_job_logs(
        self, batch: int = BATCH, max_batches: int = MAX_BATCHES
    ) -> int | None:
        """One turn over the jobs' kept logs and progress (kept 7 days, as
        the attempt errors): how many rows were deleted (None: the database
        failed, which is logged)."""

        def kept_next(row: tuple[Any, ...]) -> bool:
            deleted, read = row
            return bool(deleted < read or read < batch)

        logs = await self._turn(
            self._prune_logs, {"limit": batch}, max_batches, kept_next, "job logs"
        )
        progress = await self._turn(
            self._prune_progress,
            {"limit": batch},
            max_batches,
            lambda row: bool(row[0] < batch),
            "job progress",
        )
        if logs is None or progress is None:
            return None
        return logs + progress

    async def _turn(
        self,
        statement: sql.Composed,
        params: dict[str, Any],
        max_batches: int,
        last: Callable[[tuple[Any, ...]], bool],
        what: str,
    ) -> int | None:
        """Run a pruning ``statement`` (its first column: rows deleted, null
        when another pool holds the lock) up to ``max_batches`` times, each in
        its own transaction, until ``last(row)``; the rows deleted in all."""
        total = 0
        params = {"lock_namespace": _LOCK_NAMESPACE, "schema": self._schema, **params}
        try:
            for _ in range(max_batches):
                async with self._utils.pool.connection() as conn:
                    cur = await conn.execute(statement, params)
                    row = await cur.fetchone()
                if row is None or row[0] is None:
                    return None if total == 0 else total
                total += row[0]
                if last(row):
                    break
        except psycopg.Error as exc:
            logger.warning("Pruning the %s failed: %s", what, exc)
            return None
        return total
