"""One slot: what it runs, and how its ``async def`` job is told to stop;
the slots of a pool as a group (:class:`SlotGroup`).

An ``async def`` job runs inline in the slot's asyncio task, so a cancel
request (:meth:`Slot.tell`) or a timeout (:meth:`Slot.time_out`) cancels that
task, once per job, and the ``CancelledError`` lands inside the job. When it
comes out of the job, :meth:`Slot.error_of` says what the job failed with,
and whether the slot goes on. A job that swallows the cancellation and
returns has it taken back (:meth:`Slot.settle`): the slot's next job must not
inherit it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import JobCancelled, JobTimeout
from ...jobs.job import Job
from ...tasks.helpers import Helpers
from .task_threads import TaskThread

__all__ = ["Returned", "Slot", "SlotGroup", "frames", "stopped"]


@dataclass(slots=True)
class Slot:
    """One slot, and what it is running (if anything)."""

    worker_id: str
    #: The slot's asyncio task, cancelled (inside the job) by a forced stop.
    task: asyncio.Task[None] | None = None
    #: The ``async def`` job it is running, and its helpers.
    job: Job | None = None
    helpers: Helpers | None = None
    #: Its thread for plain jobs (made at its first one).
    thread: TaskThread | None = None
    #: The job's task was cancelled for the job's sake (a cancel request, a
    #: timeout): at most once per job.
    cancel_sent: bool = False
    #: The running job's timeout (seconds), once it has passed.
    timed_out: float | None = None
    #: The thread's stuck job is being let go (on_stuck="exit"): the slot ends.
    abandoning: bool = False

    def tell(self, reason: str | None) -> None:
        """A cancel request for the ``async def`` job running here."""
        if self.helpers is not None:
            self.helpers.mark_cancelled(reason)
        self._cancel_once()

    def time_out(self, job: Job, timeout: float) -> bool:
        """``job``'s timeout has passed: tell it, if it still runs here."""
        if self.job is not job:
            return False
        self.timed_out = timeout
        if self.helpers is not None:
            self.helpers.mark_timed_out(timeout)
        self._cancel_once()
        return True

    def _cancel_once(self) -> None:
        if self.task is not None and not self.cancel_sent:
            self.cancel_sent = True
            self.task.cancel()

    def error_of(
        self,
        error: asyncio.CancelledError,
        job_id: int | None,
        cancelling: Mapping[int, str | None],
        *,
        returning: bool,
        failing: bool,
    ) -> BaseException:
        """The job's error for a CancelledError caught in this slot's job.

        A cancel request's cancellation and a timeout's are taken back: the
        job failed (:class:`JobCancelled`, :class:`JobTimeout`), the slot goes
        on; so is the graceful stop's (``returning``: the job is given back,
        :class:`Returned`) and a forced stop's (``failing``: :func:`stopped`).
        Re-raises it when the slot's task itself was cancelled (the pool ends
        it). With no cancellation of the slot pending, the task raised it
        itself (it awaited something someone else cancelled): only its job
        failed.
        """
        task = self.task
        if task is None or not task.cancelling():
            return error
        if job_id is not None and job_id in cancelling:
            self._take_back(task)
            return JobCancelled(cancelling[job_id])
        if self.timed_out is not None:
            self._take_back(task)
            return JobTimeout(self.timed_out)
        if returning and not failing and job_id is not None:
            task.uncancel()
            return Returned()
        if not failing:
            raise error
        task.uncancel()
        return stopped()

    def _take_back(self, task: asyncio.Task[None]) -> None:
        task.uncancel()
        self.cancel_sent = False

    def cancelling(self) -> bool:
        """The slot's own asyncio task is being cancelled (the pool ends it)."""
        return self.task is not None and self.task.cancelling() > 0

    def settle(self) -> float | None:
        """After a job that had a timeout or was cancelled: take back a
        cancellation it swallowed; the timeout it went past, if any."""
        if self.cancel_sent:
            self.cancel_sent = False
            if self.task is not None and self.task.cancelling():
                self.task.uncancel()
        timed_out, self.timed_out = self.timed_out, None
        return timed_out


class SlotGroup:
    """The slots of a pool: which job each runs, where, and how a stop ends
    them (the part of :class:`~.slots.Slots` that does not run jobs)."""

    def __init__(self, slots: list[Slot]) -> None:
        self._slots = slots
        self._failing = False
        self._returning = False
        #: ``async def`` jobs cancelled by the graceful stop (:meth:`return_running`),
        #: to be given back: they run again.
        self.returned: list[Job] = []
        #: Cancel requests this pool knows of: job id -> reason. A job in it
        #: that has not started never does.
        self.cancelling: dict[int, str | None] = {}

    def cancel(self, job_id: int, reason: str | None) -> bool:
        """A cancel request: an ``async def`` task gets ``CancelledError``, a plain
        one sees ``helpers.cancelled``, a job not started never starts. Whether
        the job runs now (each request is acted on once)."""
        if job_id in self.cancelling:
            return False
        self.cancelling[job_id] = reason
        for slot in self._slots:
            if slot.job is not None and slot.job.id == job_id:
                slot.tell(reason)
                return True
            if slot.thread is not None and slot.thread.cancel(job_id, reason):
                return True
        return False

    def running_job_ids(self) -> set[int]:
        """Ids of the jobs running now."""
        return set(self._running_jobs())

    def running_tasks(self) -> Counter[str]:
        """Jobs running now, by task identifier (any thread may read it)."""
        return Counter(job.task_identifier for job in self._running_jobs().values())

    def _running_jobs(self) -> dict[int, Job]:
        """The jobs running now, by id: in the slots' coroutines, and in their
        threads (a job may be in both)."""
        jobs: dict[int, Job] = {}
        for slot in list(self._slots):
            if (job := slot.job) is not None:
                jobs[job.id] = job
            if (thread := slot.thread) is not None and (current := thread.current) is not None:
                jobs[current.id] = current
        return jobs

    def where(self, job_id: int) -> str | None:
        """Where a running job's task is now (its innermost frames)."""
        for slot in self._slots:
            if slot.job is not None and slot.job.id == job_id and slot.task is not None:
                stack = slot.task.get_stack(limit=None)
                return frames(stack[-3:]) if stack else None
            if slot.thread is not None and (text := slot.thread.where(job_id)) is not None:
                return text
        return None

    def job_of(self, task: asyncio.Task[object] | None) -> Job | None:
        """The ``async def`` job a slot's asyncio task is running (any thread)."""
        return next((slot.job for slot in self._slots if slot.task is task), None)

    def thread_of(self, job_id: int) -> Slot | None:
        """The slot whose thread runs the plain job ``job_id``, if any."""
        for slot in self._slots:
            thread = slot.thread
            if thread is not None and (job := thread.current) is not None and job.id == job_id:
                return slot
        return None

    def return_running(self) -> int:
        """The graceful stop's last step: cancel the ``async def`` jobs still
        running, to give them back (:attr:`returned`); how many."""
        self._returning = True
        count = 0
        for slot in self._slots:
            if slot.job is not None and slot.task is not None:
                slot.task.cancel()
                count += 1
        return count

    def fail_running(self) -> None:
        """A forced stop: end the running jobs now, as failures."""
        self._failing = True
        for slot in self._slots:
            busy = slot.job is not None or (slot.thread is not None and slot.thread.busy)
            if busy and slot.task is not None:
                slot.task.cancel()


class Returned(Exception):
    """The outcome of a job the graceful stop cancelled: it is given back."""


def stopped() -> RuntimeError:
    """The error of a job failed by a forced stop."""
    return RuntimeError("the worker was stopped while the job was running")


def frames(stack: list[Any]) -> str:
    """``file:line in function`` of each frame, innermost last."""
    return " <- ".join(
        f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        for frame in reversed(stack)
    )
