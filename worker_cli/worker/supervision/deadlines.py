"""Timeouts: a running job's deadline, what happens there, and after its grace.

A job's timeout is its own (``add_job(..., timeout=...)``, fetched with it by
``py_fetch_jobs``) or else its task's (``@task_options(timeout=...)``); there
is none by default, and a job without one costs nothing here. Each attempt
gets the whole timeout, counted on the monotonic clock from the task call:
time spent in the queue does not count.

At the deadline the job is told (the slots say how: an ``async def`` task is
cancelled, a plain ``def`` one sees ``helpers.cancelled``); a task that then
raises fails its attempt with :class:`~worker_cli.errors.JobTimeout`, one that
returns succeeded. A job still running ``grace`` seconds (``timeout_grace``)
after its deadline is stuck: a warning names it and the line its task is at
(:class:`.stuck.StuckJobs`), and its task's ``on_stuck`` applies:
``"wait"`` keeps its slot and its lock; ``"exit"`` lets a plain job go (the
slots' ``abandon``: its thread is left behind, its job stays locked) and
stops the worker, which exits with code 75. An ``async def`` job cannot be
let go (it runs on the event loop): it is reported and keeps its slot.

All of it runs on the event loop; a plain job's deadline is armed there when
its thread reports that it started (:class:`~..pipeline.task_threads.Timed`), from the
time the thread read then.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from ...jobs.job import Job
from ...tasks.loader import Task
from ...tasks.task_options import OnStuck
from .stuck import KEPT, StuckJobs

__all__ = ["EXIT", "Deadlines", "job_timeout", "task_timeouts"]

logger = logging.getLogger("graphile_worker")

#: What follows for a stuck job whose task says ``on_stuck="exit"``.
EXIT = (
    "the worker stops fetching, lets its other jobs finish and exits with code 75, "
    "leaving this job locked until the worker is gone (then it runs again)"
)


def task_timeouts(tasks: Mapping[str, Task]) -> dict[str, float]:
    """The timeouts of the tasks that declare one, by identifier."""
    return {
        name: task.options.timeout
        for name, task in tasks.items()
        if task.options.timeout is not None
    }


def job_timeout(job: Job, timeouts: dict[int, float], by_task: Mapping[str, float]) -> float | None:
    """The timeout of a job about to start: its own (taken from ``timeouts``,
    where the fetch put it), else its task's, else None."""
    timeout = timeouts.pop(job.id, None) if timeouts else None
    return by_task.get(job.task_identifier) if timeout is None else timeout


class Deadlines:
    """The deadlines of one pool's running jobs (event loop only)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        grace: float,
        where: Callable[[int], str | None],
        can_abandon: Callable[[Job], bool],
        abandon: Callable[[Job], None],
        stuck: StuckJobs,
    ) -> None:
        self._loop = loop
        self._stuck = stuck
        self._grace = grace
        self._where = where
        #: Whether a stuck job can be let go (a plain ``def`` job: its thread
        #: is left behind), and letting it go (on_stuck="exit").
        self._can_abandon = can_abandon
        self._abandon = abandon
        #: The pending timer of each job with a deadline, by job id.
        self.armed: dict[int, asyncio.TimerHandle] = {}

    def arm(
        self,
        job: Job,
        timeout: float,
        started: float,
        expire: Callable[[], bool],
        running: Callable[[], bool],
        on_stuck: OnStuck,
    ) -> None:
        """``job``'s task was called at ``started`` (``time.monotonic()``) with
        ``timeout`` seconds: at the deadline ``expire()`` tells it (False: it
        had ended meanwhile); if ``running()`` still says so ``grace`` seconds
        later, it is stuck."""
        delay = max(0.0, started + timeout - time.monotonic())
        self.armed[job.id] = self._loop.call_later(
            delay, self._expired, job, timeout, expire, running, on_stuck
        )

    def disarm(self, job_id: int) -> None:
        """The job has ended: forget its deadline."""
        handle = self.armed.pop(job_id, None)
        if handle is not None:
            handle.cancel()

    def _expired(
        self,
        job: Job,
        timeout: float,
        expire: Callable[[], bool],
        running: Callable[[], bool],
        on_stuck: OnStuck,
    ) -> None:
        if not expire():
            self.armed.pop(job.id, None)
            return
        logger.info(
            "Job %d (%s) timed out after %gs: its task is told to stop",
            job.id,
            job.task_identifier,
            timeout,
        )
        self.armed[job.id] = self._loop.call_later(
            self._grace, self._check_stuck, job, timeout, running, on_stuck
        )

    def _check_stuck(
        self, job: Job, timeout: float, running: Callable[[], bool], on_stuck: OnStuck
    ) -> None:
        self.armed.pop(job.id, None)
        if not running():
            return
        what = f"is stuck: still running {self._grace:g}s after its timeout ({timeout:g}s)"
        exits = on_stuck == "exit" and self._can_abandon(job)
        self._stuck.report(job.id, what, self._where(job.id), EXIT if exits else KEPT)
        if exits:
            self._abandon(job)
