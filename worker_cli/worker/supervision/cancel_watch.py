"""The cancel watch: tells this pool's running jobs that they were cancelled.

``py_cancel_jobs`` records a request for each running job it cancels
(``_private_py_cancellations``, with the pool holding the job) and notifies
``<schema>:py:cancel``. The listener hands the notification here; the watch
reads this pool's requests and passes each on to the slots once
(:meth:`CancelTarget.cancel`): an ``async def`` task gets ``CancelledError``,
a plain one sees ``helpers.cancelled``, a job not started yet never starts.
While jobs run it also reads the requests every ``poll_interval`` seconds,
the safety net for a notification lost with the listener's connection.

A job still running ``grace`` seconds after its request ignores it: it
keeps its slot and its lock (it is never run twice), and it is stuck
(:class:`.stuck.StuckJobs`: a warning names it once, with the line its task
is at). Requests for jobs this pool does not run
(any more) are forgotten after :data:`FORGET_AFTER` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Protocol

import psycopg

from ...client.worker_utils import WorkerUtils
from ...sql import cancel as cancel_sql
from ...sql import compose
from .stuck import StuckJobs

__all__ = ["FORGET_AFTER", "CancelTarget", "CancelWatch"]

logger = logging.getLogger("graphile_worker")

#: Seconds after which a request for a job this pool does not run is dropped.
FORGET_AFTER = 60.0
#: Seconds between two looks at the requests while some are being watched.
_WATCHING = 1.0


class CancelTarget(Protocol):
    """What the watch needs of the slots."""

    cancelling: dict[int, str | None]

    def cancel(self, job_id: int, reason: str | None) -> bool: ...

    def running_job_ids(self) -> set[int]: ...

    def where(self, job_id: int) -> str | None: ...


class CancelWatch:
    """Passes this pool's cancel requests on to its slots; :meth:`run` is its loop."""

    def __init__(
        self,
        utils: WorkerUtils,
        target: CancelTarget,
        *,
        schema: str,
        pool_id: str,
        stuck: StuckJobs,
        poll_interval: float = 5.0,
        grace: float = 30.0,
    ) -> None:
        self._utils = utils
        self._target = target
        self._pool_id = pool_id
        self._statement = compose(cancel_sql.CANCEL_REQUESTS, schema)
        self._poll_interval = poll_interval
        self._grace = grace
        self._wake = asyncio.Event()
        self._last_poll = 0.0
        #: Requests passed on to the slots: job id -> when (monotonic).
        self._requested: dict[int, float] = {}
        self._stuck = stuck

    def notified(self, payload: str) -> None:
        """A notification on ``<schema>:py:cancel`` (ids of jobs cancelled while running)."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._timeout()):
                    await self._wake.wait()
            notified = self._wake.is_set()
            self._wake.clear()
            running = self._target.running_job_ids()
            due = time.monotonic() - self._last_poll >= self._poll_interval
            if notified or (running and due):
                await self.check()
            self._watch(running)

    def _timeout(self) -> float | None:
        """How long to wait for a notification: a second while requests are
        watched, the poll interval while jobs may run, else for ever."""
        if self._requested or self._target.cancelling:
            return _WATCHING
        return self._poll_interval

    async def check(self) -> None:
        """Read this pool's requests and pass on the new ones; a database error
        is logged (the next look tries again)."""
        self._last_poll = time.monotonic()
        try:
            async with self._utils.pool.connection() as conn:
                cur = await conn.execute(self._statement, {"pool_id": self._pool_id})
                rows = await cur.fetchall()
        except psycopg.Error as exc:
            logger.warning("Reading the cancel requests failed: %s", exc)
            return
        now = time.monotonic()
        for job_id, reason in rows:
            if job_id in self._requested:
                continue
            self._requested[job_id] = now
            if self._target.cancel(job_id, reason):
                logger.info("Job %d: cancelled while running (%s)", job_id, reason or "no reason")
            else:
                logger.debug("Job %d: cancel request noted (it is not running here now)", job_id)

    def _watch(self, running: set[int]) -> None:
        """Report jobs that ignore their request; forget finished ones."""
        now = time.monotonic()
        for job_id, since in list(self._requested.items()):
            if job_id in running:
                if now - since >= self._grace and job_id not in self._stuck:
                    self._stuck.report(
                        job_id,
                        f"ignores its cancel request ({now - since:.0f}s ago)",
                        self._target.where(job_id),
                    )
            elif now - since >= FORGET_AFTER:
                del self._requested[job_id]
                self._target.cancelling.pop(job_id, None)
