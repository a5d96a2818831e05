"""Heartbeats: a dead worker's jobs come back in seconds or minutes, not after
the 4-hour sweep.

On by default (``--heartbeat-interval 30``, ``--heartbeat-timeout 300``; an
interval of 0 turns them off). A pool keeps a row in ``_private_py_heartbeats``
and refreshes its ``beat_at`` every interval. About every second (its *tick*)
it also declares dead every other pool that has not beaten for the timeout
*that pool* declared, or whose session sign has been missing for the grace
that pool declared (:mod:`.session_sign`: a killed process's, seconds after
the kill): it deletes the row and releases the dead pool's jobs and named
queues (``heartbeats_sql.HEARTBEAT_REAP``). The attempt the dead pool counted when
it fetched a job stays counted, and ``last_error`` says the pool was declared
dead. In a fleet of more than :data:`SWEEPERS` live pools each sweeps less
often, at jittered times, so that the fleet as a whole still sweeps about
:data:`SWEEPERS` times a tick: 16 idle pools swept 16 times a second, about
1.3% of a 2-core machine between the workers and the server.

The heartbeat runs in a thread of its own, on a connection of its own: tasks
holding every pool connection, or an ``async def`` task blocking the event
loop with synchronous work, do not silence it. Only a process that is dead,
frozen, or cut off from the database stops beating, and only then are its jobs
run elsewhere.

A pool declares another dead only after watching it fail to beat for that
pool's whole timeout while the database was reachable: the silence is counted
from the later of the other pool's last beat and the start of this pool's own
uninterrupted run of beats. After the database was down or unreachable for
everyone (a restart, a failover, a network outage) longer than the timeout,
every row looks stale; counted that way, every pool gets its full timeout to
beat again before anyone releases its jobs.

Pools without a row, such as Node workers or pools with heartbeats off, are
never touched. A pool that was declared dead but was only frozen (a paused VM,
a stopped process) notices at its next beat, logs it and registers again. The
row is deleted when the pool stops cleanly, after every result is written; a
pool that crashes, or stops without writing back every result, leaves its row
behind, which is what lets the others find its jobs.

All times are the database's (``now()``): a skewed worker clock changes nothing.

After a beat the thread also refreshes the locks of the pool's long jobs
(:mod:`.lock_refresh`), so that no 4-hour stale-lock sweep releases them.

Each beat also records what the pool reports (:class:`PoolReport`: its
concurrency, tasks, version and jobs done so far), for the dashboard's Worker
pools page; the previous beat's counter and time stay beside it, so a rate
needs no second sample.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg

from ..._version import __version__
from ...config.options import WorkerOptions
from ...db.backoff import DEFAULT, one_line
from ...db.connections import WorkerConnections
from ...sql import compose
from ...sql import heartbeats as heartbeats_sql
from .lock_refresh import LockRefresh
from .session_sign import SIGN_CLASS, SessionSign

__all__ = ["Heartbeat", "PoolReport"]

logger = logging.getLogger("graphile_worker")

#: Seconds between two looks for dead pools (at most; a shorter heartbeat
#: interval or session grace ticks faster): a killed pool's sign is found
#: missing within a tick and judged a tick after its grace.
TICK = 1.0
#: Looks for dead pools the fleet as a whole makes per tick, about: with more
#: live pools than this, each looks less often (every tick x pools /
#: SWEEPERS, jittered), so that 16 idle pools do not sweep 16 times a second.
SWEEPERS = 4


@dataclass(frozen=True)
class PoolReport:
    """What a pool tells in each heartbeat (migrations/py/000004.sql).

    ``jobs_done`` is called from the heartbeat's thread at every beat: it must
    only read a counter (the pool's jobs run to an outcome so far).
    """

    concurrency: int
    task_identifiers: Sequence[str]
    jobs_done: Callable[[], int]
    #: The ids of the pool's stuck jobs (any thread).
    stuck_job_ids: Callable[[], Sequence[int]] = tuple


class Heartbeat:
    """The heartbeat of one worker pool, in a thread of its own.

    ``await start()`` makes the first beat (before the pool locks any job),
    then beats every ``interval`` until ``stop()``.
    """

    def __init__(
        self,
        connections: WorkerConnections,
        *,
        schema: str,
        interval: float,
        timeout: float,
        on_released: Callable[[], None],
        report: PoolReport | None = None,
        lock_refresh: LockRefresh | None = None,
        sign: SessionSign | None = None,
        on_declared_dead: Callable[[], None] = lambda: None,
    ) -> None:
        self.pool_id = pool_id = connections.pool_id
        self.interval = interval
        self.timeout = timeout
        #: This pool's session sign (None: none; only the timeout applies to it).
        self._sign = sign
        #: Seconds between two looks for dead pools; beats are every ``interval``.
        grace = sign.grace if sign is not None else 0.0
        self._tick = min(TICK, interval, grace / 2) if grace > 0 else interval
        self._connections = connections
        self._schema = schema
        self._on_released = on_released
        #: Called (on the loop) when this pool finds it was declared dead: its
        #: leases of limits' slots went with its row.
        self._on_declared_dead = on_declared_dead
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self._stopping = threading.Event()
        self._remove_row = False
        self._stopped: asyncio.Future[None] | None = None
        self._registered = False
        #: Database time of this pool's last successful beat, and of the first
        #: beat of its current uninterrupted run of beats (see the module doc).
        self._last_beat: datetime | None = None
        self._watching_since: datetime | None = None
        self._report = report
        #: Refreshes the old locks of this pool's long jobs after a beat.
        self._lock_refresh = lock_refresh
        self._params: dict[str, Any] = {
            "pool_id": pool_id,
            "timeout": timedelta(seconds=timeout),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "version": __version__,
            "concurrency": report.concurrency if report else None,
            "task_identifiers": sorted(report.task_identifiers) if report else None,
            "jobs_done": None,
            "stuck_job_ids": None,
        }

    @classmethod
    def of_pool(
        cls,
        connections: WorkerConnections,
        options: WorkerOptions,
        *,
        on_released: Callable[[], None],
        report: PoolReport,
        lock_refresh: LockRefresh,
        on_declared_dead: Callable[[], None] = lambda: None,
    ) -> Heartbeat | None:
        """The heartbeat of a pool with ``options`` (None: heartbeats are off)."""
        if not options.heartbeat_interval:
            return None
        return cls(
            connections,
            schema=options.schema,
            interval=options.heartbeat_interval,
            timeout=options.heartbeat_timeout,
            on_released=on_released,
            report=report,
            lock_refresh=lock_refresh,
            sign=SessionSign.of_pool(connections.pool_id, options),
            on_declared_dead=on_declared_dead,
        )

    async def start(self) -> None:
        """Make the first beat, then beat on in the background. Errors propagate
        (the heartbeat's connection is closed first)."""
        loop = self._loop = asyncio.get_running_loop()
        started: asyncio.Future[None] = loop.create_future()
        self._stopped = loop.create_future()
        thread = threading.Thread(
            target=self._main, args=(started,), name=f"{self.pool_id}-heartbeat", daemon=True
        )
        thread.start()
        await started
        sign = self._sign
        logger.info(
            "Worker pool %s: heartbeat every %gs; declared dead after %gs without one%s",
            self.pool_id,
            self.interval,
            self.timeout,
            f", or {sign.grace:g}s after its session ends" if sign and sign.held else "",
        )

    def stop(self, *, remove: bool = True) -> None:
        """End the beats. With ``remove`` (every result of the pool is written),
        the pool's row is deleted; without, it stays, so that other pools
        release the jobs this pool still holds once its timeout has passed."""
        self._remove_row = remove
        self._stopping.set()

    async def wait_stopped(self, within: float) -> None:
        """Wait (at most ``within`` seconds) for the thread to finish after ``stop()``.
        A thread stuck on an unreachable database is left behind (it is a daemon)."""
        if self._stopped is None:
            return
        try:
            async with asyncio.timeout(within):
                await asyncio.shield(self._stopped)
        except TimeoutError:
            logger.warning("Worker pool %s: the heartbeat did not stop in time", self.pool_id)

    # --- the thread ---------------------------------------------------------

    def _main(self, started: asyncio.Future[None]) -> None:
        try:
            try:
                self._beat()
            except BaseException as exc:
                self._disconnect()
                self._call_soon(_settle, started, exc)
                return
            self._call_soon(_settle, started, None)
            self._beat_until_stopped()
            if self._remove_row:
                self._remove()
            else:
                self._forget_sign()
        finally:
            self._disconnect()
            if self._stopped is not None:
                self._call_soon(_settle, self._stopped, None)

    def _beat_until_stopped(self) -> None:
        """Look for dead pools every tick and beat every interval (at once on
        a new connection, which has just taken its sign); database errors are
        logged and retried sooner."""
        failures = 0
        now = time.monotonic()
        next_beat = now + self.interval
        next_sweep = now + self._tick
        while not self._stopping.wait(
            max(0.0, min(next_beat, next_sweep) - time.monotonic())
            if not failures
            else min(self._tick, DEFAULT.delay(failures))
        ):
            now = time.monotonic()
            beat = self._conn is None or now >= next_beat
            sweep = failures > 0 or now >= next_sweep
            try:
                if beat:
                    self._beat()
                    next_beat = time.monotonic() + self.interval
                if sweep:
                    others = self._reap()
                    next_sweep = time.monotonic() + self._sweep_every(others)
                failures = 0
            except Exception as exc:
                failures += 1
                self._last_beat = None  # not watching while the database is unreachable
                self._disconnect()
                logger.warning(
                    "Worker pool %s: heartbeat failed (%s); retrying in %.2fs",
                    self.pool_id,
                    one_line(exc),
                    min(self._tick, DEFAULT.delay(failures)),
                )
                continue
            if beat and self._lock_refresh is not None:
                self._refresh_locks(self._lock_refresh)

    def _refresh_locks(self, refresh: LockRefresh) -> None:
        """After a beat: refresh the old locks of this pool's long jobs, if it
        is time; a failure is logged (it is tried again at the next beat)."""
        try:
            refresh.refresh_sync(self._connection())
        except Exception as exc:
            self._disconnect()
            logger.warning(
                "Worker pool %s: refreshing the locks of long jobs failed (%s); retrying "
                "at the next heartbeat",
                self.pool_id,
                one_line(exc),
            )

    def _connection(self) -> psycopg.Connection[Any]:
        """The heartbeat's connection; a new one takes the pool's sign first."""
        if self._conn is None or self._conn.closed:
            conn = self._connections.connect_sync("heartbeat")
            try:
                if self._sign is not None:
                    self._sign.take(conn)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _beat(self) -> None:
        conn = self._connection()
        if self._report is not None:
            self._params["jobs_done"] = self._report.jobs_done()
            self._params["stuck_job_ids"] = list(self._report.stuck_job_ids())
        sign = self._sign.params() if self._sign is not None else SessionSign.NONE
        row = conn.execute(
            compose(heartbeats_sql.HEARTBEAT_BEAT, self._schema), {**self._params, **sign}
        ).fetchone()
        assert row is not None
        registered, now = row
        if registered and self._registered:
            grace = self._sign.grace if self._sign is not None and self._sign.enabled else 0
            logger.error(
                "Worker pool %s was declared dead by another worker (no heartbeat for over "
                "%gs%s): the jobs it held were released and may run again elsewhere. "
                "Heartbeat resumed; consider a longer --heartbeat-timeout%s.",
                self.pool_id,
                self.timeout,
                f", or its session gone for over {grace:g}s" if grace else "",
                " or --session-grace" if grace else "",
            )
            self._call_soon(self._on_declared_dead)
        self._registered = True
        last, self._last_beat = self._last_beat, now
        if last is None or (now - last).total_seconds() > 2 * self.interval:
            self._watching_since = now

    def _sweep_every(self, others: int) -> float:
        """Seconds until this pool's next look for dead pools, with ``others``
        live pools beside it: a tick, or with more than :data:`SWEEPERS` pools,
        a share of their sweeping (jittered, so that they take turns)."""
        pools = others + 1
        if pools <= SWEEPERS:
            return self._tick
        return self._tick * pools / SWEEPERS * random.uniform(0.8, 1.2)

    def _reap(self) -> int:
        """Declare dead the pools that are silent or whose session is gone, and
        check that this pool's own sign is held by its own session. Returns
        how many other pools look alive."""
        conn = self._connection()
        sign = self._sign
        with conn.transaction():  # (the setting is the transaction's)
            conn.execute(heartbeats_sql.REAP_SETTINGS)
            row = conn.execute(
                compose(heartbeats_sql.HEARTBEAT_REAP, self._schema),
                {
                    "pool_id": self.pool_id,
                    "watching_since": self._watching_since,
                    "sign_class": SIGN_CLASS,
                    "sign_key": sign.key if sign is not None else None,
                },
            ).fetchone()
        assert row is not None
        own_sign, _notified, dead, others = row
        released = 0
        for pool in dead or ():
            released += pool["jobs"]
            where = (
                f" (host {pool['hostname']}, pid {pool['pid']})"
                if pool["hostname"] is not None
                else ""
            )
            why = (
                f"its database session ended; gone for {pool['silent_for']:.3f}s"
                if pool["session_gone"]
                else f"last heartbeat {pool['since']}; watched silent for {pool['silent_for']:.3f}s"
            )
            logger.warning(
                "Worker pool %s: declared worker pool %s%s dead (%s); released %d job(s) "
                "and %d queue(s) it held",
                self.pool_id,
                pool["pool_id"],
                where,
                why,
                pool["jobs"],
                pool["queues"],
            )
        if released:
            self._call_soon(self._on_released)
        if sign is not None and sign.held and not own_sign:
            sign.drop(
                "the heartbeat's session does not hold the pool's session sign (is the "
                "connection string a pooler's in transaction mode?)"
            )
            self._beat()  # records that the pool has no sign
        return int(others)

    def _forget_sign(self) -> None:
        """A pool stopping with jobs it could not write back: its row stays
        (others release them after its timeout), without its sign, so that
        its ending session does not release them sooner. Best effort."""
        if self._sign is None or not self._sign.held or self._conn is None:
            return
        try:
            self._conn.execute(
                compose(heartbeats_sql.SIGN_FORGET, self._schema), {"pool_id": self.pool_id}
            )
        except Exception as exc:
            logger.warning(
                "Worker pool %s: could not give up its session sign (%s)",
                self.pool_id,
                one_line(exc),
            )

    def _remove(self) -> None:
        """Best effort: a row left behind is only declared dead (with nothing to
        release) after its timeout."""
        try:
            self._connection().execute(
                compose(heartbeats_sql.HEARTBEAT_REMOVE, self._schema),
                {"pool_id": self.pool_id},
            )
        except Exception as exc:
            logger.warning(
                "Worker pool %s: could not remove its heartbeat (%s)",
                self.pool_id,
                one_line(exc),
            )

    def _call_soon(self, callback: Callable[..., Any], *args: Any) -> None:
        """Run ``callback`` on the pool's event loop (if it still runs)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closed meanwhile
                loop.call_soon_threadsafe(callback, *args)


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
