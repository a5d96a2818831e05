"""The slots: N loops that take jobs from the local queue and run them.

An ``async def`` task runs inline in its slot's asyncio task (no task per
job). A plain ``def`` task (and an executable, which the task loader wraps in
one) runs in the slot's own thread (:mod:`.task_threads`), which goes on with
the plain jobs after it without coming back to the event loop; what it ran
comes back in batches. Each outcome goes to the completer. When the local
queue runs short the fetcher is woken.

Shutdown: the pool ends the slots through the local queue
(:meth:`LocalQueue.end_slots`), sets :attr:`Slots.abort` (every running job's
``helpers.abort_signal``) after the graceful timeout, and on a forced stop
:meth:`Slots.fail_running` cancels the slots inside their jobs, which then
fail (and retry elsewhere).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import JobCancelled
from ..jobs.in_task import SLOT_TASK_PREFIX
from ..jobs.job import Job
from ..jobs.results import encode_result
from ..jobs.worker_utils import WorkerUtils
from ..observe.events import Events
from ..tasks.helpers import Helpers
from ..tasks.loader import Task
from .completer import Completer
from .local_queue import LocalQueue, Refill
from .loop_watch import LoopWatch
from .outcome import batch_failures
from .reporter import Reporter
from .task_threads import (
    TASK_THREAD_PREFIX,
    Back,
    Outbox,
    Ran,
    TaskThread,
    ThreadSettings,
    busy_task_threads,
    exit_forked_child,
    forks,
)
from .unreadable import Unreadable

__all__ = ["TASK_THREAD_PREFIX", "Refill", "Slots", "busy_task_threads"]

logger = logging.getLogger("graphile_worker")

#: A slot running jobs that never await yields to the event loop at least this often.
_YIELD_EVERY = 64


@dataclass(slots=True)
class _Slot:
    """One slot, and what it is running (if anything)."""

    worker_id: str
    #: The slot's asyncio task, cancelled (inside the job) by a forced stop.
    task: asyncio.Task[None] | None = None
    #: The ``async def`` job it is running, and its helpers.
    job: Job | None = None
    helpers: Helpers | None = None
    #: Its thread for plain jobs (made at its first one).
    thread: TaskThread | None = None


class Slots:
    """Runs the pool's jobs, ``concurrency`` at a time."""

    def __init__(
        self,
        *,
        concurrency: int,
        tasks: Mapping[str, Task],
        queue: LocalQueue,
        refill: Refill,
        completer: Completer,
        utils: WorkerUtils,
        pool_id: str,
        log_success: bool,
        events: Events,
        result_limit: int | None = None,
    ) -> None:
        self._tasks = tasks
        #: The largest result kept, in bytes (None: results are not kept).
        self._result_limit = result_limit
        self._queue = queue
        self._refill = refill
        self._utils = utils
        self._pool_id = pool_id
        self._events = events
        #: Cancel requests this pool knows of: job id -> reason. A job in it
        #: that has not started never does.
        self.cancelling: dict[int, str | None] = {}
        self._reporter = Reporter(
            completer,
            pool_id=pool_id,
            log_success=log_success,
            events=events,
            cancelling=self.cancelling,
        )
        self._report = self._reporter.report
        self._slots = [_Slot(f"worker-{secrets.token_hex(9)}") for _ in range(concurrency)]
        self._loop = asyncio.get_running_loop()
        self._failing = False
        self._returning = False
        #: ``async def`` jobs cancelled by the graceful stop (:meth:`return_running`),
        #: to be given back: they run again.
        self.returned: list[Job] = []
        #: Every running job's ``helpers.abort_signal``.
        self.abort = asyncio.Event()
        self._plain = frozenset(name for name, task in tasks.items() if not task.is_async)
        self._threads = ThreadSettings(
            tasks=dict(tasks),
            plain=self._plain,
            queue=queue,
            refill=refill,
            outbox=Outbox(self._loop, self._delivered),
            utils=utils,
            loop=self._loop,
            abort=self.abort,
            result_limit=result_limit,
            cancelling=self.cancelling,
        )
        self._watch = LoopWatch(self._loop, self.job_of)
        #: Jobs running now.
        self.running = 0

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def done(self) -> int:
        """Jobs run to an outcome (success or failure)."""
        return self._reporter.done

    def cancel(self, job_id: int, reason: str | None) -> bool:
        """A cancel request: an ``async def`` task gets ``CancelledError``, a plain
        one sees ``helpers.cancelled``, a job not started never starts. Whether
        the job runs now (each request is acted on once)."""
        if job_id in self.cancelling:
            return False
        self.cancelling[job_id] = reason
        for slot in self._slots:
            if slot.job is not None and slot.job.id == job_id:
                if slot.helpers is not None:
                    slot.helpers.mark_cancelled(reason)
                if slot.task is not None:
                    slot.task.cancel()
                return True
            if slot.thread is not None and slot.thread.cancel(job_id, reason):
                return True
        return False

    def running_job_ids(self) -> set[int]:
        """Ids of the jobs running now."""
        ids = {slot.job.id for slot in self._slots if slot.job is not None}
        ids.update(
            job.id
            for slot in self._slots
            if slot.thread is not None and (job := slot.thread.current) is not None
        )
        return ids

    def where(self, job_id: int) -> str | None:
        """Where a running job's task is now (its innermost frames)."""
        for slot in self._slots:
            if slot.job is not None and slot.job.id == job_id and slot.task is not None:
                frames = slot.task.get_stack(limit=None)
                return _frames(frames[-3:]) if frames else None
            if slot.thread is not None and (text := slot.thread.where(job_id)) is not None:
                return text
        return None

    def start(self, group: asyncio.TaskGroup) -> list[asyncio.Task[None]]:
        """Start every slot in ``group``, and the watch that names a job
        blocking the event loop; returns their tasks."""
        self._watch.start()
        for slot in self._slots:
            # Named once: the utilities tell a job's code by it (jobs/in_task.py).
            name = f"{SLOT_TASK_PREFIX}-{slot.worker_id}"
            slot.task = group.create_task(self._run(slot), name=name)
        return [slot.task for slot in self._slots if slot.task is not None]

    def job_of(self, task: asyncio.Task[object] | None) -> Job | None:
        """The ``async def`` job a slot's asyncio task is running (any thread)."""
        return next((slot.job for slot in self._slots if slot.task is task), None)

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

    def close(self) -> None:
        """Release the threads (a plain task that never returns is left behind)."""
        self._watch.stop()
        for slot in self._slots:
            if slot.thread is not None:
                slot.thread.close()

    async def _run(self, slot: _Slot) -> None:
        self._events.emit("worker:create", worker_id=slot.worker_id, tasks=self._tasks)
        queue, refill = self._queue, self._refill
        streak = 0
        while True:
            try:
                job = queue.take_nowait()
            except asyncio.QueueEmpty:
                job = await queue.take()
            if job is None:
                break
            if job.task_identifier in self._plain:
                await self._run_plain(slot, job)
            else:
                await self._run_job(slot, job)
            streak += 1
            # Wake the fetcher only when it has something to do (it re-checks),
            # and yield at once only if it must start a fetch: while one is in
            # flight, its reply is read when the slots next yield.
            if queue.runs_short(refill) and refill.wake():
                streak = _YIELD_EVERY
            # Jobs that never await would let this slot drain the whole local
            # queue in one step: yield when the fetcher has work, and at least
            # every _YIELD_EVERY jobs (the completer's timer runs then too).
            if streak >= _YIELD_EVERY:
                streak = 0
                await asyncio.sleep(0)
        self._events.emit("worker:stop", worker_id=slot.worker_id)

    async def _run_job(self, slot: _Slot, job: Job) -> None:
        """Run one ``async def`` job and hand its outcome to the completer."""
        task = self._tasks[job.task_identifier]
        helpers = Helpers(
            job,
            worker_id=slot.worker_id,
            utils=self._utils,
            abort_signal=self.abort,
            loop=self._loop,
        )
        if self.cancelling and job.id in self.cancelling:  # cancelled before it started
            self._report(Ran(job, slot.worker_id, JobCancelled(self.cancelling[job.id]), None, 0))
            return
        slot.job = job
        slot.helpers = helpers
        started = time.perf_counter()
        self.running += 1
        events = self._events
        if events.wants("job:start"):
            events.emit("job:start", worker_id=slot.worker_id, job=job)
        error: BaseException | None = None
        failed_items: list[int] | None = None
        result: Any = None
        before = forks()
        try:
            result = await task.function(job.payload, helpers)
            while result is not None and inspect.isawaitable(result):
                result = await result  # a returned coroutine, as Node awaits a returned promise
            if isinstance(result, list) and isinstance(job.payload, list):
                error, failed_items = batch_failures(job, result)
        except asyncio.CancelledError as exc:
            error = self._cancelled(slot, exc, job.id)
        except BaseException as exc:  # SystemExit, GeneratorExit, ... too: the job failed
            exit_forked_child(before, exc)
            error = exc
        finally:
            exit_forked_child(before, None)
            slot.job = slot.helpers = None
            self.running -= 1
        if isinstance(error, _Returned):
            self.returned.append(job)
            return
        duration = (time.perf_counter() - started) * 1000
        ran = Ran(job, slot.worker_id, error, failed_items, duration)
        if result is not None and error is None and self._result_limit is not None:
            ran.result, ran.result_error = encode_result(result, self._result_limit)
        self._report(ran)
        if self.cancelling:
            self.cancelling.pop(job.id, None)

    def _cancelled(
        self, slot: _Slot, error: asyncio.CancelledError, job_id: int | None = None
    ) -> BaseException:
        """The job's error for a CancelledError caught in ``slot``'s job.

        A cancel request's cancellation (:meth:`cancel`) and a forced stop's
        are taken back: the job failed (:class:`JobCancelled`,
        :func:`_stopped`), the slot goes on. Re-raises it when the slot's task
        itself was cancelled (the pool ends it). With no cancellation of the
        slot pending, the task raised it itself (it awaited something someone
        else cancelled): only its job failed.
        """
        task = slot.task
        if task is None or not task.cancelling():
            return error
        if job_id is not None and job_id in self.cancelling:
            task.uncancel()
            return JobCancelled(self.cancelling[job_id])
        if self._returning and not self._failing and job_id is not None:
            task.uncancel()
            return _Returned()
        if not self._failing:
            raise error
        task.uncancel()
        return _stopped()

    async def _run_plain(self, slot: _Slot, job: Job) -> None:
        """Hand a plain job to the slot's thread, which runs it and the plain
        jobs after it (unless someone listens to ``job:start``, which is
        emitted here); returns when the thread is back. Outcomes arrive
        through :meth:`_delivered`."""
        events = self._events
        more = not events.wants("job:start")
        if not more:
            events.emit("job:start", worker_id=slot.worker_id, job=job)
        thread = slot.thread
        if thread is None:
            thread = slot.thread = TaskThread(slot.worker_id, self._threads)
        self.running += 1
        done = thread.hand(job, more=more)
        try:
            await done
        except asyncio.CancelledError as exc:
            if done.cancelled():  # else _delivered counted it
                self.running -= 1
            # The thread takes no other job and reports nothing more.
            slot.thread = None
            abandoned = thread.abandon()
            self._cancelled(slot, exc)  # raises unless forced
            if abandoned is not None:
                running, started = abandoned
                duration = (time.perf_counter() - started) * 1000
                self._report(Ran(running, slot.worker_id, _stopped(), None, duration))

    def fail_unreadable(self, unreadable: Sequence[Unreadable]) -> None:
        """Fail fetched jobs whose rows cannot be read (never run: their task
        is not called), in the pool's name."""
        for job, error in unreadable:
            self._report(Ran(job, self._pool_id, error, None, 0.0))

    def _delivered(self, items: list[Ran | Back], refill: bool) -> None:
        """On the loop: what the task threads reported since the last call."""
        for item in items:  # first, so that the completer sees an idle pool as idle
            if isinstance(item, Back) and not item.done.done():
                item.done.set_result(None)
                self.running -= 1
        for item in items:
            if isinstance(item, Ran):
                self._report(item)
                if self.cancelling:
                    self.cancelling.pop(item.job.id, None)
        if refill and self._queue.runs_short(self._refill):
            self._refill.wake()


class _Returned(Exception):
    """The outcome of a job the graceful stop cancelled: it is given back."""


def _stopped() -> RuntimeError:
    """The error of a job failed by a forced stop."""
    return RuntimeError("the worker was stopped while the job was running")


def _frames(frames: list[Any]) -> str:
    """``file:line in function`` of each frame, innermost last."""
    return " <- ".join(
        f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        for frame in reversed(frames)
    )
