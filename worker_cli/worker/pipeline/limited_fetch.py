"""The fetcher's second statement: jobs under limits.

Tasks and queues under a limit (migrations/py/000015.sql) are left alone by
the usual fetch; ``py_fetch_limited_jobs`` fetches them, serialised on the
limits' rows, for the slots free now only (what a limit lets start must
start at once; the jobs go ahead of every queued one). Whether any limit
exists is read when a fetch comes back short (at most every
:data:`REREAD` seconds: a notification may have been lost, and ``once`` has
no listener) and after each ``<schema>:py:control`` notification. When a
full rate limit held jobs back, a nudge is planned for the moment it frees a
start, so a waiting pool does not poll. Each job fetched gets a start
deadline (:mod:`..supervision.start_deadlines`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psycopg

from ...jobs.job import Job
from ...sql import compose
from ...sql import limits as limits_sql
from ..supervision.start_deadlines import ClockBound, StartDeadlines

__all__ = ["REREAD", "LimitedFetch", "Take"]

#: Queues the jobs of a fetch's result (the fetcher's): called with the
#: connection, the cursor, and what to call with the jobs before they are
#: queued ahead of every other; returns how many.
Take = Callable[
    [psycopg.AsyncConnection[Any], psycopg.AsyncCursor[Any], Callable[[Sequence[Job]], None]],
    Awaitable[int],
]

#: Seconds between reads of whether any limit exists, made when a fetch comes
#: back short.
REREAD = 2.0
#: A limited fetch is put off until the planned nudge when that comes sooner
#: than this (seconds).
BATCH_WAIT = 0.05


class LimitedFetch:
    """The limited part of one pool's fetches (see the module)."""

    def __init__(self, schema: str, *, use_local_time: bool, nudge: Callable[[], None]) -> None:
        self._fetch = compose(
            limits_sql.FETCH_LIMITED_AT if use_local_time else limits_sql.FETCH_LIMITED, schema
        )
        self._exist = compose(limits_sql.LIMITS_EXIST, schema)
        self._next_start = compose(limits_sql.NEXT_START, schema)
        self._nudge = nudge
        #: Whether any task or queue limit exists (None: not known; read at
        #: the next fetch), and the tasks and queues whose limit counts starts.
        self.apply: bool | None = None
        self._rated: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())
        self._read_at = -REREAD
        self._clock = ClockBound()
        self.deadlines: StartDeadlines | None = None
        self._timer: asyncio.TimerHandle | None = None

    @property
    def waiting(self) -> bool:
        """A full rate limit holds jobs back; a nudge is planned."""
        return self._timer is not None

    def forget(self) -> None:
        """A limit may have been set or removed: read again at the next fetch."""
        self.apply = None

    def stop(self) -> None:
        """Plan no more nudges."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def applies(self, conn: psycopg.AsyncConnection[Any], *, short: bool) -> bool:
        """Whether to fetch limited jobs too, after a usual fetch (``short``:
        it found fewer jobs than asked)."""
        now = time.monotonic()
        if self.apply is None or (short and now - self._read_at >= REREAD):
            cur = await conn.execute(self._exist)
            rows = await cur.fetchall()
            self.apply = bool(rows)
            self._rated = (
                frozenset(name for kind, name, rated in rows if rated and kind == "task"),
                frozenset(name for kind, name, rated in rows if rated and kind == "queue"),
            )
            self._read_at = now
        return self.apply

    async def fetch(
        self, conn: psycopg.AsyncConnection[Any], params: dict[str, Any], free: int, take: Take
    ) -> int:
        """Fetch limited jobs for ``free`` slots (the usual fetch's ``params``),
        queued ahead by ``take``; how many. Fewer than ``free``: plan a nudge
        for when a full rate limit frees a start (a freed slot comes with a
        completion's nudge)."""
        if free <= 0 or self._due_soon():
            return 0
        if self.deadlines is not None:
            await self._clock.refresh(conn)
        cur = await conn.cursor(binary=True).execute(self._fetch, {**params, "limit": free})
        fetched = await take(conn, cur, self._counted)
        if fetched < free:
            cur = await conn.execute(
                self._next_start, {"task_ids": params["task_ids"], "wanted": free - fetched}
            )
            row = await cur.fetchone()
            if row and row[0] is not None:
                self._nudge_in(max(0.0, float(row[0])))
        return fetched

    def _counted(self, jobs: Sequence[Job]) -> None:
        """Give the fetched jobs under a rate limit their start deadlines (a
        job under a concurrency limit only may start late)."""
        tasks, queues = self._rated
        if self.deadlines is not None and (tasks or queues):
            rated = [
                job for job in jobs if job.task_identifier in tasks or job.queue_name in queues
            ]
            self.deadlines.set(rated, self._clock)

    def _due_soon(self) -> bool:
        """A planned nudge comes within :data:`BATCH_WAIT`: fetch then, for
        several starts at once, rather than one per completion's nudge."""
        timer = self._timer
        return timer is not None and timer.when() - asyncio.get_running_loop().time() < BATCH_WAIT

    def _nudge_in(self, delay: float) -> None:
        loop = asyncio.get_running_loop()
        timer = self._timer
        if timer is not None and timer.when() <= loop.time() + delay:
            return  # an earlier nudge stands
        if timer is not None:
            timer.cancel()
        self._timer = loop.call_later(delay, self._freed)

    def _freed(self) -> None:
        self._timer = None
        self._nudge()
