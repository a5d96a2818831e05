"""The completer: writes job results back in batches (group commit).

Slots hand it each outcome (:meth:`Completer.succeeded`,
:meth:`Completer.failed`). Whatever finished while the previous batch was
being written goes into the next one. While the pool is busy, a batch also
waits up to ``batch_delay`` for more results to join it: one statement and
one commit (a WAL flush) for all of them. :func:`write_now` says when a batch
is written without that wait. Once a batch is written its jobs are no longer
held by the pool, and ``on_written`` is called (a finished job may have
released its named queue, so the fetcher looks again).

The wait is ended by the first result that finds the batch ``batch_delay``
old, not by a timer: the event loop is awake for that result anyway. A timer
of the completer's own wakes the loop in the middle of the jobs' own waits,
and asyncio rounds the timeout of the wait that follows up to a whole
millisecond: each such wake-up made the timers of short jobs fire late (see
"Turnaround at low concurrency" in docs/performance.md). Only when no result
comes does a timer end the wait, at twice the delay.

What the statements are, and how a result the server refuses is isolated
(never retried for ever, never holding up the others), is
:mod:`.result_writer`'s; the completer retries a batch through outages.

It also gives back the jobs that never started when the pool stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from psycopg_pool import AsyncConnectionPool

from ...db.backoff import retry_until_done
from ...jobs.job import Job
from ..pool_state import PoolState
from .outcome import Failure
from .result_writer import HistorySettings, ResultWriter

__all__ = ["WRITE_AT_MOST", "Completer", "write_now"]

logger = logging.getLogger("graphile_worker")

#: A batch of results is written at once when it holds this many (however busy
#: the pool is): a bounded statement, and bounded work lost to a crash.
WRITE_AT_MOST = 1000


def write_now(stopping: bool, named_queue_results: int, pool_idle: bool, pending: int) -> bool:
    """True when waiting results should be written without the batching delay:
    the pool is stopping; a result belongs to a job of a named queue (the
    queue stays locked until it is written); the pool has nothing running or
    queued (nothing else would join the batch); or the batch is large."""
    return stopping or named_queue_results > 0 or pool_idle or pending >= WRITE_AT_MOST


class Completer:
    """Writes results back for one pool; :meth:`run` is its loop."""

    def __init__(
        self,
        db: AsyncConnectionPool[Any],
        *,
        schema: str,
        state: PoolState,
        batch_delay: float,
        pool_idle: Callable[[], bool],
        on_written: Callable[[], None],
        history: HistorySettings | None = None,
        success_logs: bool = False,
    ) -> None:
        self._pool_id = pool_id = state.id
        #: The statements (and a refused result's isolation).
        self.writer = ResultWriter(
            db, schema=schema, pool_id=pool_id, history=history, success_logs=success_logs
        )
        self._delay = batch_delay
        #: Ids of the jobs the pool holds locked; written ones are removed.
        self._held = state.held
        self._pool_idle = pool_idle
        self._on_written = on_written
        self._events = state.events
        self._succeeded: list[tuple[Job, str]] = []
        self._failed: list[Failure] = []
        self._named_queue_results = 0
        #: When the first result of the batch being gathered came (None: none yet).
        self._since: float | None = None
        self._ready = asyncio.Event()
        self._write_now = asyncio.Event()
        self._writing = False
        self._stopping = False
        self._closed = False

    @property
    def idle(self) -> bool:
        """Nothing waiting to be written and nothing being written."""
        return not self._succeeded and not self._failed and not self._writing

    def succeeded(self, job: Job, worker_id: str) -> None:
        """Queue a success for writing (once per job: kept lean)."""
        self._succeeded.append((job, worker_id))
        self._arrived(job)

    def failed(self, failure: Failure) -> None:
        """Queue a failure for writing."""
        self._failed.append(failure)
        self._arrived(failure.job)

    def _arrived(self, job: Job) -> None:
        self._ready.set()
        if job.job_queue_id is not None:
            self._named_queue_results += 1
        if self._since is None:
            self._since = time.monotonic()
        if self._due():
            self._write_now.set()  # ends a batch's wait for more

    def _due(self) -> bool:
        """The batch is written now: see :func:`write_now`, or it has waited
        ``batch_delay`` already."""
        since = self._since
        return (since is not None and time.monotonic() - since >= self._delay) or write_now(
            self._stopping,
            self._named_queue_results,
            self._pool_idle(),
            len(self._succeeded) + len(self._failed),
        )

    def hurry(self) -> None:
        """The pool is stopping: results no longer wait for others to join them."""
        self._stopping = True
        self._write_now.set()

    def close(self) -> None:
        """No more results will come: :meth:`run` returns once all are written."""
        self._closed = True
        self._ready.set()
        self._write_now.set()

    async def run(self) -> None:
        """Write batches until closed and empty."""
        while True:
            # State is checked before waiting, so no wake-up can be missed.
            if not self._succeeded and not self._failed:
                if self._closed:
                    return
                await self._ready.wait()
                self._ready.clear()
                continue
            if self._delay > 0:
                self._write_now.clear()
                if not self._due():
                    # Ended by a result (see the module's docstring); the
                    # timer only when none comes.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(2 * self._delay):
                            await self._write_now.wait()
            await self._write_batch()

    async def _write_batch(self) -> None:
        # At most WRITE_AT_MOST results a statement (the expiry ledger takes
        # 1,000 ids a row): what came in while the last batch was being
        # written can be more; the rest is the next batch.
        succeeded, failed = self._succeeded, self._failed
        self._succeeded, self._failed = [], []
        if len(succeeded) + len(failed) > WRITE_AT_MOST:
            succeeded, self._succeeded = succeeded[:WRITE_AT_MOST], succeeded[WRITE_AT_MOST:]
            room = WRITE_AT_MOST - len(succeeded)
            failed, self._failed = failed[:room], failed[room:]
        # The rest (if any) begins the next batch.
        self._since = time.monotonic() if self._succeeded or self._failed else None
        self._named_queue_results = sum(
            1 for job, _ in self._succeeded if job.job_queue_id is not None
        ) + sum(1 for failure in self._failed if failure.job.job_queue_id is not None)
        self._writing = True
        try:
            await retry_until_done(
                "record job results", self.writer.write, succeeded, failed, logger=logger
            )
        finally:
            self._writing = False
        self.writer.forget(succeeded)
        self._held.difference_update(job.id for job, _ in succeeded)
        self._held.difference_update(failure.job.id for failure in failed)
        if self._events.wants("job:complete"):
            for job, worker_id in succeeded:
                self._events.emit("job:complete", worker_id=worker_id, job=job, error=None)
            for failure in failed:
                self._events.emit(
                    "job:complete",
                    worker_id=failure.worker_id,
                    job=failure.job,
                    error=failure.error,
                )
        self._on_written()

    async def return_unstarted(self, jobs: Sequence[Job]) -> None:
        """Give back jobs that were fetched but never started (their attempt
        restored), retrying through an outage."""
        if jobs:
            await retry_until_done("return unstarted jobs", self._return_jobs, jobs, logger=logger)
            logger.info("Worker pool %s: returned %d unstarted job(s)", self._pool_id, len(jobs))

    async def _return_jobs(self, jobs: Sequence[Job]) -> None:
        await self.writer.give_back([job.id for job in jobs])
        self._held.difference_update(job.id for job in jobs)
