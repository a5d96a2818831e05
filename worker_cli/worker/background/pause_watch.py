"""A pool's side of pauses: which queues and tasks are paused now, and the
jobs it gives back when a pause comes.

The fetch itself (``py_fetch_jobs``) leaves paused jobs alone, so a pause
holds for every fetch that starts after it commits. What a pool had fetched
before is given back (attempt restored, as at shutdown) instead of run: the
jobs waiting in the local queue when the pool learns of the pause, and those
of a fetch that was in flight (:meth:`Pauses.hold_back`). The pool learns of
pauses on ``<schema>:py:control`` and, in case a notification is lost, at
every poll.

:class:`PauseWatch` is the loop; it also runs the upkeep of pauses
(``py_hold_paused_queues``: ending expired pauses, holding queues' locks for
``hold_queue_lock``), at each poll while some pause needs it, else about
every minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from ...jobs.job import Job
from ...sql import compose
from ...sql import pauses as pauses_sql
from ..pipeline.local_queue import LocalQueue

__all__ = ["PauseSet", "PauseWatch", "Pauses"]

logger = logging.getLogger("graphile_worker")

#: Seconds between upkeeps while no pause needs one sooner.
UPKEEP_INTERVAL = 60.0


@dataclass(frozen=True)
class PauseSet:
    """The paused named queues and task identifiers (``*``: all of them)."""

    queues: frozenset[str] = field(default_factory=frozenset)
    tasks: frozenset[str] = field(default_factory=frozenset)

    def __bool__(self) -> bool:
        return bool(self.queues or self.tasks)

    def covers(self, job: Job) -> bool:
        """Whether a pause holds ``job`` back."""
        tasks, queues = self.tasks, self.queues
        if tasks and ("*" in tasks or job.task_identifier in tasks):
            return True
        name = job.queue_name
        return name is not None and bool(queues) and ("*" in queues or name in queues)


class Pauses:
    """What the pool knows of the fleet's pauses (read by the fetcher, kept
    by :class:`PauseWatch`), and the fetched jobs it must give back."""

    def __init__(self) -> None:
        self.current = PauseSet()
        #: Fetched jobs held back by a pause, to be given back.
        self.held: list[Job] = []
        self.changed = asyncio.Event()

    def hold_back(self, jobs: Sequence[Job]) -> Sequence[Job]:
        """The fetched jobs to run; those a pause covers are held back, to be
        given back by the watch."""
        current = self.current
        if not current:
            return jobs
        kept = [job for job in jobs if not current.covers(job)]
        if len(kept) < len(jobs):
            self.held.extend(job for job in jobs if current.covers(job))
            self.changed.set()
        return kept

    def take_held(self) -> list[Job]:
        """The held-back jobs not given back yet (the pool gives them back as it stops)."""
        held, self.held = self.held, []
        return held


@dataclass(frozen=True)
class PauseSettings:
    schema: str
    #: Seconds between reads of the pauses (the pool's poll interval).
    interval: float


class PauseWatch:
    """Keeps :class:`Pauses` current, gives back the jobs a pause covers;
    :meth:`run` is its loop (cancelled by the pool)."""

    def __init__(
        self,
        db: AsyncConnectionPool[Any],
        state: Pauses,
        *,
        settings: PauseSettings,
        queue: LocalQueue,
        give_back: Callable[[Sequence[Job]], Awaitable[None]],
        nudge: Callable[[], None],
        on_control: Callable[[], None] = lambda: None,
    ) -> None:
        self._db = db
        self._state = state
        self._settings = settings
        self._queue = queue
        self._give_back = give_back
        self._nudge = nudge
        self._on_control = on_control
        self._read = compose(pauses_sql.POOL_PAUSES, settings.schema)
        self._upkeep = compose(pauses_sql.HOLD_PAUSED_QUEUES, settings.schema)
        self._since_upkeep = UPKEEP_INTERVAL  # the first read runs it

    def notified(self) -> None:
        """A pause, resume or limit change was announced (or the listener
        reconnected): read the pauses again, and tell ``on_control``."""
        self._state.changed.set()
        self._on_control()

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._settings.interval):
                    await self._state.changed.wait()
            self._state.changed.clear()
            try:
                await self.refresh()
            except psycopg.Error as exc:
                logger.warning("Reading the pauses failed (retrying at the next poll): %s", exc)
            await self._give_back_held()

    async def refresh(self) -> None:
        """Read the pauses; give back queued jobs a new pause covers, nudge the
        fetcher when one ended; run the upkeep when due."""
        async with self._db.connection() as conn:
            cur = await conn.execute(self._read)
            rows = await cur.fetchall()
            self._since_upkeep += self._settings.interval
            due = any(not in_force or hold for _, _, in_force, hold in rows)
            if due or self._since_upkeep >= UPKEEP_INTERVAL:
                self._since_upkeep = 0.0
                await conn.execute(self._upkeep)
        in_force = [(kind, name) for kind, name, active, _ in rows if active]
        new = PauseSet(
            frozenset(name for kind, name in in_force if kind == "queue"),
            frozenset(name for kind, name in in_force if kind == "task"),
        )
        old, self._state.current = self._state.current, new
        if new.queues - old.queues or new.tasks - old.tasks:
            self._state.held.extend(self._queue.remove_where(new.covers))
        if old.queues - new.queues or old.tasks - new.tasks:
            self._nudge()

    async def _give_back_held(self) -> None:
        held = self._state.take_held()
        if held:
            logger.info(
                "Giving back %d fetched job(s) of paused queues or tasks (ids: %s)",
                len(held),
                ", ".join(str(job.id) for job in held[:20]) + (", ..." if len(held) > 20 else ""),
            )
            await self._give_back(held)
