"""Jobs a limit let start start at once, or not at all.

A rate limit counts a job's start when the fetch locks it
(``py_fetch_limited_jobs``, on the database's clock), and counts its windows
50 ms longer than the period. So that at most N jobs *start* (the task is
called) in any window of the period, each such job must start within
:data:`START_WITHIN` of being counted. The fetcher gives each one a deadline
on this process's monotonic clock (:meth:`StartDeadlines.set`); a slot or
task thread about to run it asks :meth:`StartDeadlines.admit`; one past its
deadline (the process was stalled) is not run: :meth:`StartDeadlines.run`
removes its start from the limits (``py_uncount_starts``) and gives it back,
attempt restored, to be fetched again.

The database's clock is bounded from this process's: :class:`ClockBound`
reads ``clock_timestamp()`` on the fetch connection now and then, and takes
the largest offset the reading allows (a job is judged late a round trip
early, never late).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from ...db.backoff import retry_until_done
from ...jobs.job import Job
from ...sql import clock as clock_sql
from ...sql import compose
from ...sql import limits as limits_sql

__all__ = ["START_WITHIN", "ClockBound", "StartDeadlines"]

logger = logging.getLogger("graphile_worker")

#: Seconds within which a counted job must start: half the margin the fetch
#: adds to each window (migrations/py/000015.sql), the other half for the
#: moment between this check and the task's first line.
START_WITHIN = 0.025
#: Seconds between readings of the database's clock.
_CLOCK_EVERY = 30.0


class ClockBound:
    """An upper bound of (database clock - this process's clock), in seconds."""

    def __init__(self) -> None:
        self.ahead: float | None = None
        self._read_at = -_CLOCK_EVERY

    async def refresh(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Read the database's clock if the last reading is old."""
        if time.monotonic() - self._read_at < _CLOCK_EVERY:
            return
        sent = time.time()
        cur = await conn.execute(clock_sql.CLOCK_EPOCH)
        row = await cur.fetchone()
        if row is not None:
            # The reading was taken after ``sent``: the database's clock is at
            # most this far ahead of ours.
            self.ahead = float(row[0]) - sent
            self._read_at = time.monotonic()


class StartDeadlines:
    """The start deadlines of the jobs a limit let start (see the module)."""

    def __init__(
        self,
        db: AsyncConnectionPool[Any],
        schema: str,
        *,
        pool_id: str,
        give_back: Callable[[Sequence[Job]], Awaitable[None]],
        nudge: Callable[[], None],
    ) -> None:
        self._db = db
        self._uncount = compose(limits_sql.UNCOUNT_STARTS, schema)
        #: The pool whose counts are removed (a job another pool holds since
        #: this one was declared dead keeps that pool's count).
        self._pool_id = pool_id
        self._give_back = give_back
        #: There may be jobs to fetch (those given back, for one).
        self._nudge = nudge
        #: Job id -> time.monotonic() by which it must start.
        self._deadlines: dict[int, float] = {}
        self._late: list[Job] = []
        self._lock = threading.Lock()
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()

    def set(self, jobs: Sequence[Job], clock: ClockBound) -> None:
        """The fetched jobs were counted when locked (``job.locked_at``)."""
        if clock.ahead is None:
            return
        now, mono = time.time(), time.monotonic()
        for job in jobs:
            if job.locked_at is not None:
                counted_ago = now + clock.ahead - job.locked_at.timestamp()
                self._deadlines[job.id] = mono + START_WITHIN - counted_ago

    def admit(self, job: Job) -> bool:
        """Whether to run ``job`` now (any thread); a late one is given back."""
        if not self._deadlines:
            return True
        deadline = self._deadlines.pop(job.id, None)
        if deadline is None or time.monotonic() <= deadline:
            return True
        with self._lock:
            self._late.append(job)
        self._loop.call_soon_threadsafe(self._wake.set)
        return False

    def take_late(self) -> list[Job]:
        """The late jobs not given back yet (the pool gives them back as it stops)."""
        with self._lock:
            late, self._late = self._late, []
        return late

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            late = self.take_late()
            if not late:
                continue
            ids = [job.id for job in late]
            logger.warning(
                "Could not start %d job(s) within %.0f ms of their limit counting them (the "
                "process was stalled); giving them back uncounted (ids: %s)",
                len(late),
                START_WITHIN * 1000,
                ", ".join(map(str, ids[:20])),
            )
            await retry_until_done("uncount late starts", self._uncount_starts, ids, logger=logger)
            await self._give_back(late)
            self._nudge()

    async def _uncount_starts(self, ids: list[int]) -> None:
        async with self._db.connection() as conn:
            await conn.execute(self._uncount, {"job_ids": ids, "pool_id": self._pool_id})
