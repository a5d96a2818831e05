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

Timeouts (:mod:`..supervision.deadlines`): a job's own timeout (fetched with it) or its
task's is armed at the task call; an ``async def`` job is cancelled at its
deadline (:meth:`.slot.Slot.time_out`), a plain one told through its
helpers. A plain job stuck past the grace whose task says
``on_stuck="exit"`` is let go (:meth:`Slots.abandon`): its slot ends, its job
stays locked, and the pool stops (``on_stuck_exit``).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...client.worker_utils import WorkerUtils
from ...errors import JobCancelled
from ...jobs.inside_worker import SLOT_TASK_PREFIX
from ...jobs.job import Job
from ...tasks.helpers import Helpers, ProgressSink
from ...tasks.loader import Task
from ..pool_state import PoolState
from ..supervision.deadlines import Deadlines, job_timeout, task_timeouts
from ..supervision.loop_watch import LoopWatch
from .completer import Completer
from .local_queue import Refill
from .outcome import Failure, Ran, Settler
from .process_pool import ProcessPool
from .reporter import Reporter
from .slot import Returned, Slot, SlotGroup, stopped
from .task_threads import (
    TASK_THREAD_PREFIX,
    Back,
    Outbox,
    TaskThread,
    ThreadSettings,
    Timed,
    busy_task_threads,
    exit_forked_child,
    forks,
    timed_out_error,
)
from .unreadable import Unreadable

__all__ = ["TASK_THREAD_PREFIX", "Refill", "Slots", "busy_task_threads"]

logger = logging.getLogger("graphile_worker")

#: A slot running jobs that never await yields to the event loop at least this often.
_YIELD_EVERY = 64


class Slots(SlotGroup):
    """Runs the pool's jobs, ``concurrency`` at a time."""

    def __init__(
        self,
        *,
        concurrency: int,
        tasks: Mapping[str, Task],
        state: PoolState,
        refill: Refill,
        completer: Completer,
        utils: WorkerUtils,
        log_success: bool,
        result_limit: int | None = None,
        step_result_limit: int | None = None,
        timeout_grace: float = 30.0,
        on_stuck_exit: Callable[[Job], None] = lambda job: None,
        admit: Callable[[Job], bool] = lambda job: True,
        progress: ProgressSink | None = None,
        job_logs: str = "failed",
        processes: ProcessPool | None = None,
    ) -> None:
        self._tasks = tasks
        #: The worker's processes, where ``process=True`` tasks run their jobs.
        self._processes = processes
        self._queue = state.queue
        self._leases = state.leases
        self._refill = refill
        self._utils = utils
        self._pool_id = pool_id = state.id
        self._events = events = state.events
        stuck = state.stuck
        super().__init__([Slot(f"worker-{secrets.token_hex(9)}") for _ in range(concurrency)])
        self._reporter = Reporter(
            completer,
            pool_id=pool_id,
            log_success=log_success,
            events=events,
            cancelling=self.cancelling,
            stuck=stuck,
        )
        self._report = self._reporter.report
        #: Everything done on a job's behalf after its task call (outcome.py).
        self._settler = Settler(
            tasks,
            result_limit=result_limit,
            step_result_limit=step_result_limit,
            cancelling=self.cancelling,
        )
        #: Where helpers.progress reports go, and whether helpers.logger's
        #: lines are kept for the attempt (--job-logs).
        self._progress = progress
        self._capture_logs = job_logs != "off"
        self._loop = asyncio.get_running_loop()
        #: The fetched jobs' own timeouts (seconds) by job id, taken at their start, and
        #: the tasks' (those that have one). While both are empty a job costs one test.
        self._timeouts = state.timeouts
        #: The fetched workflow steps' contexts (helpers.parents), by job id.
        self._steps = state.steps
        self._task_timeouts = task_timeouts(tasks)
        self._deadlines = Deadlines(
            self._loop,
            grace=timeout_grace,
            where=self.where,
            can_abandon=lambda job: self.thread_of(job.id) is not None,
            abandon=self.abandon,
            stuck=stuck,
        )
        self._on_stuck_exit = on_stuck_exit
        #: Every running job's ``helpers.abort_signal``.
        self.abort = asyncio.Event()
        self._plain = frozenset(name for name, task in tasks.items() if not task.is_async)
        self._threads = ThreadSettings(
            tasks=dict(tasks),
            plain=self._plain,
            queue=self._queue,
            refill=refill,
            outbox=Outbox(self._loop, self._delivered),
            utils=utils,
            loop=self._loop,
            abort=self.abort,
            settler=self._settler,
            cancelling=self.cancelling,
            timeouts=self._timeouts,
            steps=self._steps,
            task_timeouts=self._task_timeouts,
            admit=admit,
            progress=progress,
            capture_logs=self._capture_logs,
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

    def start(self, group: asyncio.TaskGroup) -> list[asyncio.Task[None]]:
        """Start every slot in ``group``, and the watch that names a job
        blocking the event loop; returns their tasks."""
        self._watch.start()
        for slot in self._slots:
            # Named once: the utilities tell a job's code by it (jobs/inside_worker.py).
            name = f"{SLOT_TASK_PREFIX}-{slot.worker_id}"
            slot.task = group.create_task(self._run(slot), name=name)
        return [slot.task for slot in self._slots if slot.task is not None]

    def abandon(self, job: Job) -> None:
        """Let a stuck plain job go (on_stuck="exit"): its thread is left
        behind, its slot ends, the job stays locked (it runs again once this
        worker is gone), and the pool is told to stop."""
        slot = self.thread_of(job.id)
        if slot is not None and slot.task is not None:
            slot.abandoning = True
            slot.task.cancel()
        self._on_stuck_exit(job)

    def close(self) -> None:
        """Release the threads (a plain task that never returns is left behind)."""
        self._watch.stop()
        for slot in self._slots:
            if slot.thread is not None:
                slot.thread.close()

    async def _run(self, slot: Slot) -> None:
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
            if not self._threads.admit(job):  # a limit's deadline passed (start_deadlines)
                continue
            if job.task_identifier in self._plain:
                if await self._run_plain(slot, job):
                    break  # its stuck job was let go: the slot ends
            else:
                try:
                    ran = await self._run_job(slot, job)
                except BaseException as exc:
                    # Only the worker's own code around the task's call gets
                    # here (the call contains the job's): still that job's
                    # failure, unless the slot itself is being ended.
                    if isinstance(exc, asyncio.CancelledError) and slot.cancelling():
                        raise
                    ran = Ran(job, slot.worker_id, exc, 0.0)
                if ran is not None:
                    self._finish(ran)
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

    async def _run_job(self, slot: Slot, job: Job) -> Ran | None:
        """Run one ``async def`` job: what its task call gave, for
        :meth:`_finish` (None: the graceful stop gives it back)."""
        task = self._tasks[job.task_identifier]
        timeout = None
        if self._timeouts or self._task_timeouts:
            timeout = job_timeout(job, self._timeouts, self._task_timeouts)
        if self.cancelling and job.id in self.cancelling:  # cancelled before it started
            return Ran(job, slot.worker_id, JobCancelled(self.cancelling[job.id]), 0.0)
        helpers = Helpers(
            job,
            worker_id=slot.worker_id,
            utils=self._utils,
            abort_signal=self.abort,
            loop=self._loop,
            step=self._steps.pop(job.id, None) if self._steps else None,
            progress=self._progress,
            capture_logs=self._capture_logs,
            processes=self._processes,
        )
        slot.job = job
        slot.helpers = helpers
        started = time.perf_counter()
        self.running += 1
        events = self._events
        if events.wants("job:start"):
            events.emit("job:start", worker_id=slot.worker_id, job=job)
        error: BaseException | None = None
        result: Any = None
        before = forks()
        if timeout is not None:  # counted from the task call

            def arm() -> None:
                self._deadlines.arm(
                    job,
                    timeout,
                    time.monotonic(),
                    lambda: slot.time_out(job, timeout),
                    lambda: slot.job is job,
                    task.options.on_stuck,
                )

            if task.location is not None and (processes := self._processes) is not None:
                # From the moment a process has the job (not while it waits for one).
                helpers.processes = functools.partial(processes.run, started=arm)
            else:
                arm()
        try:
            result = await task.function(job.payload, helpers)
            while result is not None and inspect.isawaitable(result):
                result = await result  # a returned coroutine, as Node awaits a returned promise
        except asyncio.CancelledError as exc:
            error = slot.error_of(
                exc, job.id, self.cancelling, returning=self._returning, failing=self._failing
            )
        except BaseException as exc:  # SystemExit, GeneratorExit, ... too: the job failed
            exit_forked_child(before, exc)
            error = exc
        finally:
            exit_forked_child(before, None)
            timed_out = None
            if timeout is not None or slot.cancel_sent:
                if timeout is not None:
                    self._deadlines.disarm(job.id)
                timed_out = slot.settle()
            slot.job = slot.helpers = None
            self.running -= 1
        if isinstance(error, Returned):
            self.returned.append(job)
            return None
        duration = (time.perf_counter() - started) * 1000
        ran = Ran(job, slot.worker_id, error, duration, None if error is not None else result)
        ran.log = helpers.attempt_log
        if timed_out is not None:
            ran.timed_out = task.options.on_timeout
            if error is not None and not (self.cancelling and job.id in self.cancelling):
                ran.error = timed_out_error(timed_out, error)
        return ran

    def _finish(self, ran: Ran) -> None:
        """Settle a run of a job on the loop (everything done on the job's
        behalf after its task returned or raised) and hand it on. Never raises."""
        self._report(self._settler.settle(ran))
        if self.cancelling:
            self.cancelling.pop(ran.job.id, None)
        self._ended(ran.job)

    def _ended(self, job: Job) -> None:
        """A job ran: under a lease, a job of its task waiting aside may start."""
        if self._leases.ended(job):
            self._queue.release(job.task_identifier)

    async def _run_plain(self, slot: Slot, job: Job) -> bool:
        """Hand a plain job to the slot's thread, which runs it and the plain
        jobs after it (unless someone listens to ``job:start``, which is
        emitted here); returns when the thread is back: True if the slot ends
        (its stuck job was let go). Outcomes arrive through :meth:`_delivered`."""
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
            if slot.abandoning and slot.task is not None:  # stuck: its job stays locked
                slot.abandoning = False
                slot.task.uncancel()
                return True
            # Raises unless forced.
            slot.error_of(exc, None, self.cancelling, returning=False, failing=self._failing)
            if abandoned is not None:
                running, started = abandoned
                duration = (time.perf_counter() - started) * 1000
                self._finish(Ran(running, slot.worker_id, stopped(), duration))
        return False

    def fail_unreadable(self, unreadable: Sequence[Unreadable]) -> None:
        """Fail fetched jobs whose rows cannot be read (never run: their task
        is not called), in the pool's name."""
        for job, error in unreadable:
            self._finish(Ran(job, self._pool_id, error, 0.0))

    def _delivered(self, items: list[Ran | Failure | Back | Timed], refill: bool) -> None:
        """On the loop: what the task threads reported since the last call."""
        for item in items:  # first, so that the completer sees an idle pool as idle
            if isinstance(item, Back) and not item.done.done():
                item.done.set_result(None)
                self.running -= 1
        deadlines = self._deadlines
        for item in items:  # in order: a job's deadline is armed before it ends
            if isinstance(item, Ran | Failure):  # settled in the thread
                if deadlines.armed:
                    deadlines.disarm(item.job.id)
                self._report(item)
                if self.cancelling:
                    self.cancelling.pop(item.job.id, None)
                self._ended(item.job)
            elif isinstance(item, Timed):
                deadlines.arm(
                    item.job,
                    item.timeout,
                    item.started,
                    functools.partial(item.thread.time_out, item.helpers, item.timeout),
                    functools.partial(item.thread.runs, item.helpers),
                    self._tasks[item.job.task_identifier].options.on_stuck,
                )
        if refill and self._queue.runs_short(self._refill):
            self._refill.wake()
