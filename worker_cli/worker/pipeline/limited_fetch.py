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

A pool with heartbeats fetches the jobs of tasks whose limit is
``max_running`` only under a lease of the limit's slots instead
(``py_fetch_leased_jobs``, :mod:`.leases`): ahead, like any job, while no
queue has a limit.
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
from .leases import Leases
from .local_queue import LocalQueue

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
#: Seconds before a pool whose jobs fetched under a lease wait for slots
#: other pools hold asks for them again.
LEASE_RETRY = 0.1


class LimitedFetch:
    """The limited part of one pool's fetches (see the module)."""

    def __init__(
        self,
        schema: str,
        *,
        use_local_time: bool,
        nudge: Callable[[], None],
        leases: Leases | None = None,
        queue: LocalQueue | None = None,
        tasks: Sequence[str] = (),
    ) -> None:
        self._fetch = compose(
            limits_sql.FETCH_LIMITED_AT if use_local_time else limits_sql.FETCH_LIMITED, schema
        )
        self._fetch_leased = compose(
            limits_sql.FETCH_LEASED_AT if use_local_time else limits_sql.FETCH_LEASED, schema
        )
        self._pool_leases = compose(limits_sql.POOL_LEASES, schema)
        self._leased_partitions = compose(limits_sql.LEASED_PARTITIONS, schema)
        #: This pool's leases (None: it leases nothing: no heartbeats) and
        #: its local queue, whose gate they are once a task is leased.
        self.leases = leases
        self._queue = queue
        self._tasks = frozenset(tasks)
        #: Gives back jobs fetched under a lease that ended (the completer's).
        self.give_back: Callable[[Sequence[Job]], Awaitable[None]] | None = None
        self._give_back_due = False
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
        """A limit may have been set or removed: read again at the next fetch;
        under leases, start no more than now until then, and give back the
        jobs fetched under them and not started (``py_set_limit`` ended the
        leases and counted those jobs)."""
        self.apply = None
        if self.leases is not None and self.leases.tasks:
            self.leases.suspend()
            self._give_back_due = True

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
                frozenset(name for kind, name, rated, *_ in rows if rated and kind == "task"),
                frozenset(name for kind, name, rated, *_ in rows if rated and kind == "queue"),
            )
            self._read_at = now
            if self.leases is not None:
                leased: frozenset[str] = frozenset()
                partitioned: frozenset[str] = frozenset()
                if not any(row[0] == "queue" for row in rows):
                    leased = self._tasks.intersection(
                        name for kind, name, _, leasable, _ in rows if leasable
                    )
                    partitioned = leased.intersection(name for kind, name, _, _, by in rows if by)
                if (leased, partitioned) != (self.leases.tasks, self.leases.partitioned):
                    # The jobs fetched under the leases before are given back.
                    self.leases.suspend()
                    self.leases.set_tasks(leased, partitioned)
                    self._give_back_due = True
                if leased and self._queue is not None:
                    self._queue.gate = self.leases
        return self.apply

    @property
    def leased(self) -> frozenset[str]:
        """The tasks fetched under leases."""
        return self.leases.tasks if self.leases is not None else frozenset()

    async def give_back_ended(self) -> None:
        """Give back the jobs fetched under leases that a changed limit ended
        (see :meth:`forget`), before the next fetch leases again."""
        if not self._give_back_due or self.leases is None or self._queue is None:
            return
        self._give_back_due = False
        # (The queue's gate, the leases, forgets the jobs it takes out.)
        jobs = self._queue.remove_where(self.leases.waiting)
        if jobs and self.give_back is not None:
            await self.give_back(jobs)

    async def fetch_leased(
        self,
        conn: psycopg.AsyncConnection[Any],
        params: dict[str, Any],
        task_ids: Sequence[int],
        concurrency: int,
        take: Take,
    ) -> int:
        """Fetch ahead the jobs of the leased tasks (their ids ``task_ids``)
        under leases, and take the leases read back; how many jobs."""
        leases = self.leases
        assert leases is not None
        generation = leases.generation
        key_tasks, key_parts, holding, running, queued = leases.asks()
        cur = await conn.cursor(binary=True).execute(
            self._fetch_leased,
            {
                **params,
                "task_ids": list(task_ids),
                "key_tasks": key_tasks,
                "key_parts": key_parts,
                "holding": holding,
                "running": running,
                "queued": queued,
                "concurrency": concurrency,
            },
        )
        fetched = await take(conn, cur, leases.fetched)
        released: frozenset[str] = frozenset()
        if unread := leases.unread():
            # (Those jobs wait aside meanwhile: a start needs its value.)
            cur = await conn.execute(self._leased_partitions, {"job_ids": unread})
            leases.partitions(dict(await cur.fetchall()))
            released = leases.partitioned
        cur = await conn.execute(self._pool_leases, {"pool_id": params["pool_id"]})
        targets = {(task, part): target for task, part, target in await cur.fetchall()}
        grew = leases.grant(targets, generation)
        if self._queue is not None:
            for task in grew | released:
                self._queue.release(task)
        if leases.stalled():
            # Ask again soon: the slots another pool holds come back at its
            # fetches, and no job of ours ending here will wake this one.
            self._nudge_in(LEASE_RETRY)
        return fetched

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
