"""The worker pool: wires the parts together, starts them, stops them in order.

Start: the connection pool opens, the fetcher registers the tasks and the
heartbeat makes its first beat, all at once; then the slots, the fetcher,
the completer and (unless ``once``) the listener, poller, sweeper and cron
run in one task group.

Stop (graceful): the fetcher stops (a fetch in flight finishes), the jobs
not started yet are given back (attempt restored), running jobs finish;
after ``graceful_shutdown_timeout`` their ``abort_signal`` is set. Then the
last results are written and the connections close.

Forced stop (a second signal, :meth:`WorkerPool.force_stop`): running jobs
are failed so they retry elsewhere, and the pool gives up on the database
``forced_shutdown_timeout`` later whatever it does: results not written by
then are logged by job id (those jobs will run again: at-least-once).
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
from collections.abc import Coroutine, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

import psycopg
from psycopg_pool import AsyncConnectionPool

from ..client.worker_utils import WorkerUtils
from ..config.options import WorkerOptions
from ..db.connections import WorkerConnections
from ..jobs.job import Job
from ..observe.events import Events
from ..observe.progress import log_held_by_pauses
from ..tasks.loader import Task
from .background.heartbeat import Heartbeat, PoolReport
from .background.lock_refresh import LockRefresh
from .background.loops import PoolHooks, background_loops
from .background.pause_watch import Pauses
from .background.progress_writer import ProgressWriter
from .declared_limits import declare_limits
from .pipeline.already_held import Refetched
from .pipeline.completer import Completer
from .pipeline.fetcher import Fetcher, FetchSettings, OnFetched
from .pipeline.process_pool import ProcessPool, default_size
from .pipeline.result_writer import HistorySettings
from .pipeline.slots import Slots
from .pipeline.unreadable import Unreadable
from .pool_state import PoolState
from .stopping import (
    finish,
    report_left_behind,
    wait_for_running,
)
from .supervision.start_deadlines import StartDeadlines

if TYPE_CHECKING:
    from ..jobs.crontab import ParsedCronItem

__all__ = ["PoolLoad", "WorkerPool"]

logger = logging.getLogger("graphile_worker")


class PoolLoad(NamedTuple):
    """What a pool is doing now (:attr:`WorkerPool.load`)."""

    running: int
    #: Fetched (locked) jobs waiting for a slot: the local queue's length.
    queued: int
    #: Running jobs that should have stopped (:mod:`.supervision.stuck`).
    stuck: int = 0
    #: The running jobs by task identifier (tasks running none are left out).
    running_tasks: Mapping[str, int] = MappingProxyType({})


class WorkerPool:
    """Runs jobs of the given tasks until stopped (or, with ``once``, drained)."""

    def __init__(
        self,
        conninfo: str,
        tasks: dict[str, Task],
        options: WorkerOptions,
        *,
        events: Events | None = None,
        once: bool = False,
        cron_items: Sequence[ParsedCronItem] = (),
        on_fetched: OnFetched | None = None,
    ) -> None:
        self.id = f"pool-{secrets.token_hex(9)}"
        self.conninfo = conninfo
        self.tasks = tasks
        self.options = options
        self.events = events or Events()
        self.once = once
        #: With ``once``: it stopped because nothing was left to run.
        self._drained = False
        self.cron_items = list(cron_items)
        #: Set when a breaking schema migration was announced (exit code 57).
        self.breaking_migration: str | None = None
        #: Ids of the jobs still held when a forced stop gave up writing them
        #: back (they run again once released); empty after a clean stop.
        self.unwritten_job_ids: list[int] = []
        #: Ids of the jobs stuck past their timeout (on_stuck="exit", exit code
        #: 75) that stopped the pool: left locked, they run again once it is gone.
        self.stuck_job_ids: list[int] = []
        #: Set once the pool is connected and its tasks are registered.
        self.ready = asyncio.Event()
        self.connections = WorkerConnections.of(options, conninfo, self.id)
        self._stop = asyncio.Event()
        self._forced = asyncio.Event()
        #: loop.time() by which a forced stop gives up on the database.
        self._forced_deadline = math.inf
        #: What the stages share: the local queue, the jobs held, the fetched
        #: jobs' timeouts, the stuck jobs (see :mod:`.pool_state`).
        self._state = state = PoolState(self.id, self.events)
        self._held = state.held
        self._queue = state.queue
        self._stuck = state.stuck
        #: The fleet's pauses as this pool knows them (see :mod:`.background.pause_watch`).
        self._pauses = Pauses()
        self._fetcher = Fetcher(
            self.connections,
            FetchSettings.of(options),
            tasks=list(tasks),
            state=state,
            running=lambda: self._slots.running if self._slots else 0,
            done=lambda: self.jobs_done,
            owner=self,
            on_fetched=on_fetched,
            on_unreadable=self._fail_unreadable,
            hold_back=Refetched(self.id, self._queue, lambda: self._slots, self._pauses.hold_back),
        )
        self._slots: Slots | None = None
        self._utils: WorkerUtils | None = None

    def stop(self, reason: str = "stop requested") -> None:
        """Begin a graceful shutdown."""
        if not self._stop.is_set():
            logger.info("Worker pool %s: stopping (%s)", self.id, reason)
            self.events.emit("pool:gracefulShutdown", pool=self, message=reason)
            self._stop.set()

    def force_stop(self) -> None:
        """Stop now: running jobs are failed so they retry elsewhere, and the
        pool gives up on the database after ``forced_shutdown_timeout``."""
        self.stop("forced")
        if not self._forced.is_set():
            logger.warning("Worker pool %s: forced shutdown", self.id)
            self.events.emit("pool:forcefulShutdown", pool=self)
            self._forced_deadline = (
                asyncio.get_running_loop().time() + self.options.forced_shutdown_timeout
            )
            self._forced.set()

    @property
    def stopping(self) -> bool:
        """True once a shutdown has begun."""
        return self._stop.is_set()

    @property
    def utils(self) -> WorkerUtils | None:
        """WorkerUtils on the pool's connections while it runs."""
        return self._utils

    @property
    def jobs_done(self) -> int:
        """Jobs this pool has run to an outcome (success or failure)."""
        return self._slots.done if self._slots else 0

    @property
    def load(self) -> PoolLoad:
        """Jobs running now, and fetched jobs waiting for a slot (any thread may read it)."""
        running, tasks = (s.running, s.running_tasks()) if (s := self._slots) else (0, {})
        return PoolLoad(running, len(self._queue), len(self._stuck), tasks)

    def held_job_ids(self) -> list[int]:
        """Ids of the jobs this pool holds locked and has not written back yet."""
        return sorted(self._held)

    def nudge(self) -> None:
        """There may be new runnable jobs: fetch even if the last fetch found none."""
        self._fetcher.nudge()

    def conninfo_for(self, role: str) -> str:
        """The connection string of one of the pool's connections (see
        :class:`WorkerConnections`)."""
        return self.connections.conninfo_for(role)

    def adopt_connection(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Take over an open autocommit connection (the one that checked the
        schema) as the fetcher's, instead of opening another; closed with the pool."""
        self._fetcher.adopt_connection(conn)

    async def run(self) -> None:
        """Run until stopped; returns once every job is written back, or after
        a forced stop once the results are written or ``forced_shutdown_timeout``
        has passed (see :attr:`unwritten_job_ids`)."""
        options = self.options
        db = self.connections.pool(min_size=2, max_size=options.max_pool_size)
        lock_refresh = LockRefresh.of(options, self.id, self._held)
        heartbeat = Heartbeat.of_pool(
            self.connections,
            options,
            on_released=self.nudge,
            report=PoolReport(
                options.concurrency, list(self.tasks), lambda: self.jobs_done, self._stuck.ids
            ),
            lock_refresh=lock_refresh,
            on_declared_dead=self._fetcher.limits_changed,
        )
        self.events.emit("pool:create", pool=self)
        started = False
        try:
            # The connections open and the heartbeat makes its first beat
            # (before any job is locked) while the tasks are registered.
            try:
                async with asyncio.TaskGroup() as start:
                    start.create_task(db.open(wait=True))
                    start.create_task(self._fetcher.register_tasks())
                    if heartbeat:
                        start.create_task(heartbeat.start())
            except BaseExceptionGroup as failure:
                raise failure.exceptions[0] from None  # the first error, as it was raised
            started = True
            self._utils = WorkerUtils(db, options.schema, use_local_time=options.use_local_time)
            await declare_limits(self._utils, self.tasks)
            # Without heartbeats, the locks of long jobs are refreshed on the loop.
            await self._run_parts(self._utils, None if heartbeat else lock_refresh)
            if self._drained:
                await log_held_by_pauses(db, options.schema, list(self.tasks), self.id)
        finally:
            await self._close(heartbeat, db, started=started)

    async def _run_parts(self, utils: WorkerUtils, lock_refresh: LockRefresh | None) -> None:
        options, queue = self.options, self._queue
        completer = Completer(
            utils.pool,
            schema=options.schema,
            state=self._state,
            batch_delay=options.complete_job_batch_delay,
            pool_idle=lambda: not slots.running and not queue,
            on_written=self.nudge,
            history=HistorySettings(options.keep_succeeded) if options.history else None,
            success_logs=options.job_logs == "all",
        )
        deadlines = StartDeadlines(
            utils.pool,
            options.schema,
            pool_id=self._state.id,
            give_back=completer.return_unstarted,
            nudge=self.nudge,
        )
        progress = ProgressWriter(utils.pool, schema=options.schema)
        self._fetcher.limited.deadlines = deadlines
        self._fetcher.limited.give_back = completer.return_unstarted
        # The processes of process=True tasks (none without one).
        processes = ProcessPool.of(
            self.tasks,
            default_size(options.processes, options.concurrency),
            stopping=lambda: self.stopping,
        )
        if processes is not None:
            processes.start()
        slots = self._slots = Slots(
            concurrency=options.concurrency,
            tasks=self.tasks,
            state=self._state,
            refill=self._fetcher,
            completer=completer,
            utils=utils,
            log_success=options.log_success,
            result_limit=options.max_result_bytes if options.history else None,
            step_result_limit=options.max_result_bytes,
            timeout_grace=options.timeout_grace,
            on_stuck_exit=self._on_stuck_exit,
            admit=deadlines.admit,
            progress=progress.report,
            job_logs=options.job_logs,
            processes=processes,
        )
        try:
            async with asyncio.TaskGroup() as group:
                slot_tasks = slots.start(group)
                fetcher = group.create_task(self._fetcher.run(self._on_exhausted))
                writer = group.create_task(completer.run())
                # Ended after the running jobs (their last reports are written).
                progress_task = group.create_task(progress.run())
                loops = [*self._background(utils, slots, completer, lock_refresh), deadlines.run()]
                helpers = [group.create_task(loop) for loop in loops]
                self.nudge()
                self.ready.set()
                await self._stop.wait()
                # Stop fetching; a fetch in flight finishes (its jobs are ours).
                self._fetcher.stop()
                completer.hurry()
                for task in helpers:
                    task.cancel()
                await self._finish(fetcher)
                # Given back while the running jobs are waited for: the return may
                # need a connection that a running task holds until its abort_signal.
                unstarted = [*queue.drain(), *self._pauses.take_held(), *deadlines.take_late()]
                returning = asyncio.ensure_future(completer.return_unstarted(unstarted))
                queue.end_slots(len(slots))
                await wait_for_running(
                    slots, slot_tasks, self._forced, options.graceful_shutdown_timeout, self.id
                )
                given_back = asyncio.ensure_future(completer.return_unstarted(slots.returned))
                completer.close()
                progress_task.cancel()
                # A helper inside a query may take a while to end once cancelled.
                await self._finish(returning, given_back, writer, progress_task, *helpers)
        finally:
            slots.close()
            if processes is not None:  # their jobs have ended (killed if forced)
                await processes.close(1.0 if self._forced.is_set() else 10.0)

    def _background(
        self,
        utils: WorkerUtils,
        slots: Slots,
        completer: Completer,
        lock_refresh: LockRefresh | None,
    ) -> list[Coroutine[Any, Any, None]]:
        """The loops that run beside the pipeline (see :mod:`.background`)."""
        return background_loops(
            PoolHooks(
                options=self.options,
                connections=self.connections,
                events=self.events,
                owner=self,
                once=self.once,
                cron_items=self.cron_items,
                nudge=self.nudge,
                exhausted=lambda: self._fetcher.exhausted,
                on_breaking_migration=self._on_breaking_migration,
                stuck=self._stuck,
                lock_refresh=lock_refresh,
                pauses=self._pauses,
                queue=self._queue,
                give_back=completer.return_unstarted,
                limits_changed=self._fetcher.limits_changed,
            ),
            utils,
            slots,
        )

    def _fail_unreadable(self, unreadable: Sequence[Unreadable]) -> None:
        """Fetched jobs whose rows cannot be read fail alone, without running."""
        if self._slots is not None:  # always: fetches start after the slots
            self._slots.fail_unreadable(unreadable)

    def _on_exhausted(self) -> None:
        """With ``once``: stop once nothing is left to fetch, run or write (the
        pool holds no job: none queued, running, or with a result unwritten)."""
        if self.once and not self._held and not self._fetcher.limited.waiting:
            self._drained = True
            self.stop("no runnable jobs left")

    def _on_stuck_exit(self, job: Job) -> None:
        """A plain job stuck past its timeout was let go (on_stuck="exit"):
        stop, leaving it locked (exit code 75)."""
        self.stuck_job_ids.append(job.id)
        self.stop(f"job {job.id} ({job.task_identifier}) is stuck past its timeout")

    def _on_breaking_migration(self, message: str) -> None:
        self.breaking_migration = message
        self.stop(message)

    async def _finish(self, *tasks: asyncio.Future[None]) -> None:
        await finish(tasks, self._forced, lambda: self._forced_deadline)

    async def _close(
        self, heartbeat: Heartbeat | None, db: AsyncConnectionPool[Any], *, started: bool
    ) -> None:
        forced = self._forced.is_set()
        utils, self._utils = self._utils, None
        if utils is not None:  # a task's wait_for_job may have started its listener
            await utils.close()
        self.unwritten_job_ids = report_left_behind(
            self.id, self._held, self.stuck_job_ids, self._fetcher.lost_fetch, self.options
        )
        if heartbeat:
            # Beats on until every result is written; a pool that stops
            # holding jobs keeps its row, so that others release them.
            clean = started and not self._held and not self._fetcher.lost_fetch
            heartbeat.stop(remove=clean)
            await heartbeat.wait_stopped(1.0 if forced else 10.0)
        await self._fetcher.close()
        await db.close(timeout=1.0 if forced else 5.0)
        self.events.emit("pool:release", pool=self)
        self.events.emit("stop")
        # Async handlers (those of "stop" too) have run when run() returns.
        await self.events.aclose(within=1.0 if forced else None)
