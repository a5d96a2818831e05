"""The fetcher: locks batches of runnable jobs into the local queue.

It has a connection of its own (one fetch runs at a time, and an idle
worker's first fetch does not wait for a pool checkout). A fetch is one
autocommit statement (``fetch_sql.GET_JOBS``): its rows come back once its
locks are committed, so no job starts before its lock is visible to every
other worker. How many jobs to fetch is :func:`local_queue.plan_fetch`.

The fetcher sleeps until woken: by a slot when the local queue runs short
(:meth:`Fetcher.wake`), or by news of new jobs (:meth:`Fetcher.nudge`: a
notification, the poller, a written result). A fetch that finds fewer jobs
than it asked for marks the queue *exhausted*: only a nudge makes the next
fetch worthwhile.

If a fetch's reply is lost (its connection drops after the statement was
sent), the fetcher cannot know whether it holds the locks: before its next
fetch it ends that session and runs the jobs that fetch locked
(:meth:`Fetcher._recover_lost_fetch`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg

from ...config.options import ForbiddenFlags, WorkerOptions
from ...db.backoff import DEFAULT, one_line
from ...db.connections import WorkerConnections
from ...db.raw_json import read_payloads_raw
from ...jobs.job import Job
from ...jobs.workflow import is_step
from ...jobs.workflow_state import step_contexts
from ...sql import compose
from ...sql import fetch as fetch_sql
from ...sql import workflows as workflows_sql
from ..pool_state import PoolState
from .limited_fetch import LimitedFetch
from .local_queue import Rate, plan_fetch
from .unreadable import Unreadable, read_jobs

__all__ = ["FetchSettings", "Fetcher", "OnFetched", "configure_fetch_connection"]

#: A hook run after each fetch, on the fetch connection, before the jobs are
#: queued (tracing reads their trace contexts). It raises only when the
#: connection broke: the fetch is then treated as lost.
OnFetched = Callable[[psycopg.AsyncConnection[Any], Sequence[Job]], Awaitable[None]]
#: Called with the fetched jobs whose row cannot be read (see :mod:`.unreadable`):
#: they are held, and must be failed.
OnUnreadable = Callable[[Sequence[Unreadable]], None]

logger = logging.getLogger("graphile_worker")

#: Rounds of task registration; each round after the first only meets rows
#: that were being inserted concurrently, so a second one always suffices.
_REGISTER_ATTEMPTS = 5
#: Seconds a lost fetch's session may take to end once told to; the recovery
#: is retried after that.
_END_SESSION_TIMEOUT = 10.0


@dataclass(frozen=True)
class FetchSettings:
    """The options the fetcher follows (see :class:`WorkerOptions`)."""

    schema: str
    concurrency: int
    local_queue_size: int
    local_queue_horizon: float
    forbidden_flags: ForbiddenFlags = None
    #: Due and locked by this process's clock, not the database's now().
    use_local_time: bool = False
    #: Lease limits' slots (:mod:`.leases`): the pool has heartbeats, so its
    #: leases end with it.
    lease_limits: bool = False

    @classmethod
    def of(cls, options: WorkerOptions) -> FetchSettings:
        """The fetcher's settings from the pool's options."""
        return cls(
            options.schema,
            options.concurrency,
            options.local_queue_size,
            options.local_queue_horizon,
            options.forbidden_flags,
            options.use_local_time,
            bool(options.heartbeat_interval),
        )


class Fetcher:
    """Fills one pool's local queue; :meth:`run` is its loop."""

    def __init__(
        self,
        connections: WorkerConnections,
        settings: FetchSettings,
        *,
        tasks: Sequence[str],
        state: PoolState,
        running: Callable[[], int],
        done: Callable[[], int],
        owner: object,
        on_fetched: OnFetched | None = None,
        on_unreadable: OnUnreadable,
        hold_back: Callable[[Sequence[Job]], Sequence[Job]] | None = None,
    ) -> None:
        self._connections = connections
        self._settings = settings
        self._tasks = list(tasks)
        self._queue = state.queue
        #: Ids of the jobs the pool holds locked; fetched ones are added.
        self._held = state.held
        self._running = running
        self._done = done
        self._events = state.events
        #: What handlers of the fetcher's events receive as ``pool``.
        self._owner = owner
        #: Called with each fetch's connection and jobs before they are queued.
        self._on_fetched = on_fetched
        self._on_unreadable = on_unreadable
        #: The fetched jobs' own timeouts (seconds), by job id; the slots take them.
        self._timeouts = state.timeouts
        #: The fetched steps' contexts, by job id; the slots take them.
        self._steps = state.steps
        self._step_contexts = compose(workflows_sql.STEP_CONTEXTS, settings.schema)
        #: Given each fetch's jobs, returns those to queue (the others are
        #: held back by a pause: see :mod:`..background.pause_watch`).
        self._hold_back = hold_back
        self._get_jobs = compose(
            fetch_sql.GET_JOBS_AT if settings.use_local_time else fetch_sql.GET_JOBS,
            settings.schema,
        )
        #: The second statement of each fetch: jobs under limits.
        self.limited = LimitedFetch(
            settings.schema,
            use_local_time=settings.use_local_time,
            nudge=self.nudge,
            leases=state.leases if settings.lease_limits else None,
            queue=state.queue,
            tasks=tasks,
        )
        self._rate = Rate()
        self._wanted = asyncio.Event()
        self._stopped = asyncio.Event()
        self._nudges = 0
        self._task_ids: dict[int, str] = {}
        self._task_id_list: list[int] = []
        self._conn: psycopg.AsyncConnection[Any] | None = None
        #: The connection has its settings (see configure_fetch_connection).
        self._conn_ready = False
        #: The connection's session (pid, backend_start), when it can be ended.
        self._session: tuple[int, Any] | None = None
        #: A fetch whose outcome is unknown: the session it ran in (if known), or True.
        self._lost: tuple[int, Any] | bool = False
        #: The last fetch found fewer jobs than it asked for.
        self.exhausted = False
        #: Slots wake the fetcher when the local queue is this short.
        self.refill_below = settings.concurrency
        #: A fetch is in flight (it plans the next one when it returns).
        self._fetching = False

    @property
    def lost_fetch(self) -> bool:
        """A fetch's reply was lost and its jobs have not been found again yet."""
        return bool(self._lost)

    def adopt_connection(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Take over an open autocommit connection instead of opening one."""
        if self._conn is not None:
            raise RuntimeError("the pool already has a fetch connection")
        self._conn = conn

    def nudge(self) -> None:
        """There may be new runnable jobs: fetch even if the last fetch found none."""
        self._nudges += 1
        self.exhausted = False
        self._wanted.set()

    def limits_changed(self) -> None:
        """A limit may have been set or removed: look again at the next fetch."""
        self.limited.forget()
        self.nudge()

    def wake(self) -> bool:
        """Fetch if the local queue wants more (a slot found it short); whether
        no fetch is in flight (see :meth:`Refill.wake`)."""
        self._wanted.set()
        return not self._fetching

    def stop(self) -> None:
        """Fetch no more; :meth:`run` returns once a fetch in flight is done."""
        self.limited.stop()
        self._stopped.set()
        self._wanted.set()

    async def close(self) -> None:
        """Close the fetcher's connection."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.close()

    async def register_tasks(self) -> None:
        """Learn the id of every task, adding the unknown identifiers (see
        :func:`register_tasks`)."""
        self._task_ids = await register_tasks(
            await self._connection(), self._settings.schema, self._tasks
        )
        self._task_id_list = list(self._task_ids)

    def _plan(self) -> int:
        """How many jobs to fetch now (0: none); also sets :attr:`refill_below`."""
        if self._stopped.is_set():
            return 0
        settings = self._settings
        plan = plan_fetch(
            concurrency=settings.concurrency,
            size=settings.local_queue_size,
            horizon=settings.local_queue_horizon,
            rate=self._rate.per_second(self._done()),
            running=self._running(),
            buffered=len(self._queue),
        )
        self.refill_below = plan.refill_below
        return plan.count

    async def run(self, on_exhausted: Callable[[], None] = lambda: None) -> None:
        """Fetch whenever woken, until stopped. ``on_exhausted`` is called each
        time the queue is found exhausted. A failed fetch, whatever failed (the
        database, a ``forbidden_flags`` function), is logged, emitted as
        ``worker:getJob:error`` and retried with the usual backoff."""
        failures = 0
        while not self._stopped.is_set():
            await self._wanted.wait()
            self._wanted.clear()
            while (wanted := self._plan()) and not self.exhausted:
                nudges = self._nudges
                self._fetching = True
                try:
                    fetched = await self.fetch(wanted)
                except Exception as exc:
                    failures += 1
                    await self._failed(exc, DEFAULT.delay(failures))
                    continue
                finally:
                    self._fetching = False
                failures = 0
                # Short: nothing more to fetch, unless a nudge came in meanwhile (the
                # fetch may not have seen the job that nudge announced).
                if fetched < wanted and nudges == self._nudges:
                    self.exhausted = True
                    if not fetched:
                        self._events.emit("worker:getJob:empty", pool=self._owner)
            if self.exhausted:
                on_exhausted()

    async def _failed(self, exc: Exception, delay: float) -> None:
        logger.error(
            "Failed to fetch jobs (retrying in %.2fs): %s",
            delay,
            one_line(exc),
            exc_info=not isinstance(exc, psycopg.Error),
        )
        self._events.emit("worker:getJob:error", pool=self._owner, error=exc)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self._stopped.wait()

    async def fetch(self, limit: int) -> int:
        """Lock up to ``limit`` jobs into the local queue; returns how many
        (jobs under limits, fetched for the free slots only, counted too)."""
        if self._lost:
            await self._recover_lost_fetch()
        conn = await self._connection()
        flags = await self._forbidden_flags()
        try:
            # Binary results: timestamps cost the server and psycopg a fraction
            # of their text form.
            params: dict[str, Any] = {
                "task_ids": self._task_id_list,
                "forbidden_flags": flags,
                "limit": limit,
                "pool_id": self._connections.pool_id,
            }
            if self._settings.use_local_time:
                params["now"] = datetime.now(UTC)
            cur = await conn.cursor(binary=True).execute(self._get_jobs, params)
            fetched = await self._take(conn, cur)
            limited = self.limited
            applies = await limited.applies(conn, short=fetched < limit)
            await limited.give_back_ended()
            if applies:
                if leased := limited.leased:
                    ids = [i for i, name in self._task_ids.items() if name in leased]
                    fetched += await limited.fetch_leased(
                        conn, params, ids, self._settings.concurrency, self._take_leased
                    )
                    params["task_ids"] = [i for i in self._task_id_list if i not in ids]
                free = self._settings.concurrency - self._running() - self._queue.first_count()
                fetched += await limited.fetch(conn, params, free, self._take)
        except BaseException as exc:
            if conn.broken or conn.closed or isinstance(exc, asyncio.CancelledError):
                # The statement may have committed: its reply is lost.
                self._lost = self._session or True
                await self._drop_connection(conn)
            raise
        return fetched

    async def _take(
        self,
        conn: psycopg.AsyncConnection[Any],
        cur: psycopg.AsyncCursor[Any],
        first: Callable[[Sequence[Job]], None] | None = None,
        *,
        ahead: bool = True,
    ) -> int:
        """Queue the jobs of a fetch's result; how many. With ``first`` (called
        with them before), ahead of every queued job (unless not ``ahead``)."""
        jobs, unreadable = await read_jobs(cur, self._task_ids, self._timeouts)
        steps = [job.id for job in jobs if job.flags is not None and is_step(job.flags)]
        if steps:
            await self._read_steps(conn, steps)
        if first is not None:
            first(jobs)
        if self._on_fetched is not None:
            await self._on_fetched(conn, jobs)
        self._enqueue(jobs, unreadable, first=ahead and first is not None)
        return len(jobs) + len(unreadable)

    async def _take_leased(
        self,
        conn: psycopg.AsyncConnection[Any],
        cur: psycopg.AsyncCursor[Any],
        fetched: Callable[[Sequence[Job]], None] | None = None,
    ) -> int:
        """Queue the jobs fetched under leases, in their order (``fetched`` is
        called with them first)."""
        return await self._take(conn, cur, fetched, ahead=False)

    async def _read_steps(self, conn: psycopg.AsyncConnection[Any], job_ids: list[int]) -> None:
        """Read what the fetched steps' tasks see (their workflows and
        parents), in one statement. If it cannot be read, those jobs run
        without it: ``helpers.parents`` fails them alone (they are retried)."""
        try:
            cur = await conn.execute(self._step_contexts, {"job_ids": job_ids})
            rows = await cur.fetchall()
        except psycopg.Error as exc:
            logger.warning(
                "Could not read the workflow steps of jobs %s: %s (their tasks fail if they "
                "read helpers.parents)",
                ", ".join(map(str, job_ids)),
                one_line(exc),
            )
            return
        self._steps.update(step_contexts(rows))

    def _enqueue(
        self, jobs: Sequence[Job], unreadable: Sequence[Unreadable], *, first: bool = False
    ) -> None:
        self._held.update(job.id for job in jobs)
        self._queue.put(self._hold_back(jobs) if self._hold_back is not None else jobs, first=first)
        if unreadable:
            self._held.update(job.id for job, _ in unreadable)
            self._on_unreadable(unreadable)

    async def _forbidden_flags(self) -> list[str] | None:
        option = self._settings.forbidden_flags
        if option is None:
            return None
        flags: Any = option() if callable(option) else option
        if inspect.isawaitable(flags):
            flags = await flags
        return [str(flag) for flag in flags] if flags else None

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
        conn = await self._connection()
        if isinstance(self._lost, tuple):
            pid, backend_start = self._lost
            params = {"pid": pid, "backend_start": backend_start}
            await conn.execute(fetch_sql.END_LOST_FETCH_SESSION, params)
            async with asyncio.timeout(_END_SESSION_TIMEOUT):
                while True:
                    cur = await conn.execute(fetch_sql.LOST_FETCH_SESSION_GONE, params)
                    row = await cur.fetchone()
                    if row and row[0]:
                        break
                    await asyncio.sleep(0.01)
        pool_id = self._connections.pool_id
        cur = await conn.cursor(binary=True).execute(
            compose(fetch_sql.LOST_FETCH_JOBS, self._settings.schema),
            {"pool_id": pool_id, "known_ids": list(self._held)},
        )
        jobs, unreadable = await read_jobs(cur, self._task_ids, self._timeouts)
        if self._on_fetched is not None:
            await self._on_fetched(conn, jobs)
        self._lost = False
        if jobs or unreadable:
            logger.warning(
                "Worker pool %s: the reply to a fetch was lost after it had locked %d job(s) "
                "(ids: %s); running them now",
                pool_id,
                len(jobs) + len(unreadable),
                ", ".join(str(job.id) for job in [*jobs, *(job for job, _ in unreadable)]),
            )
            leased = self.limited.leased
            back = [job for job in jobs if job.task_identifier in leased]
            if back and self.limited.give_back is not None:
                # Not known to be under a lease now: fetched again under one.
                jobs = [job for job in jobs if job.task_identifier not in leased]
                self._held.update(job.id for job in back)
                await self.limited.give_back(back)
            self._enqueue(jobs, unreadable)

    async def _drop_connection(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Close the connection; the next fetch opens a new one."""
        self._conn = None
        self._conn_ready = False
        self._session = None
        await conn.close()

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        """The fetcher's connection, opened and configured on first use."""
        conn = self._conn
        if conn is not None and not conn.closed:
            if self._conn_ready:
                return conn
        else:
            conn = self._conn = await self._connections.connect("fetch")
        self._session = await configure_fetch_connection(
            conn, no_prepared_statements=self._connections.no_prepared_statements
        )
        self._conn_ready = True
        return conn


async def configure_fetch_connection(
    conn: psycopg.AsyncConnection[Any], *, no_prepared_statements: bool
) -> tuple[int, Any] | None:
    """Settings of a fetch connection: payloads loaded unparsed (parsed in one
    go per fetch), and the session's time zone UTC, so job timestamps come as
    UTC datetimes (the same instants), which psycopg loads several times
    faster than those of a named zone. ``py_get_jobs``' plan is made once per
    session, so a long-lived connection plans it once.

    Through pgBouncer (``no_prepared_statements``) no session setting is made,
    since it could land on another client's server connection. Returns the
    session's (pid, backend_start), by which a lost fetch's session is ended
    (None through pgBouncer, where a session is not the client's own).
    """
    read_payloads_raw(conn)
    if no_prepared_statements:
        conn.prepare_threshold = None
        return None
    cur = await conn.execute(fetch_sql.FETCH_SESSION)
    row = await cur.fetchone()
    return (conn.info.backend_pid, row[1] if row else None)


async def register_tasks(
    conn: psycopg.AsyncConnection[Any], schema: str, tasks: Sequence[str]
) -> dict[int, str]:
    """The id of every task of ``tasks``, adding the unknown identifiers.

    A task row another transaction inserts at the same moment (a job added
    for a new task while this worker starts) makes our insert wait and skip
    it, and it is not in this statement's snapshot either: the statement
    runs again for the missing ones, and then sees it.
    """
    statement = compose(fetch_sql.REGISTER_TASKS, schema)
    task_ids: dict[int, str] = {}
    missing = list(tasks)
    for _ in range(_REGISTER_ATTEMPTS):
        cur = await conn.execute(statement, {"identifiers": missing})
        task_ids.update({int(id_): identifier async for id_, identifier in cur})
        found = set(task_ids.values())
        missing = [identifier for identifier in tasks if identifier not in found]
        if not missing:
            return task_ids
    raise RuntimeError(f"could not register the task(s) {', '.join(missing)}")
