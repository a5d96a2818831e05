"""Fetched jobs this pool is running or has queued already: left out.

A fetch returns only jobs that are not locked, and a job this pool is
running or has queued is locked by it, unless that lock was lost: a failover
to a standby that had not received the fetch (asynchronous replication; see
the README's "Failover"), or another pool that declared this one dead while
it was alive. Running such a job again would run it twice at the same time in
this very process. It is left out instead, with a warning; the fetch has
locked its row for this pool again, and the run in hand (or the queued job)
writes its outcome to that row.

Only jobs running or queued right now are left out, not every job the pool
holds: a job given back, or whose outcome is being written, may be fetched
again as soon as that is committed, and must then run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from ...jobs.job import Job
from .local_queue import LocalQueue
from .slot import SlotGroup

__all__ = ["Refetched"]

logger = logging.getLogger("graphile_worker")


class Refetched:
    """A fetch's hold-back hook (see :class:`.fetcher.Fetcher`): leaves out
    the jobs running or queued in this pool, then applies ``then``."""

    def __init__(
        self,
        pool_id: str,
        queue: LocalQueue,
        slots: Callable[[], SlotGroup | None],
        then: Callable[[Sequence[Job]], Sequence[Job]],
    ) -> None:
        self._pool_id = pool_id
        self._queue = queue
        self._slots = slots
        self._then = then

    def __call__(self, jobs: Sequence[Job]) -> Sequence[Job]:
        if jobs:
            busy = self._queue.job_ids()
            if (slots := self._slots()) is not None:
                busy |= slots.running_job_ids()
            if any(job.id in busy for job in jobs):
                again = [job.id for job in jobs if job.id in busy]
                logger.warning(
                    "Worker pool %s: fetched job(s) %s again while running or queueing them "
                    "(their lock was lost: a failover to a standby that had not received it, "
                    "or this pool was declared dead); not run a second time",
                    self._pool_id,
                    ", ".join(map(str, again)),
                )
                jobs = [job for job in jobs if job.id not in busy]
        return self._then(jobs)
