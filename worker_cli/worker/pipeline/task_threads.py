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
reports nothing more and takes no other job. So does a job stuck past its
timeout whose task says ``on_stuck="exit"`` (its job is then left locked).

A job with a timeout is reported when it starts (:class:`Timed`): the loop
arms its deadline (:mod:`..supervision.deadlines`), and at the deadline tells it through
:meth:`TaskThread.time_out` (``helpers.cancelled``); a job that then raises
fails with :class:`~worker_cli.errors.JobTimeout`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import os
import queue
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...client.worker_utils import WorkerUtils
from ...errors import JobCancelled, JobTimeout
from ...jobs.inside_worker import TASK_THREAD_PREFIX
from ...jobs.job import Job
from ...jobs.workflow_state import StepContext
from ...tasks.helpers import Helpers, ProgressSink
from ...tasks.loader import Task
from .local_queue import LocalQueue, Refill
from .outcome import Failure, Ran, Settler

__all__ = [
    "TASK_THREAD_PREFIX",
    "Back",
    "Outbox",
    "TaskThread",
    "ThreadSettings",
    "Timed",
    "busy_task_threads",
    "contained_call",
    "exit_forked_child",
    "forks",
    "timed_out_error",
]


@dataclass(slots=True)
class Back:
    """A task thread is back from a hand-off: it runs nothing now."""

    done: asyncio.Future[None]


@dataclass(slots=True)
class Timed:
    """A job with a timeout has started in a task thread: arm its deadline."""

    thread: TaskThread
    job: Job
    helpers: Helpers
    #: Seconds, and when the task was called (``time.monotonic()``).
    timeout: float
    started: float


class Outbox:
    """What task threads report, handed to the event loop in batches.

    :meth:`put` may be called from any thread; ``deliver`` runs on the loop
    with everything put since its last call. The loop is woken only when the
    outbox goes from empty to not empty.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        deliver: Callable[[list[Ran | Failure | Back | Timed], bool], None],
    ) -> None:
        self._loop = loop
        self._deliver = deliver
        self._items: deque[Ran | Failure | Back | Timed] = deque()
        self._scheduled = False
        self._refill = False

    def put(self, item: Ran | Failure | Back | Timed) -> None:
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


def _always(job: Job) -> bool:
    return True


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
    #: Settles each run in the thread (its result encoded, its retry policy applied).
    settler: Settler
    #: The pool's cancel requests (job id -> reason): such a job never starts.
    cancelling: Mapping[int, str | None] = field(default_factory=dict)
    #: The fetched jobs' own timeouts (seconds), by job id; taken at their start.
    timeouts: dict[int, float] = field(default_factory=dict)
    #: The fetched workflow steps' contexts (helpers.parents), by job id.
    steps: dict[int, StepContext] = field(default_factory=dict)
    #: The timeouts of the tasks that declare one, by identifier.
    task_timeouts: Mapping[str, float] = field(default_factory=dict)
    #: Whether a taken job may start now (see :mod:`..supervision.start_deadlines`).
    admit: Callable[[Job], bool] = _always
    #: Where helpers.progress reports go; whether helpers.logger's lines are kept.
    progress: ProgressSink | None = None
    capture_logs: bool = False


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
        #: The helpers of the job running now.
        self._helpers: Helpers | None = None
        #: The helpers of the job with a timeout running now (None between jobs).
        self._timed: Helpers | None = None
        self._started = time.perf_counter()
        self._abandoned = False
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        """A hand-off is under way (the thread may be between two jobs)."""
        return self._thread is not None and self._job is not None

    @property
    def current(self) -> Job | None:
        """The job the thread is running (or about to), if any."""
        return self._job if self._thread is not None else None

    def cancel(self, job_id: int, reason: str | None) -> bool:
        """Tell the job ``job_id`` it is cancelled, if it is this thread's (any thread)."""
        with self._lock:
            helpers = self._helpers
            if helpers is None or helpers.job.id != job_id:
                return False
        helpers.mark_cancelled(reason)
        return True

    def time_out(self, helpers: Helpers, timeout: float) -> bool:
        """The timeout of the job of ``helpers`` has passed: tell it, if it
        still runs here (event loop)."""
        with self._lock:
            if self._timed is not helpers or self._abandoned:
                return False
            helpers.mark_timed_out(timeout)
            return True

    def runs(self, helpers: Helpers) -> bool:
        """The job of ``helpers`` is still running here (and not let go)."""
        return self._timed is helpers and not self._abandoned

    def where(self, job_id: int) -> str | None:
        """Where the task of job ``job_id`` is now, if it runs in this thread."""
        helpers, thread = self._helpers, self._thread
        if helpers is None or helpers.job.id != job_id or thread is None:
            return None
        frame = sys._current_frames().get(thread.ident or 0)
        if frame is None:
            return None
        return " <- ".join(
            f"{f.f_code.co_filename}:{lineno} in {f.f_code.co_name}"
            for f, lineno in list(traceback.walk_stack(frame))[:3]
        )

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
                ran = self._contained_run(job) if settings.admit(job) else None
                with self._lock:
                    if self._abandoned:
                        return  # already failed by the loop
                    job = self._job = take(plain) if more else None
                if ran is not None:
                    outbox.put(ran)
                if settings.queue.runs_short(settings.refill):
                    outbox.ask_refill()
            outbox.put(Back(done))

    def _contained_run(self, job: Job) -> Ran | Failure:
        """:meth:`_run`, which never raises: the thread must outlive any job
        (else its slot would wait for it for ever)."""
        try:
            return self._run(job)
        except BaseException as exc:  # the worker's own code around the job: still its failure
            return self._settings.settler.settle(Ran(job, self._worker_id, exc, 0.0))

    def _run(self, job: Job) -> Ran | Failure:
        settings = self._settings
        cancelling = settings.cancelling
        task = settings.tasks[job.task_identifier]
        timeout = None
        if settings.timeouts or settings.task_timeouts:  # its own, else its task's
            timeout = settings.timeouts.pop(job.id, None) if settings.timeouts else None
            if timeout is None:
                timeout = settings.task_timeouts.get(job.task_identifier)
        if cancelling and job.id in cancelling:  # cancelled before it started
            cancelled = JobCancelled(cancelling.get(job.id))
            return settings.settler.settle(Ran(job, self._worker_id, cancelled, 0.0))
        helpers = Helpers(
            job,
            worker_id=self._worker_id,
            utils=settings.utils,
            abort_signal=settings.abort,
            loop=settings.loop,
            step=settings.steps.pop(job.id, None) if settings.steps else None,
            progress=settings.progress,
            capture_logs=settings.capture_logs,
        )
        with self._lock:
            self._helpers = helpers
            if timeout is not None:
                self._timed = helpers
        # A cancel request that came before the helpers were set is in
        # ``cancelling`` now (it is recorded there before threads are asked).
        if cancelling and job.id in cancelling:
            helpers.mark_cancelled(cancelling.get(job.id))
        if timeout is not None:  # counted from the task call
            settings.outbox.put(Timed(self, job, helpers, timeout, time.monotonic()))
        started = self._started = time.perf_counter()
        error, returned = contained_call(task.function, job, helpers, settings.loop)
        duration = (time.perf_counter() - started) * 1000
        ran = Ran(job, self._worker_id, error, duration, returned)
        ran.log = helpers.attempt_log
        if timeout is not None:
            with self._lock:
                self._timed = None
            if helpers.timed_out:  # told at its deadline (under the lock: no race)
                ran.timed_out = task.options.on_timeout
                if error is not None and not (cancelling and job.id in cancelling):
                    ran.error = timed_out_error(timeout, error)
        return settings.settler.settle(ran)


def timed_out_error(timeout: float, error: BaseException) -> JobTimeout:
    """What an attempt that raised ``error`` after its timeout failed with."""
    if isinstance(error, JobTimeout):
        return error
    timed_out = JobTimeout(timeout)
    timed_out.__cause__ = error
    return timed_out


_busy_task_threads: set[threading.Thread] = set()


def busy_task_threads() -> int:
    """How many threads are inside a plain ``def`` task right now."""
    return len(_busy_task_threads)


def contained_call(
    function: Callable[[Any, Helpers], Any],
    job: Job,
    helpers: Helpers,
    loop: asyncio.AbstractEventLoop,
) -> tuple[BaseException | None, Any]:
    """Call a plain task in a fresh context; its error (None: success) and
    what it returned (on success). Never raises.

    A returned awaitable (a plain ``def`` returning a coroutine) is awaited
    on the event loop, as Node awaits a returned promise. A process forked by
    the task that comes back here (its child returned or raised, ``sys.exit()``
    included) exits at once (:func:`exit_forked_child`): it must never carry
    on as a copy of the worker.
    """
    thread = threading.current_thread()
    before = _Forks.count
    _busy_task_threads.add(thread)
    try:
        result = contextvars.Context().run(function, job.payload, helpers)
        if result is not None and inspect.isawaitable(result):
            result = asyncio.run_coroutine_threadsafe(_awaited(result), loop).result()
        return None, result
    except BaseException as exc:  # SystemExit, GeneratorExit, ... too: the job failed
        exit_forked_child(before, exc)
        return exc, None
    finally:
        exit_forked_child(before, None)
        _busy_task_threads.discard(thread)


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


class _Forks:
    """How many times this process was forked into a child (counted in the child)."""

    count = 0

    @classmethod
    def counted(cls) -> None:
        cls.count += 1


os.register_at_fork(after_in_child=_Forks.counted)


def forks() -> int:
    """A number that changes in a child forked by ``os.fork()`` (see :func:`exit_forked_child`)."""
    return _Forks.count


def exit_forked_child(before: int, error: BaseException | None) -> None:
    """In a process forked by a task while it ran (:func:`forks` is no longer
    ``before``), end it now with the status ``sys.exit()`` gives (0 when the
    task returned, 1 for another error): nothing of the worker may run there.
    Returns in the worker (a process started by forking one, as a pre-forking
    server does, counts its forks from there)."""
    if _Forks.count == before:
        return
    code = 0
    if isinstance(error, SystemExit):
        code = error.code if isinstance(error.code, int) else (0 if error.code is None else 1)
    elif error is not None:
        code = 1
        with contextlib.suppress(BaseException):
            traceback.print_exception(error)
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)
