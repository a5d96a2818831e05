"""The slots: N loops that take jobs from the local queue and run them.

An ``async def`` task runs inline in its slot's asyncio task (no task per
job); a plain ``def`` task (and an executable, which the task loader wraps in
one) runs in a thread of the pool's executor, one per slot. Each outcome goes
to the completer. When the local queue runs short a slot wakes the fetcher.

Shutdown: the pool ends the slots through the local queue
(:meth:`LocalQueue.end_slots`), sets :attr:`Slots.abort` (every running job's
``helpers.abort_signal``) after the graceful timeout, and on a forced stop
:meth:`Slots.fail_running` cancels the slots inside their jobs, which then
fail (and retry elsewhere).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from .. import logs
from ..events import Events
from ..helpers import Helpers
from ..job import Job
from ..tasks import Task
from ..worker_utils import WorkerUtils
from .completer import Completer
from .local_queue import LocalQueue
from .outcome import Failure, describe

__all__ = ["TASK_THREAD_PREFIX", "Refill", "Slots", "busy_task_threads"]

logger = logging.getLogger("graphile_worker")

#: A slot running jobs that never await yields to the event loop at least this often.
_YIELD_EVERY = 64
#: Name prefix of the threads that run plain (``def``) tasks.
TASK_THREAD_PREFIX = "graphile-worker-task"


class Refill(Protocol):
    """What a slot needs of the fetcher."""

    #: The last fetch found fewer jobs than it asked for (waking it is useless
    #: until something new is announced).
    exhausted: bool
    #: Wake the fetcher once the local queue is this short.
    refill_below: int

    def wake(self) -> None:
        """Fetch again if the local queue wants more."""


@dataclass(slots=True)
class _Slot:
    """One slot, and the job it is running (if any)."""

    worker_id: str
    #: The slot's asyncio task, cancelled (inside the job) by a forced stop.
    task: asyncio.Task[None] | None = None
    job: Job | None = None


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
    ) -> None:
        self._tasks = tasks
        self._queue = queue
        self._refill = refill
        self._completer = completer
        self._utils = utils
        self._pool_id = pool_id
        self._log_success = log_success
        self._events = events
        self._slots = [_Slot(f"worker-{secrets.token_hex(9)}") for _ in range(concurrency)]
        self._executor = ThreadPoolExecutor(
            max_workers=concurrency, thread_name_prefix=TASK_THREAD_PREFIX
        )
        self._loop = asyncio.get_running_loop()
        self._failing = False
        #: Every running job's ``helpers.abort_signal``.
        self.abort = asyncio.Event()
        #: Jobs running now.
        self.running = 0
        #: Jobs run to an outcome (success or failure).
        self.done = 0

    def __len__(self) -> int:
        return len(self._slots)

    def start(self, group: asyncio.TaskGroup) -> list[asyncio.Task[None]]:
        """Start every slot in ``group``; returns their tasks."""
        for slot in self._slots:
            slot.task = group.create_task(self._run(slot))
        return [slot.task for slot in self._slots if slot.task is not None]

    def fail_running(self) -> None:
        """A forced stop: end the running jobs now, as failures."""
        self._failing = True
        for slot in self._slots:
            if slot.job is not None and slot.task is not None:
                slot.task.cancel()

    def close(self) -> None:
        """Release the threads (a plain task that never returns is left behind)."""
        self._executor.shutdown(wait=False, cancel_futures=True)

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
            await self._run_job(slot, job)
            streak += 1
            # Wake the fetcher only when it has something to do (it re-checks).
            if not refill.exhausted and len(queue) <= refill.refill_below:
                refill.wake()
                streak = _YIELD_EVERY
            # Jobs that never await would let this slot drain the whole local
            # queue in one step: yield when the fetcher has work, and at least
            # every _YIELD_EVERY jobs (the completer's timer runs then too).
            if streak >= _YIELD_EVERY:
                streak = 0
                await asyncio.sleep(0)
        self._events.emit("worker:stop", worker_id=slot.worker_id)

    async def _run_job(self, slot: _Slot, job: Job) -> None:
        """Run one job and hand its outcome to the completer."""
        task = self._tasks[job.task_identifier]
        helpers = Helpers(
            job,
            worker_id=slot.worker_id,
            utils=self._utils,
            abort_signal=self.abort,
            loop=self._loop,
        )
        slot.job = job
        started = time.perf_counter()
        self.running += 1
        events = self._events
        if events.wants("job:start"):
            events.emit("job:start", worker_id=slot.worker_id, job=job)
        error: BaseException | None = None
        replacement: str | None = None
        try:
            if task.is_async:
                result = await task.function(job.payload, helpers)
            else:
                result = await self._loop.run_in_executor(
                    self._executor, _contained_call, task.function, job.payload, helpers
                )
            if isinstance(result, list) and isinstance(job.payload, list):
                error, replacement = _batch_failures(job, result)
        except asyncio.CancelledError:
            if not self._failing or slot.task is None:
                raise
            slot.task.uncancel()
            error = RuntimeError("the worker was stopped while the job was running")
        except _Escaped as exc:
            error = exc.original
        except BaseException as exc:  # SystemExit, GeneratorExit, ... too: the job failed
            error = exc
        finally:
            slot.job = None
            self.running -= 1
        self.done += 1
        if error is None:
            if self._log_success:
                duration = (time.perf_counter() - started) * 1000
                logs.job_succeeded(job, slot.worker_id, self._pool_id, duration)
            if events.wants("job:success"):
                events.emit("job:success", worker_id=slot.worker_id, job=job)
            self._completer.succeeded(job, slot.worker_id)
        else:
            failure = Failure(job, slot.worker_id, error, describe(error), replacement)
            self._report_failure(failure, started)
            self._completer.failed(failure)

    def _report_failure(self, failure: Failure, started: float) -> None:
        job, worker_id, error = failure.job, failure.worker_id, failure.error
        duration = (time.perf_counter() - started) * 1000
        logs.job_failed(job, worker_id, self._pool_id, duration, failure.message, error)
        self._events.emit("job:error", worker_id=worker_id, job=job, error=error)
        if job.attempts >= job.max_attempts:
            self._events.emit("job:failed", worker_id=worker_id, job=job, error=error)


class _Escaped(Exception):
    """Carries a BaseException that is not an Exception (SystemExit,
    KeyboardInterrupt, GeneratorExit, ...) raised by a plain task out of its
    thread and the futures between it and the slot."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original


_busy_task_threads: set[threading.Thread] = set()


def busy_task_threads() -> int:
    """How many threads are inside a plain ``def`` task right now.

    An idle executor thread is not counted: after ``shutdown(wait=False)`` it
    may still be alive for a moment on its way out.
    """
    return len(_busy_task_threads)


def _contained_call(function: Any, *args: Any) -> Any:
    """A plain task's call, in its thread."""
    thread = threading.current_thread()
    _busy_task_threads.add(thread)
    try:
        return function(*args)
    except Exception:
        raise
    except BaseException as exc:
        raise _Escaped(exc) from exc
    finally:
        _busy_task_threads.discard(thread)


def _batch_failures(job: Job, result: list[Any]) -> tuple[Exception | None, str | None]:
    """A list payload answered by a list of results: retry only the failed items.

    Returns the job's error and its replacement payload (None, None: success).
    A list of another length is a bug in the task: as graphile-worker does, it
    is logged and the job counts as a success.
    """
    payload: list[Any] = job.payload
    if len(result) != len(payload):
        logger.warning(
            "Task %r (job %d) returned a list of %d result(s) for a payload of %d item(s): "
            "a batch task returns nothing, or one result per item (an exception for those "
            "that failed). Treated as a full success; this is a bug in the task.",
            job.task_identifier,
            job.id,
            len(result),
            len(payload),
        )
        return None, None
    failed = [
        (item, entry)
        for item, entry in zip(payload, result, strict=True)
        if isinstance(entry, BaseException)
    ]
    if not failed:
        return None, None
    error = RuntimeError(
        f"Batch failures ({len(failed)} of {len(result)} items):\n"
        + "\n".join(describe(entry) for _, entry in failed)
    )
    return error, json.dumps([item for item, _ in failed])
