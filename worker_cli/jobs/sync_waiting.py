"""Waiting for a job, blocking: ``SyncWorkerUtils.wait_for_job``.

The same wait as :mod:`.waiting` (LISTEN, register, read; read again on a
notification naming the job, at each safety poll, and after a reconnect),
with a thread instead of an asyncio task: :class:`SyncWaitListener` owns a
blocking LISTEN connection and sets the ``threading.Event`` of each waiter a
notification names. One listener serves every thread waiting through one
:class:`SyncWorkerUtils`.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from ..db.connections import worker_conninfo
from ..db.drivers import autocommit_mode, run_plan
from ..db.retry import RECONNECT, one_line
from .results import JobResult
from .utils_plans import UtilsPlans
from .waiting import APPLICATION_NAME, Waiting, Watchers, listen_statement

__all__ = ["SyncWaitListener", "wait_blocking"]

logger = logging.getLogger("graphile_worker")

#: Seconds :meth:`SyncWaitListener.close` waits for the thread at most (it may
#: be inside a connection attempt, bounded by ``connect_timeout``).
_JOIN_TIMEOUT = 15.0


class SyncWaitListener:
    """The LISTEN connection serving every waiter of one SyncWorkerUtils: a
    daemon thread, started at the first wait, reconnecting with the
    :data:`~worker_cli.db.retry.RECONNECT` backoff, ended (and joined) by
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


def wait_blocking(
    pool: ConnectionPool[Any],
    plans: UtilsPlans,
    listener: SyncWaitListener,
    waiting: Waiting,
) -> JobResult:
    """``SyncWorkerUtils.wait_for_job``: :func:`~.waiting.wait_async`, blocking."""
    job_id = waiting.job_id
    with listener.watch(job_id) as wake:
        listener.ready(waiting.remaining())
        registered = False
        while True:
            wake.clear()  # before reading: a notification from now on wakes the wait
            record = None
            try:
                with pool.connection(waiting.read_timeout()) as conn, autocommit_mode(conn):
                    plan = plans.wait_step(job_id, register=not registered)
                    registered, record = run_plan(conn, plan)
            except psycopg.OperationalError as exc:  # an outage: read again later
                logger.debug("Waiting for job %d: could not read it: %s", job_id, one_line(exc))
            decision = waiting.next(record)
            if isinstance(decision, JobResult):
                return decision
            wake.wait(decision)
