"""Background upkeep of a pool: the poller and the sweeper.

- The *poller* nudges the fetcher every ``poll_interval`` while the queue is
  exhausted: due retries and scheduled jobs send no notification.
- The *sweeper*, every 8-10 minutes (a random moment, so that workers started
  together do not sweep together), deletes expired unique-job locks and the
  options left over by jobs that are gone (a waiter's registration, say), and
  releases jobs and named queues locked for longer than the stale-lock
  timeout (4 hours by default) by workers that crashed.

Each is one loop (``run()``), cancelled by the pool when it stops.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import psycopg

from ...client.worker_utils import WorkerUtils, sweep_unique_locks
from ...sql import compose
from ...sql import fetch as fetch_sql
from ...sql import waiting as waiting_sql

__all__ = ["OPTIONS_LIMIT", "Poller", "Sweeper"]

logger = logging.getLogger("graphile_worker")

#: Left-over job options one sweep deletes at most (the rest waits for the next).
OPTIONS_LIMIT = 10_000


class Poller:
    """Calls ``nudge`` every ``interval`` seconds while ``exhausted()``."""

    def __init__(
        self, interval: float, *, exhausted: Callable[[], bool], nudge: Callable[[], None]
    ) -> None:
        self._interval = interval
        self._exhausted = exhausted
        self._nudge = nudge

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            if self._exhausted():
                self._nudge()


class Sweeper:
    """Frees what crashed workers left behind; ``on_released`` is called when
    jobs or queues were released."""

    def __init__(
        self,
        utils: WorkerUtils,
        *,
        schema: str,
        stale_lock_timeout: timedelta,
        interval: tuple[float, float],
        on_released: Callable[[], None],
    ) -> None:
        self._utils = utils
        self._release = compose(fetch_sql.RELEASE_STALE_LOCKS, schema)
        self._collect = compose(waiting_sql.COLLECT_JOB_OPTIONS, schema)
        self._timeout = stale_lock_timeout
        self._interval = interval
        self._on_released = on_released

    async def run(self) -> None:
        low, high = self._interval
        while True:
            await asyncio.sleep(random.uniform(low, high))
            await sweep_unique_locks(self._utils)
            await self.collect_job_options()
            await self.release_stale_locks()

    async def collect_job_options(self) -> int:
        """Delete options rows whose job is gone (at most :data:`OPTIONS_LIMIT`);
        how many. A failure is logged (the next sweep tries again)."""
        try:
            async with self._utils.pool.connection() as conn:
                cur = await conn.execute(self._collect, {"limit": OPTIONS_LIMIT})
                deleted: int = max(cur.rowcount, 0)
        except psycopg.Error as exc:
            logger.warning("Sweeping left-over job options failed: %s", exc)
            return 0
        if deleted:
            logger.debug("Deleted %d left-over job option row(s)", deleted)
        return deleted

    async def release_stale_locks(self) -> None:
        """One sweep of stale locks; a failure is logged (the next sweep retries)."""
        try:
            async with self._utils.pool.connection() as conn:
                now = datetime.now(UTC) if self._utils.use_local_time else None
                cur = await conn.execute(self._release, {"lock_timeout": self._timeout, "now": now})
                row = await cur.fetchone()
        except psycopg.Error as exc:
            logger.warning("Stale lock sweep failed: %s", exc)
            return
        if row and (row[0] or row[1]):
            logger.warning(
                "Released %d job(s) and %d queue(s) locked for over %s by crashed workers",
                row[0],
                row[1],
                self._timeout,
            )
            self._on_released()
