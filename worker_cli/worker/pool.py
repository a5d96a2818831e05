"""A worker pool: fetches jobs, runs them in N slots, writes back the results.

One pool per process. Its parts, each one task the pool owns:

- the *fetcher* locks batches of runnable jobs (``statements.get_jobs``, one
  autocommit statement: a job starts only once its lock is committed) into a
  local priority queue: the idle slots plus about ``local_queue_horizon``
  seconds of work at the current rate, at most ``local_queue_size`` ahead. If
  a fetch's reply is lost (the connection drops after the statement was
  sent), its session is ended and the jobs it locked are found again and run
  (see ``_recover_lost_fetch``);
- N *slots* take jobs from the local queue and run their tasks;
- the *completer* writes successes and failures back in batches: whatever
  finished while the previous batch was being written goes in the next one,
  and while the pool is busy a batch waits up to
  ``complete_job_batch_delay`` for more (group commit: no added delay when
  idle, big batches under load);
- the *listener* holds a dedicated connection that LISTENs to ``jobs:insert``
  and ``worker:migrate``, reconnecting with backoff;
- the *poller* nudges the fetcher every poll interval (due retries and
  scheduled jobs send no notification); the *sweeper* frees stale locks;
- the *heartbeat* (its own thread, see ``heartbeat.py``) lets other pools
  release this pool's jobs if it dies.

Shutdown: stop fetching, give back the jobs that have not started (their
attempt restored), let running jobs finish, set their ``abort_signal`` after
the graceful timeout, and on a forced stop fail them so they retry elsewhere.
A forced stop ends within ``forced_shutdown_timeout`` whatever the database
does: results that could not be written by then are logged by job id (those
jobs will run again: at-least-once).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
import logging
import math
import random
import secrets
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from .. import logs, statements
from ..db import worker_conninfo
from ..events import Events
from ..helpers import Helpers
from ..job import Job, jobs_from_rows, read_payloads_raw
from ..options import WorkerOptions
from ..retry import DELAYS, retry_until_done
from ..tasks import Task
from ..worker_utils import WorkerUtils, sweep_unique_locks
from .heartbeat import Heartbeat

if TYPE_CHECKING:
    from ..crontab import ParsedCronItem

__all__ = ["WorkerPool"]

logger = logging.getLogger("graphile_worker")

#: A slot running jobs that never await yields to the event loop at least this often.
_YIELD_EVERY = 64
#: A batch of results is written at once when it holds this many (however busy
#: the pool is): a bounded statement, and bounded work lost to a crash.
_WRITE_AT_MOST = 1000
#: Name prefix of the threads that run plain (``def``) tasks.
TASK_THREAD_PREFIX = "graphile-worker-task"
#: Rounds of task registration; each round after the first only meets rows
#: that were being inserted concurrently, so a second one always suffices.
_REGISTER_ATTEMPTS = 5
#: Seconds a lost fetch's session may take to end once told to (see
#: WorkerPool._recover_lost_fetch); the recovery is retried after that.
_END_SESSION_TIMEOUT = 10.0


@dataclass(slots=True)
class _Slot:
    """One of the pool's N slots, and the job it is running (if any)."""

    worker_id: str
    #: The slot's asyncio task, cancelled (inside the job) by a forced shutdown.
    task: asyncio.Task[None] | None = None
    job: Job | None = None


@dataclass(slots=True)
class _Failure:
    """A failed job waiting to be written back."""

    job: Job
    worker_id: str
    error: BaseException
    message: str
    replacement_payload: str | None = None


class WorkerPool:
    """Runs jobs of the given tasks until stopped (or, with ``once``, drained)."""

    #: The event loop the pool runs on (set by :meth:`run`).
    _loop: asyncio.AbstractEventLoop

    def __init__(
        self,
        conninfo: str,
        tasks: dict[str, Task],
        options: WorkerOptions,
        *,
        events: Events | None = None,
        once: bool = False,
        cron_items: Sequence[ParsedCronItem] = (),
    ) -> None:
        self.id = f"pool-{secrets.token_hex(9)}"
        self.conninfo = conninfo
        self.tasks = tasks
        self.options = options
        self.events = events or Events()
        self.once = once
        self.cron_items = list(cron_items)
        #: Set when a breaking schema migration was announced (exit code 57).
        self.breaking_migration: str | None = None
        #: Ids of the jobs this pool still held when a forced stop gave up
        #: writing back their results (or giving them back): they run again
        #: once released. Empty after a clean stop.
        self.unwritten_job_ids: list[int] = []
        self._stop = asyncio.Event()
        self._forced = asyncio.Event()
        #: loop.time() by which a forced stop gives up on the database.
        self._forced_deadline = math.inf
        self._fetch_wanted = asyncio.Event()
        self._exhausted = False
        self._nudges = 0
        self._stopping = False
        self._local: asyncio.PriorityQueue[tuple[float, float, int, Job | None]] = (
            asyncio.PriorityQueue()
        )
        self._slots: list[_Slot] = []
        #: Slots running a job right now.
        self._busy = 0
        #: Set (for every running job at once) when the graceful shutdown timeout
        #: has passed: each job's ``helpers.abort_signal``.
        self._abort = asyncio.Event()
        #: Ids of the jobs this pool has locked and not yet written back or
        #: given back: queued, running, or with a result waiting to be written.
        self._held: set[int] = set()
        #: Results waiting to be written: successes (job, worker id) and failures.
        self._succeeded: list[tuple[Job, str]] = []
        self._failed: list[_Failure] = []
        self._outcomes_ready = asyncio.Event()
        #: Ends the completer's batching delay early (see _complete_loop).
        self._write_now = asyncio.Event()
        #: Results of named-queue jobs among the waiting ones (written without delay).
        self._queue_results = 0
        self._writing = False
        self._slots_done = False
        self._task_ids: dict[int, str] = {}
        self._task_id_list: list[int] = []
        self._sentinels = itertools.count()
        self._rate = _Rate()
        #: Slots wake the fetcher when the local queue is this short (the
        #: fetcher keeps it current; see _wanted).
        self._refill_below = options.concurrency
        self._utils: WorkerUtils | None = None
        self._fetch_conn: psycopg.AsyncConnection[Any] | None = None
        #: The fetch connection has its settings (time zone, loaders), and its
        #: session's (pid, backend_start) when it can be ended (not through
        #: pgBouncer).
        self._fetch_conn_ready = False
        self._fetch_session: tuple[int, Any] | None = None
        #: A fetch whose outcome is unknown (its connection dropped after the
        #: statement was sent): the session it ran in (if known), or True.
        self._lost_fetch: tuple[int, Any] | bool = False
        #: Jobs this pool has run to an outcome (success or failure).
        self.jobs_done = 0
        #: Set once the pool is connected and its tasks are registered.
        self.ready = asyncio.Event()

    # --- control ------------------------------------------------------------

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

    def held_job_ids(self) -> list[int]:
        """Ids of the jobs this pool holds locked and has not written back yet."""
        return sorted(self._held)

    def nudge(self) -> None:
        """There may be new runnable jobs: fetch even if the last fetch found none."""
        self._nudges += 1
        self._exhausted = False
        self._fetch_wanted.set()

    def conninfo_for(self, role: str) -> str:
        """The connection string of one of the pool's connections: the worker's
        timeouts and keepalives, and an application_name naming the pool and
        ``role`` (``pool``, ``fetch``, ``listen``, ``heartbeat``) for
        ``pg_stat_activity``."""
        return worker_conninfo(self.conninfo, f"graphile-worker {self.id} {role}")

    # --- main ---------------------------------------------------------------

    def adopt_connection(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Take over an open autocommit connection (the one that checked the
        schema) as the fetcher's, instead of opening another; closed with the pool."""
        if self._fetch_conn is not None:
            raise RuntimeError("the pool already has a fetch connection")
        self._fetch_conn = conn

    async def run(self) -> None:
        """Run until stopped; returns once every job is written back, or after
        a forced stop once the results are written or ``forced_shutdown_timeout``
        has passed (see :attr:`unwritten_job_ids`)."""
        options = self.options
        kwargs: dict[str, Any] = {"autocommit": True}
        if options.no_prepared_statements:
            kwargs["prepare_threshold"] = None
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            self.conninfo_for("pool"),
            min_size=2,
            max_size=options.max_pool_size,
            kwargs=kwargs,
            open=False,
            name=self.id,
        )
        executor = ThreadPoolExecutor(
            max_workers=options.concurrency, thread_name_prefix=TASK_THREAD_PREFIX
        )
        self._loop = asyncio.get_running_loop()
        heartbeat = None
        if options.heartbeat_interval:
            heartbeat = Heartbeat(
                self.conninfo_for("heartbeat"),
                schema=options.schema,
                pool_id=self.id,
                interval=options.heartbeat_interval,
                timeout=options.heartbeat_timeout,
                on_released=self.nudge,
            )
        self.events.emit("pool:create", pool=self)
        started = False
        try:
            # The pool's connections open and the heartbeat makes its first beat
            # (before any job is locked) while the tasks are registered through
            # the fetcher's connection.
            try:
                async with asyncio.TaskGroup() as start:
                    start.create_task(pool.open(wait=True))
                    start.create_task(self._register_tasks())
                    if heartbeat:
                        start.create_task(heartbeat.start())
            except BaseExceptionGroup as failure:
                raise failure.exceptions[0] from None  # the first error, as it was raised
            started = True
            self._utils = WorkerUtils(pool, options.schema)
            async with asyncio.TaskGroup() as group:
                self._slots = [
                    _Slot(f"worker-{secrets.token_hex(9)}") for _ in range(options.concurrency)
                ]
                slots = []
                for slot in self._slots:
                    slot.task = group.create_task(self._slot(slot, executor))
                    slots.append(slot.task)
                fetcher = group.create_task(self._fetch_loop())
                completer = group.create_task(self._complete_loop())
                helpers = []
                if not self.once:
                    helpers = [
                        group.create_task(self._listen_loop()),
                        group.create_task(self._poll_loop()),
                        group.create_task(self._sweep_loop()),
                    ]
                    if self.cron_items:
                        from .cron import CronScheduler

                        scheduler = CronScheduler(self.cron_items, pool, options.schema)
                        helpers.append(group.create_task(scheduler.run()))
                self.nudge()
                self.ready.set()
                await self._stop.wait()
                await self._shutdown(fetcher, slots, completer, helpers)
        finally:
            forced = self._forced.is_set()
            executor.shutdown(wait=False, cancel_futures=True)
            self._utils = None
            self._report_unwritten()
            if heartbeat:
                # Beats on until every result is written; a pool that stops
                # holding jobs keeps its row, so that others release them.
                clean = started and not self._held and not self._lost_fetch
                heartbeat.stop(remove=clean)
                await heartbeat.wait_stopped(1.0 if forced else 10.0)
            if self._fetch_conn is not None:
                await self._fetch_conn.close()
                self._fetch_conn = None
            await pool.close(timeout=1.0 if forced else 5.0)
            self.events.emit("pool:release", pool=self)
            self.events.emit("stop")
            # Async handlers (those of "stop" too) have run when run() returns.
            await self.events.aclose(within=1.0 if forced else None)

    async def _shutdown(
        self,
        fetcher: asyncio.Task[None],
        slots: Sequence[asyncio.Task[None]],
        completer: asyncio.Task[None],
        helpers: Sequence[asyncio.Task[None]],
    ) -> None:
        self._stopping = True
        self._write_now.set()  # results no longer wait for others to join them
        for task in helpers:
            task.cancel()
        # A fetch in flight is allowed to finish (its jobs are locked for us),
        # unless the stop is forced.
        self._fetch_wanted.set()
        await self._finish(fetcher)
        unstarted = self._drain_local_queue()
        for _ in slots:
            self._local.put_nowait((math.inf, next(self._sentinels), 0, None))
        # Returned while the running jobs are waited for: the return may need a
        # connection that a running task holds until its abort_signal is set.
        returning = asyncio.ensure_future(self._return_unstarted(unstarted))
        if self._busy:
            await self._wait_for_running(slots)
        await asyncio.gather(*slots)
        self._slots_done = True
        self._outcomes_ready.set()
        self._write_now.set()
        # The helpers were cancelled above; one inside a query may take a while
        # to end (psycopg asks the server to cancel it), bounded when forced.
        await self._finish(returning, completer, *helpers)

    async def _finish(self, *tasks: asyncio.Future[None]) -> None:
        """Wait for ``tasks``; once a forced stop has begun, only until its
        deadline, then cancel what is left (the database may be unreachable)."""
        pending: set[asyncio.Future[Any]] = {task for task in tasks if not task.done()}
        forced: asyncio.Future[Any] = asyncio.ensure_future(self._forced.wait())
        try:
            while pending and not self._forced.is_set():
                _, pending = await asyncio.wait(
                    pending | {forced}, return_when=asyncio.FIRST_COMPLETED
                )
                pending.discard(forced)
            if pending:
                remaining = self._forced_deadline - self._loop.time()
                _, pending = await asyncio.wait(pending, timeout=max(0.0, remaining))
            for task in pending:
                await _cancel_and_wait(task)
        finally:
            forced.cancel()
        for task in tasks:
            if task.done() and not task.cancelled():
                task.result()  # raise its error

    def _report_unwritten(self) -> None:
        """After a forced stop: name the jobs whose results (or return) could not
        be written; they stay locked by this pool until released."""
        if not self._held and not self._lost_fetch:
            return
        self.unwritten_job_ids = sorted(self._held)
        release = (
            f"once another worker declares this pool dead ({self.options.heartbeat_timeout:g}s "
            "after its last heartbeat)"
            if self.options.heartbeat_interval
            else "by force_unlock_workers(['" + self.id + "']) or the 4-hour stale-lock sweep"
        )
        lost = (
            "; a fetch was interrupted too, and the jobs it may have locked stay locked as well"
            if self._lost_fetch
            else ""
        )
        logger.error(
            "Worker pool %s: stopped without writing back %d job(s) (ids: %s)%s. Unless a "
            "write still in flight lands, they stay locked by this pool and will run again "
            "%s: a job runs at least once, and these may already have run.",
            self.id,
            len(self.unwritten_job_ids),
            ", ".join(map(str, self.unwritten_job_ids)) or "none",
            lost,
            release,
        )

    async def _return_unstarted(self, unstarted: list[Job]) -> None:
        if unstarted:
            await retry_until_done(
                "return unstarted jobs", self._return_jobs, unstarted, logger=logger
            )
            logger.info("Worker pool %s: returned %d unstarted job(s)", self.id, len(unstarted))

    async def _wait_for_running(self, slots: Sequence[asyncio.Task[None]]) -> None:
        all_slots: asyncio.Future[Any] = asyncio.gather(*slots)
        forced: asyncio.Future[Any] = asyncio.ensure_future(self._forced.wait())
        try:
            done, _ = await asyncio.wait(
                {all_slots, forced},
                timeout=self.options.graceful_shutdown_timeout,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if not done:
                logger.warning(
                    "Worker pool %s: %d job(s) still running after %.1fs; "
                    "setting their abort_signal",
                    self.id,
                    self._busy,
                    self.options.graceful_shutdown_timeout,
                )
                self._abort.set()
                await asyncio.wait({all_slots, forced}, return_when=asyncio.FIRST_COMPLETED)
            if self._forced.is_set():
                for slot in self._slots:
                    if slot.job is not None and slot.task is not None:
                        slot.task.cancel()
            await all_slots
        finally:
            forced.cancel()

    def _drain_local_queue(self) -> list[Job]:
        jobs = []
        while not self._local.empty():
            job = self._local.get_nowait()[3]
            if job is not None:
                jobs.append(job)
        return jobs

    # --- fetching -----------------------------------------------------------

    async def _register_tasks(self) -> None:
        """Learn the id of every loaded task, adding the unknown identifiers.

        A task row another transaction inserts at the same moment (a job
        added for a new task while this worker starts) makes our insert wait
        and skip it, and it is not in this statement's snapshot either: the
        statement runs again for the missing ones, and then sees it.
        """
        statement = statements.compose(statements.register_tasks, self.options.schema)
        task_ids: dict[int, str] = {}
        missing = list(self.tasks)
        for _ in range(_REGISTER_ATTEMPTS):
            conn = await self._fetcher_connection()
            cur = await conn.execute(statement, {"identifiers": missing})
            task_ids.update({int(id_): identifier async for id_, identifier in cur})
            found = set(task_ids.values())
            missing = [identifier for identifier in self.tasks if identifier not in found]
            if not missing:
                break
        else:
            raise RuntimeError(f"could not register the task(s) {', '.join(missing)}")
        self._task_ids = task_ids
        self._task_id_list = list(task_ids)

    def _buffer_target(self) -> int:
        """Jobs to hold ahead: enough for ``local_queue_horizon`` seconds of work at
        the current completion rate, within ``local_queue_size``. Slow jobs are
        not hoarded (other workers can take them); fast ones come in batches."""
        horizon = self.options.local_queue_horizon
        if math.isinf(horizon):
            return self.options.local_queue_size  # always full
        wanted = math.ceil(self._rate.per_second(self.jobs_done) * horizon)
        return min(self.options.local_queue_size, wanted)

    def _wanted(self) -> int:
        """How many jobs to fetch now (0: none)."""
        if self._stopping:
            return 0
        idle = self.options.concurrency - self._busy
        buffered = self._local.qsize()
        target = self._buffer_target()
        self._refill_below = max(self.options.concurrency, target // 2)
        if buffered >= idle and buffered > target // 2:
            return 0
        return max(0, idle + target - buffered)

    async def _fetch_loop(self) -> None:
        """Fetch while slots want jobs. A failed fetch, whatever failed (the
        database, a ``forbidden_flags`` function), is logged, emitted as
        ``worker:getJob:error`` and retried with growing delays."""
        failures = 0
        while not self._stopping:
            await self._fetch_wanted.wait()
            self._fetch_wanted.clear()
            while (wanted := self._wanted()) and not self._exhausted:
                nudges = self._nudges
                try:
                    fetched = await self._fetch(wanted)
                except Exception as exc:
                    failures += 1
                    delay = DELAYS[min(failures, len(DELAYS)) - 1]
                    logger.error(
                        "Failed to fetch jobs (retrying in %.2fs): %s",
                        delay,
                        _one_line(exc),
                        exc_info=not isinstance(exc, psycopg.Error),
                    )
                    self.events.emit("worker:getJob:error", pool=self, error=exc)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(delay):
                            await self._stop.wait()
                    continue
                failures = 0
                # Short: nothing more to fetch, unless a nudge came in meanwhile (the
                # fetch may not have seen the job that nudge announced).
                if fetched < wanted and nudges == self._nudges:
                    self._exhausted = True
                    if not fetched:
                        self.events.emit("worker:getJob:empty", pool=self)
            if self.once and self._exhausted and self._is_drained():
                self.stop("no runnable jobs left")

    def _is_drained(self) -> bool:
        return (
            self._local.empty()
            and not self._busy
            and not self._succeeded
            and not self._failed
            and not self._writing
        )

    async def _forbidden_flags(self) -> list[str] | None:
        option = self.options.forbidden_flags
        flags: Any = option() if callable(option) else option
        if inspect.isawaitable(flags):
            flags = await flags
        return [str(flag) for flag in flags] if flags else None

    def _enqueue(self, jobs: Sequence[Job]) -> None:
        for job in jobs:
            self._held.add(job.id)
            self._local.put_nowait((job.priority, job.run_at.timestamp(), job.id, job))

    async def _fetch(self, limit: int) -> int:
        """Lock up to ``limit`` jobs into the local queue; returns how many.

        One autocommit statement: its rows come back once its locks are
        committed, so no job starts before its lock is visible to every
        other worker.
        """
        if self._lost_fetch:
            await self._recover_lost_fetch()
        conn = await self._fetcher_connection()
        flags = None if self.options.forbidden_flags is None else await self._forbidden_flags()
        try:
            # Binary results: timestamps cost the server and psycopg a fraction
            # of their text form.
            cur = await conn.cursor(binary=True).execute(
                statements.compose(statements.get_jobs, self.options.schema),
                {
                    "task_ids": self._task_id_list,
                    "forbidden_flags": flags,
                    "limit": limit,
                    "pool_id": self.id,
                },
            )
            jobs = jobs_from_rows(await cur.fetchall(), self._task_ids)
        except BaseException as exc:
            if conn.broken or conn.closed or isinstance(exc, asyncio.CancelledError):
                # The statement may have committed: its reply is lost.
                self._lost_fetch = self._fetch_session or True
                await self._drop_fetch_connection(conn)
            raise
        self._enqueue(jobs)
        return len(jobs)

    async def _recover_lost_fetch(self) -> None:
        """Find and run the jobs a fetch locked whose reply was lost.

        The lost fetch may have committed, failed, or still be running in its
        session on the server. That session is ended first, and once it is
        gone its transaction is over either way; then the jobs locked by this
        pool that it does not know about are the ones that fetch locked (a
        pool fetches one batch at a time). Through pgBouncer the session
        cannot be told apart from other clients', so it is not ended: the
        jobs are read at once.
        """
        conn = await self._fetcher_connection()
        session = self._lost_fetch
        if isinstance(session, tuple):
            pid, backend_start = session
            params = {"pid": pid, "backend_start": backend_start}
            await conn.execute(statements.end_lost_fetch_session, params)
            async with asyncio.timeout(_END_SESSION_TIMEOUT):
                while True:
                    cur = await conn.execute(statements.lost_fetch_session_gone, params)
                    row = await cur.fetchone()
                    if row and row[0]:
                        break
                    await asyncio.sleep(0.01)
        cur = await conn.cursor(binary=True).execute(
            statements.compose(statements.lost_fetch_jobs, self.options.schema),
            {"pool_id": self.id, "known_ids": list(self._held)},
        )
        jobs = jobs_from_rows(await cur.fetchall(), self._task_ids)
        self._lost_fetch = False
        if jobs:
            logger.warning(
                "Worker pool %s: the reply to a fetch was lost after it had locked %d job(s) "
                "(ids: %s); running them now",
                self.id,
                len(jobs),
                ", ".join(str(job.id) for job in jobs),
            )
            self._enqueue(jobs)

    async def _drop_fetch_connection(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Close the fetch connection; the next fetch opens a new one."""
        self._fetch_conn = None
        self._fetch_conn_ready = False
        self._fetch_session = None
        await conn.close()

    async def _fetcher_connection(self) -> psycopg.AsyncConnection[Any]:
        """The fetcher's own connection: one fetch runs at a time, and an idle
        worker's first fetch does not wait for a pool checkout.

        get_jobs calls py_get_jobs, whose plan is made once per session: a
        long-lived connection plans it once. The session's time zone is UTC,
        so job timestamps come as UTC datetimes (the same instants), which
        psycopg loads several times faster than those of a named zone. Not
        through pgBouncer (``no_prepared_statements``): a session setting
        there could land on another client's server connection.
        """
        conn = self._fetch_conn
        if conn is not None and not conn.closed:
            if self._fetch_conn_ready:
                return conn
        else:
            kwargs: dict[str, Any] = {"autocommit": True}
            if self.options.no_prepared_statements:
                kwargs["prepare_threshold"] = None
            conn = self._fetch_conn = await psycopg.AsyncConnection.connect(
                self.conninfo_for("fetch"), **kwargs
            )
        self._fetch_session = await configure_fetch_connection(
            conn, no_prepared_statements=self.options.no_prepared_statements
        )
        self._fetch_conn_ready = True
        return conn

    # --- running ------------------------------------------------------------

    async def _slot(self, slot: _Slot, executor: ThreadPoolExecutor) -> None:
        self.events.emit("worker:create", worker_id=slot.worker_id, tasks=self.tasks)
        local = self._local
        streak = 0
        while True:
            job = (local.get_nowait() if not local.empty() else await local.get())[3]
            if job is None:
                break
            await self._run_job(slot, job, executor)
            streak += 1
            # Wake the fetcher only when it has something to do (it re-checks).
            if not self._exhausted and local.qsize() <= self._refill_below:
                self._fetch_wanted.set()
                streak = _YIELD_EVERY
            # Jobs that never await would let this slot drain the whole local
            # queue in one step: yield when the fetcher has work, and at least
            # every _YIELD_EVERY jobs (the completer's timer runs then too).
            if streak >= _YIELD_EVERY:
                streak = 0
                await asyncio.sleep(0)
        self.events.emit("worker:stop", worker_id=slot.worker_id)

    async def _run_job(self, slot: _Slot, job: Job, executor: ThreadPoolExecutor) -> None:
        """Run one job and queue its outcome for the completer.

        An async task runs inline in this slot's asyncio task (no task per
        job); a forced shutdown cancels the slot while it is inside the job.
        A plain function runs in the executor.
        """
        task = self.tasks[job.task_identifier]
        assert self._utils is not None
        helpers = Helpers(
            job,
            worker_id=slot.worker_id,
            utils=self._utils,
            abort_signal=self._abort,
            loop=self._loop,
        )
        slot.job = job
        started = time.perf_counter()
        self._busy += 1
        events = self.events
        if events.wants("job:start"):
            events.emit("job:start", worker_id=slot.worker_id, job=job)
        error: BaseException | None = None
        replacement: str | None = None
        try:
            if task.is_async:
                result = await task.function(job.payload, helpers)
            else:
                result = await self._loop.run_in_executor(
                    executor, _contained_call, task.function, job.payload, helpers
                )
            if isinstance(result, list) and isinstance(job.payload, list):
                error, replacement = _batch_failures(job, result)
        except asyncio.CancelledError:
            if not self._forced.is_set() or slot.task is None:
                raise
            slot.task.uncancel()
            error = RuntimeError("the worker was stopped while the job was running")
        except _Escaped as exc:
            error = exc.original
        except BaseException as exc:  # SystemExit, GeneratorExit, ... too: the job failed
            error = exc
        finally:
            slot.job = None
            self._busy -= 1
        self.jobs_done += 1
        if error is None:
            if self.options.log_success or events.wants("job:success"):
                self._report_success(job, slot.worker_id, started)
            self._succeeded.append((job, slot.worker_id))
        else:
            failure = _Failure(job, slot.worker_id, error, _describe(error), replacement)
            self._report_failure(failure, started)
            self._failed.append(failure)
        self._outcomes_ready.set()
        # The completer may be letting a batch grow (see _complete_loop): end
        # the wait if this result should not wait.
        if job.job_queue_id is not None:
            self._queue_results += 1  # its named queue stays locked until written
        if self._results_due():
            self._write_now.set()

    def _report_success(self, job: Job, worker_id: str, started: float) -> None:
        if self.options.log_success:
            duration = (time.perf_counter() - started) * 1000
            logs.job_succeeded(job, worker_id, self.id, duration)
        self.events.emit("job:success", worker_id=worker_id, job=job)

    def _report_failure(self, failure: _Failure, started: float) -> None:
        job, worker_id, error = failure.job, failure.worker_id, failure.error
        duration = (time.perf_counter() - started) * 1000
        logs.job_failed(job, worker_id, self.id, duration, failure.message, error)
        self.events.emit("job:error", worker_id=worker_id, job=job, error=error)
        if job.attempts >= job.max_attempts:
            self.events.emit("job:failed", worker_id=worker_id, job=job, error=error)

    # --- writing results ----------------------------------------------------

    def _results_due(self) -> bool:
        """True when the waiting results should be written without a batching delay."""
        return (
            self._stopping
            or self._queue_results > 0
            or (not self._busy and self._local.empty())
            or len(self._succeeded) + len(self._failed) >= _WRITE_AT_MOST
        )

    async def _complete_loop(self) -> None:
        """Write results back in batches (group commit).

        Whatever finished while the previous batch was being written goes into
        the next one. While the pool is busy, a batch also waits up to
        ``complete_job_batch_delay`` for more results to join it: one statement
        and one commit (a WAL flush) for all of them. It is written at once
        when the pool has nothing else running or queued, when it holds a job
        of a named queue (the queue stays locked until then), and when it is
        large.
        """
        delay = self.options.complete_job_batch_delay
        while True:
            # State is checked before waiting, so no wake-up can be missed.
            if not self._succeeded and not self._failed:
                if self._slots_done:
                    return
                await self._outcomes_ready.wait()
                self._outcomes_ready.clear()
                continue
            if delay > 0:
                self._write_now.clear()
                if not self._results_due():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(delay):
                            await self._write_now.wait()
            succeeded, self._succeeded = self._succeeded, []
            failed, self._failed = self._failed, []
            self._queue_results = 0
            self._writing = True
            try:
                await retry_until_done(
                    "record job results", self._write_outcomes, succeeded, failed, logger=logger
                )
            finally:
                self._writing = False
            self._held.difference_update(job.id for job, _ in succeeded)
            self._held.difference_update(failure.job.id for failure in failed)
            if self.events.wants("job:complete"):
                for job, worker_id in succeeded:
                    self.events.emit("job:complete", worker_id=worker_id, job=job, error=None)
                for failure in failed:
                    self.events.emit(
                        "job:complete",
                        worker_id=failure.worker_id,
                        job=failure.job,
                        error=failure.error,
                    )
            # A finished job may have released its named queue.
            self.nudge()

    async def _write_outcomes(
        self, succeeded: list[tuple[Job, str]], failed: list[_Failure]
    ) -> None:
        assert self._utils is not None
        schema = self.options.schema
        async with self._utils.pool.connection() as conn:
            if succeeded:
                await conn.execute(
                    statements.compose(statements.complete_batch, schema),
                    {"job_ids": [job.id for job, _ in succeeded], "pool_id": self.id},
                )
            if failed:
                await conn.execute(
                    statements.compose(statements.fail_batch, schema),
                    {
                        "job_ids": [f.job.id for f in failed],
                        "messages": [f.message for f in failed],
                        "payloads": [f.replacement_payload for f in failed],
                        "pool_id": self.id,
                    },
                )

    async def _return_jobs(self, jobs: list[Job]) -> None:
        assert self._utils is not None
        async with self._utils.pool.connection() as conn:
            await conn.execute(
                statements.compose(statements.return_jobs, self.options.schema),
                {"job_ids": [job.id for job in jobs], "pool_id": self.id},
            )
        self._held.difference_update(job.id for job in jobs)

    # --- listening, polling, sweeping ---------------------------------------

    async def _listen_loop(self) -> None:
        attempt = 0
        while True:
            self.events.emit("pool:listen:connecting", pool=self)
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.conninfo_for("listen"), autocommit=True
                ) as conn:
                    await conn.execute('listen "jobs:insert"')
                    await conn.execute('listen "worker:migrate"')
                    if attempt:
                        logger.info("Worker pool %s: listening again", self.id)
                        # The outage likely broke the pool's idle connections too:
                        # drop them now rather than in a task's first query.
                        if self._utils is not None:
                            await self._utils.pool.check()
                    attempt = 0
                    self.events.emit("pool:listen:success", pool=self)
                    self.nudge()  # catch up on jobs added while we were not listening
                    async for notify in conn.notifies():
                        self._on_notify(notify.channel, notify.payload)
                        # Let the fetcher send its query before psycopg goes on
                        # reading this connection: ~0.1 ms off add_job -> task start.
                        await asyncio.sleep(0)
            except psycopg.Error as exc:
                attempt += 1
                delay = min(30.0, 0.5 * 2 ** (attempt - 1)) * (0.5 + random.random())
                logger.warning(
                    "Worker pool %s: LISTEN connection lost (%s); reconnecting in %.1fs",
                    self.id,
                    _one_line(exc),
                    delay,
                )
                self.events.emit("pool:listen:error", pool=self, error=exc)
                await asyncio.sleep(delay)

    def _on_notify(self, channel: str, payload: str) -> None:
        if channel == "jobs:insert":
            self.nudge()
        elif channel == "worker:migrate":
            try:
                details = json.loads(payload)
            except ValueError:
                return
            if details.get("breaking"):
                self.breaking_migration = (
                    f"breaking schema migration {details.get('migrationNumber')} was applied "
                    "by another worker"
                )
                self.stop(self.breaking_migration)

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.poll_interval)
            if self._exhausted:
                self.nudge()

    async def _sweep_loop(self) -> None:
        low, high = self.options.stale_sweep_interval
        while True:
            await asyncio.sleep(random.uniform(low, high))
            assert self._utils is not None
            await sweep_unique_locks(self._utils)
            try:
                async with self._utils.pool.connection() as conn:
                    cur = await conn.execute(
                        statements.compose(statements.release_stale_locks, self.options.schema),
                        {"lock_timeout": self.options.stale_lock_timeout},
                    )
                    row = await cur.fetchone()
            except psycopg.Error as exc:
                logger.warning("Stale lock sweep failed: %s", exc)
                continue
            if row and (row[0] or row[1]):
                logger.warning(
                    "Released %d job(s) and %d queue(s) locked for over %s by crashed workers",
                    row[0],
                    row[1],
                    self.options.stale_lock_timeout,
                )
                self.nudge()


async def configure_fetch_connection(
    conn: psycopg.AsyncConnection[Any], *, no_prepared_statements: bool
) -> tuple[int, Any] | None:
    """Settings of a pool's fetch connection (see WorkerPool._fetcher_connection):
    payloads loaded unparsed, and the time zone UTC unless through pgBouncer.
    Returns the session's (pid, backend_start), by which a lost fetch's session
    is ended (None through pgBouncer, where a session is not the client's own)."""
    read_payloads_raw(conn)
    if no_prepared_statements:
        conn.prepare_threshold = None
        return None
    cur = await conn.execute(statements.fetch_session)
    row = await cur.fetchone()
    return (conn.info.backend_pid, row[1] if row else None)


class _Rate:
    """Events per second: an exponentially weighted average of a running count,
    sampled whenever the rate is read (the events since the last reading count
    as spread evenly over the time since).

    The time constant is short (50 ms, the default fetch-ahead horizon) so
    that fetching ahead ramps up within a few fetches when a backlog appears:
    the target (rate x horizon) then follows the jobs done so far, roughly
    doubling fetch after fetch. With 1 s it took ~10,000 jobs to reach a local
    queue of 500.
    """

    TAU = 0.05

    def __init__(self) -> None:
        self._value = 0.0
        self._count = 0
        self._at = time.monotonic()

    def per_second(self, count: int) -> float:
        """The rate, given the running count now."""
        now = time.monotonic()
        elapsed = now - self._at
        if elapsed > 0:
            kept = math.exp(-elapsed / self.TAU)
            self._value = self._value * kept + (count - self._count) / elapsed * (1 - kept)
            self._count, self._at = count, now
        return self._value


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
        + "\n".join(_describe(entry) for _, entry in failed)
    )
    return error, json.dumps([item for item, _ in failed])


def _describe(error: BaseException) -> str:
    """The text stored as a job's last_error. Never raises: an exception whose
    ``__str__`` fails is described as ``<unprintable ...>``. NUL characters and
    lone surrogates, which a PostgreSQL text value cannot hold, are written as
    escapes: stored raw, they would fail the write of every result in the
    batch, again and again."""
    name = type(error).__name__
    try:
        text = str(error)
    except BaseException:
        text = f"<unprintable {name} object>"
    described = f"{name}: {text}" if text else name
    return described.encode("utf-8", "backslashreplace").decode().replace("\x00", "\\x00")


def _one_line(error: BaseException) -> str:
    """An error's message on one line, for log lines."""
    return " ".join(_describe(error).split(": ", 1)[-1].split()) or type(error).__name__


async def _cancel_and_wait(task: asyncio.Future[Any], within: float = 2.0) -> None:
    """Cancel ``task`` and wait for it to end, cancelling again while it resists
    (psycopg answers a first cancellation by asking the server to cancel the
    query, and waits for that). Gives up after ``within`` seconds."""
    deadline = asyncio.get_running_loop().time() + within
    while not task.done():
        task.cancel()
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            logger.warning("A shutdown step did not end when cancelled; left behind")
            return
        await asyncio.wait({task}, timeout=min(0.1, remaining))
