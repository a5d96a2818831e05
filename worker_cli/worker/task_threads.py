"""Task threads: where plain ``def`` jobs run, one long-lived thread per slot.

A slot that takes a plain job hands it to its thread (:meth:`TaskThread.hand`).
The thread runs it, then takes the next plain job straight from the local
queue and runs that too, back to back, until the next job in the queue is not
one it can run (an ``async def`` job, a stop marker, or none). It reports each
job to the :class:`Outbox`, which the event loop empties in batches: one loop
wake-up for whatever finished meanwhile, where an executor costs two thread
hand-offs per job.

Each job runs in a fresh :class:`contextvars.Context`: a context variable set
by one job is not seen by the next. Thread-local values live as long as the
slot's thread, as in a web server's worker thread (a Django connection is
reused from job to job).

A forced stop :meth:`~TaskThread.abandon`\\ s a thread: its running job is
failed by the event loop at once, whatever the thread does later; the thread
reports nothing more and takes no other job.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from ..helpers import Helpers
from ..job import Job
from ..tasks import Task
from ..worker_utils import WorkerUtils
from .local_queue import LocalQueue, Refill
from .outcome import batch_failures

__all__ = [
    "TASK_THREAD_PREFIX",
    "Back",
    "Outbox",
    "Ran",
    "TaskThread",
    "ThreadSettings",
    "busy_task_threads",
]

#: Name prefix of the threads that run plain (``def``) tasks.
TASK_THREAD_PREFIX = "graphile-worker-task"


@dataclass(slots=True)
class Ran:
    """A job a task thread ran to an outcome."""

    job: Job
    worker_id: str
    #: None: success.
    error: BaseException | None
    #: A batch job's new payload: the items that failed (None: unchanged).
    replacement: str | None
    #: How long it ran, in milliseconds.
    duration_ms: float


@dataclass(slots=True)
class Back:
    """A task thread is back from a hand-off: it runs nothing now."""

    done: asyncio.Future[None]


class Outbox:
    """What task threads report, handed to the event loop in batches.

    :meth:`put` may be called from any thread; ``deliver`` runs on the loop
    with everything put since its last call. The loop is woken only when the
    outbox goes from empty to not empty.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        deliver: Callable[[list[Ran | Back], bool], None],
    ) -> None:
        self._loop = loop
        self._deliver = deliver
        self._items: deque[Ran | Back] = deque()
        self._scheduled = False
        self._refill = False

    def put(self, item: Ran | Back) -> None:
        """Report ``item`` (any thread)."""
        self._items.append(item)
        self._schedule()

    def ask_refill(self) -> None:
        """Ask the loop to wake the fetcher (any thread)."""
        if not self._refill:
            self._refill = True
            self._schedule()

    def _schedule(self) -> None:
        # Cleared by _flush before it takes the items: an item put after the
        # flag is read either is taken by that flush or schedules another.
        if not self._scheduled:
            self._scheduled = True
            # A closed loop (RuntimeError): nobody is left to tell.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        refill, self._refill = self._refill, False
        items = []
        popleft = self._items.popleft
        while self._items:
            items.append(popleft())
        self._deliver(items, refill)


@dataclass(frozen=True, slots=True)
class ThreadSettings:
    """What every task thread of a pool shares."""

    tasks: dict[str, Task]
    #: Identifiers of the plain tasks: the jobs a thread takes from the queue.
    plain: Collection[str]
    queue: LocalQueue
    refill: Refill
    outbox: Outbox
    utils: WorkerUtils
    loop: asyncio.AbstractEventLoop
    #: Every running job's ``helpers.abort_signal``.
    abort: asyncio.Event


class TaskThread:
    """One slot's thread (started at the slot's first plain job)."""

    def __init__(self, worker_id: str, settings: ThreadSettings) -> None:
        self._worker_id = worker_id
        self._settings = settings
        self._inbox: queue.SimpleQueue[tuple[Job, bool, asyncio.Future[None]] | None] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._job: Job | None = None
        self._started = time.perf_counter()
        self._abandoned = False
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        """A hand-off is under way (the thread may be between two jobs)."""
        return self._thread is not None and self._job is not None

    def hand(self, job: Job, *, more: bool) -> asyncio.Future[None]:
        """Run ``job`` and, with ``more``, the plain jobs that follow it in the
        queue; the future is done when the thread is back (event loop only)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._main, name=f"{TASK_THREAD_PREFIX}-{self._worker_id}", daemon=True
            )
            self._thread.start()
        done = self._settings.loop.create_future()
        self._job = job
        self._inbox.put((job, more, done))
        return done

    def abandon(self) -> tuple[Job, float] | None:
        """A forced stop: the thread reports nothing more. Returns the job it is
        running and when it started (``time.perf_counter()``), which the caller
        fails (None: it was between jobs)."""
        with self._lock:
            self._abandoned = True
            job, self._job = self._job, None
        self._inbox.put(None)
        return None if job is None else (job, self._started)

    def close(self) -> None:
        """The thread ends once it is idle (a job that never returns keeps it)."""
        self._inbox.put(None)

    def _main(self) -> None:
        settings = self._settings
        take, plain, outbox = settings.queue.take_plain, settings.plain, settings.outbox
        while (handed := self._inbox.get()) is not None:
            job: Job | None
            job, more, done = handed
            while job is not None:
                ran = self._run(job)
                with self._lock:
                    if self._abandoned:
                        return  # already failed by the loop
                    job = self._job = take(plain) if more else None
                outbox.put(ran)
                if settings.queue.runs_short(settings.refill):
                    outbox.ask_refill()
            outbox.put(Back(done))

    def _run(self, job: Job) -> Ran:
        settings = self._settings
        helpers = Helpers(
            job,
            worker_id=self._worker_id,
            utils=settings.utils,
            abort_signal=settings.abort,
            loop=settings.loop,
        )
        function = settings.tasks[job.task_identifier].function
        started = self._started = time.perf_counter()
        error, replacement = contained_call(function, job, helpers)
        duration = (time.perf_counter() - started) * 1000
        return Ran(job, self._worker_id, error, replacement, duration)


_busy_task_threads: set[threading.Thread] = set()


def busy_task_threads() -> int:
    """How many threads are inside a plain ``def`` task right now."""
    return len(_busy_task_threads)


def contained_call(
    function: Callable[[Any, Helpers], Any], job: Job, helpers: Helpers
) -> tuple[BaseException | None, str | None]:
    """Call a plain task in a fresh context; its error (None: success) and,
    for a batch job, its replacement payload."""
    thread = threading.current_thread()
    _busy_task_threads.add(thread)
    try:
        result = contextvars.Context().run(function, job.payload, helpers)
    except BaseException as exc:  # SystemExit, GeneratorExit, ... too: the job failed
        return exc, None
    finally:
        _busy_task_threads.discard(thread)
    if isinstance(result, list) and isinstance(job.payload, list):
        return batch_failures(job, result)
    return None, None
