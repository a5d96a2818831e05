"""Long jobs keep their locks.

Every worker, Node's and ours, releases jobs and named queues locked more than
4 hours ago (the stale-lock sweep): a crashed worker's. A job that runs
longer than that (no timeout, the default, or a long one) would be released
while it runs, and run a second time. So a pool sets ``locked_at`` of the jobs
it holds (and of their named queues) to now again once their lock is older
than ``lock_refresh_age`` (an hour; ``WorkerOptions.lock_refresh_age``),
looking every half of that (``heartbeats_sql.REFRESH_LOCKS``: only its own locks,
by their ids). A pool that is gone refreshes nothing: its jobs are released
as before (by the heartbeat reaper, or the sweep).

With heartbeats on (the default), the heartbeat's thread does it after a
beat (:meth:`LockRefresh.refresh_sync`): like the beats, it goes on while an
``async def`` task blocks the event loop. With heartbeats off, a loop on the
event loop does (:meth:`LockRefresh.run`). So a job of any length keeps its
lock, with or without heartbeats and with or without a timeout, and a timeout
over 4 hours needs no special care.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from ...client.worker_utils import WorkerUtils
from ...config.options import WorkerOptions
from ...db.backoff import one_line
from ...sql import compose
from ...sql import heartbeats as heartbeats_sql

__all__ = ["LockRefresh"]

logger = logging.getLogger("graphile_worker")


class LockRefresh:
    """Refreshes the old locks of one pool (see the module's docstring)."""

    def __init__(
        self,
        *,
        schema: str,
        pool_id: str,
        age: timedelta,
        held: Collection[int],
        use_local_time: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._statement = compose(heartbeats_sql.REFRESH_LOCKS, schema)
        self._pool_id = pool_id
        self._age = age
        #: The ids of the jobs the pool holds (a set the event loop changes:
        #: read as a whole, from any thread).
        self._held = held
        self._use_local_time = use_local_time
        self._clock = clock
        #: Seconds between two looks.
        self.period = age.total_seconds() / 2
        self._next = clock() + self.period

    @classmethod
    def of(cls, options: WorkerOptions, pool_id: str, held: Collection[int]) -> LockRefresh:
        """The refresh of a pool with ``options`` holding the jobs ``held``."""
        return cls(
            schema=options.schema,
            pool_id=pool_id,
            age=options.lock_refresh_age,
            held=held,
            use_local_time=options.use_local_time,
        )

    def _params(self) -> dict[str, Any] | None:
        """The statement's parameters, or None when the pool holds no job."""
        for _ in range(3):
            try:
                job_ids = list(self._held)
                break
            except RuntimeError:  # changed while read (another thread)
                continue
        else:
            return None
        if not job_ids:
            return None
        return {
            "job_ids": job_ids,
            "pool_id": self._pool_id,
            "age": self._age,
            "now": datetime.now(UTC) if self._use_local_time else None,
        }

    def refresh_sync(self, conn: psycopg.Connection[Any]) -> None:
        """From the heartbeat's thread, after a beat: refresh if it is time.
        Errors propagate (the heartbeat logs them; the next beat tries again)."""
        if self._clock() < self._next:
            return
        params = self._params()
        if params is not None:
            row = conn.execute(self._statement, params).fetchone()
            self._refreshed(row)
        self._next = self._clock() + self.period  # (after a failure: at the next beat)

    async def run(self, utils: WorkerUtils) -> None:
        """Without heartbeats: refresh every :attr:`period` seconds on the
        event loop; a database error is logged (the next look tries again)."""
        while True:
            await asyncio.sleep(self.period)
            params = self._params()
            if params is None:
                continue
            try:
                async with utils.pool.connection() as conn:
                    cur = await conn.execute(self._statement, params)
                    self._refreshed(await cur.fetchone())
            except psycopg.Error as exc:
                logger.warning("Refreshing the locks of long jobs failed: %s", one_line(exc))

    def _refreshed(self, row: Any) -> None:
        jobs, queues = row if row else (0, 0)
        if jobs or queues:
            logger.info(
                "Worker pool %s: took again the locks of %d job(s) and %d queue(s) running for "
                "over %s, so that no stale-lock sweep releases them",
                self._pool_id,
                jobs,
                queues,
                self._age,
            )
