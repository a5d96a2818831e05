"""Waiting for a job: ``wait_for_job``, what both facades share, and the two
listeners (an asyncio task, a thread).

Race-free by construction, in this order:

1. the utilities' listener LISTENs on ``<schema>:py:finished``
   (:func:`~worker_cli.schema.channels.finished_channel`): one connection
   per utilities object serves all its waiters (:class:`AsyncWaitListener`
   for asyncio, :class:`SyncWaitListener` blocking: no mechanical twin of
   each other, so both are written here);
2. the waiter registers its interest: the job's row in
   ``_private_py_job_options`` gets ``notify_on_finish`` (committed at once);
3. it reads the job's state (``py_job_status``) and returns if it is done.

A job that finished before step 3 is seen by the read; one that finishes
after it is announced by the worker's result statement, which notifies the
ids of the jobs with ``notify_on_finish`` it wrote (one NOTIFY per batch, in
the same statement). Nothing is lost for long either way: the waiter also
polls (1 s, growing to 5 s: a result statement already running when the
waiter registered, a job finished by a Node worker or an admin function,
notifications lost while the listener reconnects), and after the listener
reconnects every waiter reads again. A job id nobody can see reads
``unknown``; as it may belong to a transaction not committed yet, it is read
again for :data:`VISIBILITY_GRACE` seconds (or until a shorter timeout) before
``unknown`` is returned.

The wait loop itself is :func:`~.async_waiting.wait_async`, and its blocking
twin :func:`~.sync_waiting.wait_blocking`, generated from it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import select
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import Any, Literal, Protocol

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from ..db.backoff import RECONNECT, Backoff, one_line
from ..db.connections import worker_conninfo
from ..db.notifications import notifications
from ..errors import ConfigurationError, GraphileWorkerError, JobSpecError
from ..jobs.inside_worker import in_worker_task
from ..jobs.job_state import FINAL_STATES, JobProgress, JobResult, check_job_id
from ..sql import listen as listen_sql

__all__ = [
    "POLL",
    "VISIBILITY_GRACE",
    "AsyncWaitListener",
    "SyncWaitListener",
    "Until",
    "WaitTimeout",
    "Waiting",
    "check_wait",
    "listen_statement",
    "resolve",
]

logger = logging.getLogger("graphile_worker")

Until = Literal["final", "attempt"]

#: Seconds an id nobody can see is read again before ``unknown`` is returned:
#: it may be a job added in a transaction not committed yet.
VISIBILITY_GRACE = 2.0
#: The safety poll: 1 s after the first read, growing to 5 s.
POLL = Backoff((1.0, 2.0, 3.0, 4.0, 5.0), jitter=0.1)
#: Seconds between two reads of a waiter told of progress (``on_progress``):
#: the workers write it at most this often.
PROGRESS_POLL = 0.5
#: ``application_name`` of the listener's connection (unless the
#: connection string sets one).
APPLICATION_NAME = "graphile-worker waiter"
#: Seconds :meth:`SyncWaitListener.close` waits for the thread at most (it may
#: be inside a connection attempt, bounded by ``connect_timeout``).
_JOIN_TIMEOUT = 15.0


class WaitTimeout(TimeoutError, GraphileWorkerError):
    """``wait_for_job`` gave up: the job did not reach the state waited for
    within the timeout. The job is left as it is. ``last`` is its record as
    last read (None if it could not be read)."""

    def __init__(self, job_id: int, timeout: float, last: JobResult | None) -> None:
        state = last.state if last is not None else "not read (database unreachable)"
        super().__init__(f"job {job_id} did not finish within {timeout:g}s (it is {state})")
        self.job_id = job_id
        self.timeout = timeout
        self.last = last


def check_wait(
    job_id: int, timeout: float | None, until: str, *, allow_in_task: bool, given: bool
) -> None:
    """The arguments of ``wait_for_job``, checked before any I/O; and refused
    inside a job of this process's worker (unless ``allow_in_task``) or on
    utilities over the caller's connection."""
    check_job_id(job_id)
    if until not in ("final", "attempt"):
        raise JobSpecError("until", f"is {until!r}; it must be 'final' or 'attempt'")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout < 0
    ):
        raise JobSpecError("timeout", f"is {timeout!r}; it must be None or seconds, 0 or more")
    if given:
        raise ConfigurationError(
            "wait_for_job needs connections of its own, and these utilities use the "
            "connection given (connection=), whose transaction a wait must not join: "
            "use utilities on a pool (a connection string or pool=)"
        )
    if not allow_in_task and in_worker_task():
        raise RuntimeError(
            "wait_for_job was called inside a task run by this process's worker: "
            "waiting there holds a slot, and a pool whose slots all wait never runs "
            "the jobs they wait for. Add the next job instead, or pass "
            "allow_in_task=True if the pool can spare the slot."
        )


class Waiting:
    """The decisions of one wait, no I/O: is this record the end, and if not,
    how long to wait before reading again."""

    def __init__(
        self,
        job_id: int,
        timeout: float | None,
        until: Until,
        clock: Callable[[], float] = time.monotonic,
        on_progress: Callable[[JobProgress], object] | None = None,
    ) -> None:
        self.job_id = job_id
        #: Told each new progress the reads find (``wait_for_job(on_progress=)``).
        self.on_progress = on_progress
        self._progress: JobProgress | None = None
        self.timeout = timeout
        self.until = until
        self._clock = clock
        now = clock()
        self.deadline = None if timeout is None else now + timeout
        self.grace_end = now + VISIBILITY_GRACE
        #: The job has been seen (in any state but unknown).
        self.seen = False
        self.last: JobResult | None = None
        self._polls = 0

    def remaining(self) -> float | None:
        """Seconds left before the timeout (None: no timeout)."""
        return None if self.deadline is None else max(0.0, self.deadline - self._clock())

    def done(self, record: JobResult) -> bool:
        """Whether ``record`` ends the wait."""
        if record.state == "unknown":
            # Seen then gone: finished by Node or an admin function. Never
            # seen: perhaps not committed yet, until the grace is over.
            return self.seen or self._clock() >= self.grace_end
        self.seen = True
        # An attempt has ended when the job will run again: retrying, or
        # paused after a failed attempt (a pause holds it now).
        return record.state in FINAL_STATES or (
            self.until == "attempt"
            and (record.state == "retrying" or (record.state == "paused" and bool(record.attempts)))
        )

    def next(self, record: JobResult | None) -> JobResult | float:
        """The record to return, or the seconds to wait for a notification
        before reading again (None: the read failed). Raises
        :class:`WaitTimeout` once the timeout is over."""
        if record is not None:
            self.last = record
            progress = record.progress
            if self.on_progress is not None and progress is not None and progress != self._progress:
                self._progress = progress
                self.on_progress(progress)
            if self.done(record):
                return record
        now = self._clock()
        if self.deadline is not None and now >= self.deadline:
            if self.last is not None and self.last.state == "unknown" and not self.seen:
                # A timeout shorter than the grace ends it early: the id is
                # unknown, as after the grace (not a job that did not finish).
                return self.last
            assert self.timeout is not None
            raise WaitTimeout(self.job_id, self.timeout, self.last)
        self._polls += 1
        delay = POLL.delay(self._polls)
        if self.on_progress is not None:  # progress is written twice a second
            delay = min(delay, PROGRESS_POLL)
        if not self.seen and self.grace_end > now:
            delay = min(delay, self.grace_end - now)
        if self.deadline is not None:
            delay = min(delay, self.deadline - now)
        return max(0.0, delay)

    def read_timeout(self) -> float | None:
        """How long a read may wait for a connection of the pool (None: the
        pool's own timeout)."""
        remaining = self.remaining()
        return None if remaining is None else max(0.5, remaining)


def listen_statement(channel: str) -> sql.Composed:
    """``LISTEN "<channel>"``."""
    return sql.SQL(listen_sql.LISTEN).format(sql.Identifier(channel))


def parse_ids(payload: str) -> list[int]:
    """The job ids of a notification (comma-separated; anything else ignored)."""
    ids = []
    for part in payload.split(","):
        try:
            ids.append(int(part))
        except ValueError:
            continue
    return ids


class _Event(Protocol):
    def set(self) -> None: ...


class Watchers:
    """Who waits for which job: the events a listener sets (thread-safe, so
    that both listeners may share it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[int, set[_Event]] = {}

    def add(self, job_id: int, event: _Event) -> None:
        with self._lock:
            self._events.setdefault(job_id, set()).add(event)

    def remove(self, job_id: int, event: _Event) -> None:
        with self._lock:
            events = self._events.get(job_id)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._events[job_id]

    def notified(self, payload: str) -> None:
        """Wake the waiters of the ids in a notification's payload."""
        ids = parse_ids(payload)
        with self._lock:
            woken = [event for job_id in ids for event in self._events.get(job_id, ())]
        for event in woken:
            event.set()

    def wake_all(self) -> None:
        """Every waiter reads again (the listener has just (re)connected:
        notifications may have been missed)."""
        with self._lock:
            woken = [event for events in self._events.values() for event in events]
        for event in woken:
            event.set()


async def resolve(value: Any) -> Any:
    """A pool's ``conninfo`` or ``kwargs``: the value, or what its callable
    (sync or async) returns."""
    if callable(value):
        value = value()
    if inspect.isawaitable(value):
        value = await value
    return value


class AsyncWaitListener:
    """The LISTEN connection serving every waiter of one :class:`WorkerUtils`:
    an asyncio task, started at the first wait, reconnecting with the
    :data:`~worker_cli.db.backoff.RECONNECT` backoff, ended by :meth:`close`."""

    def __init__(self, pool: AsyncConnectionPool[Any], channel: str) -> None:
        self._pool = pool
        self._channel = channel
        self.watchers = Watchers()
        self._task: asyncio.Task[None] | None = None
        #: Set once the first attempt to LISTEN has ended (well or not).
        self._tried = asyncio.Event()
        #: LISTEN is in force now.
        self.listening = False

    @asynccontextmanager
    async def watch(self, job_id: int) -> AsyncIterator[asyncio.Event]:
        """An event set when a notification names ``job_id`` (or the listener
        reconnects), for the block; the listener starts if it has not."""
        event = asyncio.Event()
        self.watchers.add(job_id, event)
        try:
            if self._task is None:
                self._task = asyncio.create_task(self._run(), name="graphile-worker waiter")
            yield event
        finally:
            self.watchers.remove(job_id, event)

    async def ready(self, within: float | None) -> None:
        """Wait (at most ``within`` seconds) for the first attempt to LISTEN."""
        with suppress(TimeoutError):
            await asyncio.wait_for(self._tried.wait(), within)

    async def close(self) -> None:
        """Cancel the listener's task and wait for it (its connection closes)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                if not task.cancelled():  # the caller was cancelled
                    raise

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        conninfo = await resolve(self._pool.conninfo) or ""
        kwargs = dict(await resolve(self._pool.kwargs) or {})
        kwargs["autocommit"] = True
        return await psycopg.AsyncConnection.connect(
            worker_conninfo(conninfo, APPLICATION_NAME), **kwargs
        )

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                async with await self._connect() as conn:
                    await conn.execute(listen_statement(self._channel))
                    self.listening = True
                    if failures:
                        logger.info("Waiting for jobs: listening again")
                    failures = 0
                    self._tried.set()
                    self.watchers.wake_all()
                    async for notify in notifications(conn):
                        self.watchers.notified(notify.payload)
            except Exception as exc:  # never ends by itself: waiters rely on it
                self.listening = False
                self._tried.set()
                failures += 1
                delay = RECONNECT.delay(failures)
                logger.warning(
                    "Waiting for jobs: LISTEN connection lost (%s); reconnecting in %.1fs",
                    one_line(exc),
                    delay,
                )
                await asyncio.sleep(delay)


class SyncWaitListener:
    """The LISTEN connection serving every waiter of one SyncWorkerUtils: a
    daemon thread, started at the first wait, reconnecting with the
    :data:`~worker_cli.db.backoff.RECONNECT` backoff, ended (and joined) by
    :meth:`close`."""

    def __init__(self, pool: ConnectionPool[Any], channel: str) -> None:
        self._pool = pool
        self._channel = channel
        self.watchers = Watchers()
        self._start_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._tried = threading.Event()
        self._stop = threading.Event()
        # Written to by close(): wakes the thread out of select().
        self._wake_r, self._wake_w = socket.socketpair()
        self.listening = False

    @contextmanager
    def watch(self, job_id: int) -> Iterator[threading.Event]:
        """An event set when a notification names ``job_id`` (or the listener
        reconnects), for the block; the listener starts if it has not."""
        event = threading.Event()
        self.watchers.add(job_id, event)
        try:
            with self._start_lock:
                if self._stop.is_set():
                    raise RuntimeError("these utilities are closed")
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="graphile-worker waiter", daemon=True
                    )
                    self._thread.start()
            yield event
        finally:
            self.watchers.remove(job_id, event)

    def ready(self, within: float | None) -> None:
        """Wait (at most ``within`` seconds) for the first attempt to LISTEN."""
        self._tried.wait(within)

    def close(self) -> None:
        """Stop the thread and wait for it (its connection closes)."""
        with self._start_lock:
            self._stop.set()
            thread = self._thread
        with suppress(OSError):
            self._wake_w.send(b"x")
        if thread is not None:
            thread.join(_JOIN_TIMEOUT)
            if thread.is_alive():
                logger.warning("Waiting for jobs: the listener thread did not stop in time")
                return
        self._wake_r.close()
        self._wake_w.close()

    def _connect(self) -> psycopg.Connection[Any]:
        conninfo = self._pool.conninfo
        kwargs = self._pool.kwargs
        conninfo = (conninfo() if callable(conninfo) else conninfo) or ""
        kwargs = dict((kwargs() if callable(kwargs) else kwargs) or {})
        kwargs["autocommit"] = True
        return psycopg.Connection.connect(worker_conninfo(conninfo, APPLICATION_NAME), **kwargs)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                with self._connect() as conn:
                    # Notifications psycopg reads while running LISTEN land here.
                    conn.add_notify_handler(lambda notify: self.watchers.notified(notify.payload))
                    conn.execute(listen_statement(self._channel))
                    self.listening = True
                    if failures:
                        logger.info("Waiting for jobs: listening again")
                    failures = 0
                    self._tried.set()
                    self.watchers.wake_all()
                    self._pump(conn)
            except Exception as exc:  # never ends by itself: waiters rely on it
                self.listening = False
                self._tried.set()
                if self._stop.is_set():
                    break
                failures += 1
                delay = RECONNECT.delay(failures)
                logger.warning(
                    "Waiting for jobs: LISTEN connection lost (%s); reconnecting in %.1fs",
                    one_line(exc),
                    delay,
                )
                self._stop.wait(delay)
        self.listening = False

    def _pump(self, conn: psycopg.Connection[Any]) -> None:
        """Hand the notifications arriving on ``conn`` to the watchers until
        :meth:`close`; a lost connection raises."""
        pgconn = conn.pgconn
        wake = self._wake_r.fileno()
        while not self._stop.is_set():
            ready, _, _ = select.select([conn.fileno(), wake], [], [])
            if wake in ready:
                return
            pgconn.consume_input()  # raises OperationalError once the connection is lost
            while (notify := pgconn.notifies()) is not None:
                self.watchers.notified(notify.extra.decode(errors="replace"))
