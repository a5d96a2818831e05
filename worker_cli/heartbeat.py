"""Opt-in heartbeats: crash recovery in minutes instead of the 4-hour stale-lock sweep.

A pool with ``heartbeat_interval`` set keeps a row in ``_private_py_heartbeats``
and refreshes its ``beat_at`` every interval, on a connection of its own (so
tasks holding every pool connection cannot starve it). At each beat it also
declares dead every other pool whose last beat is older than the timeout *that
pool* declared: it deletes the row and releases the dead pool's jobs and named
queues (``statements.heartbeat_reap``). The attempt the dead pool counted when it
fetched a job stays counted, and ``last_error`` says the pool was declared dead.

Pools without a row, such as Node workers, are never touched. A pool that was
declared dead but was only frozen (a paused VM, a stopped process) notices at its
next beat, logs it and registers again. The row is deleted when the pool stops
cleanly, after every result is written; a pool that crashes leaves its row
behind, which is what lets the others find its jobs.

All times are the database's (``now()``): a skewed worker clock changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import psycopg

from . import statements
from .options import WorkerOptions
from .retry import DELAYS

__all__ = ["Heartbeat"]

logger = logging.getLogger("graphile_worker")


class Heartbeat:
    """The heartbeat of one worker pool: ``await start()``, then ``run()`` until ``stop()``."""

    def __init__(
        self,
        conninfo: str,
        options: WorkerOptions,
        pool_id: str,
        connect_kwargs: Mapping[str, Any],
        *,
        on_released: Callable[[], None],
    ) -> None:
        assert options.heartbeat_interval is not None
        self.pool_id = pool_id
        self.interval = options.heartbeat_interval
        self.timeout = options.heartbeat_timeout
        self._conninfo = conninfo
        self._schema = options.schema
        self._connect_kwargs = {**connect_kwargs, "autocommit": True}
        self._on_released = on_released
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._stopping = asyncio.Event()
        self._registered = False
        self._params = {
            "pool_id": pool_id,
            "timeout": timedelta(seconds=self.timeout),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
        }

    async def start(self) -> None:
        """The first beat: done before the pool locks any job, so every job it
        ever locks can be found again if it dies. Errors propagate."""
        await self._beat()
        logger.info(
            "Worker pool %s: heartbeat every %gs; declared dead after %gs without one",
            self.pool_id,
            self.interval,
            self.timeout,
        )

    def stop(self) -> None:
        """End ``run()``: called once every result of the pool is written."""
        self._stopping.set()

    async def run(self) -> None:
        """Beat and look for dead pools every interval until ``stop()``, then
        delete the pool's row. Database errors are logged and retried sooner."""
        failures = 0
        try:
            while not self._stopping.is_set():
                delay = self.interval if not failures else min(self.interval, _delay(failures))
                try:
                    await asyncio.wait_for(self._stopping.wait(), delay)
                    break
                except TimeoutError:
                    pass
                try:
                    async with asyncio.timeout(self.timeout):
                        await self._beat()
                        await self._reap()
                    failures = 0
                except (psycopg.Error, TimeoutError) as exc:
                    failures += 1
                    await self._disconnect()
                    logger.warning(
                        "Worker pool %s: heartbeat failed (%s); retrying in %.2fs",
                        self.pool_id,
                        " ".join(str(exc).split()) or type(exc).__name__,
                        min(self.interval, _delay(failures)),
                    )
            await self._remove()
        finally:
            await self._disconnect()

    # --- database -----------------------------------------------------------

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(
                self._conninfo, connect_timeout=10, **self._connect_kwargs
            )
        return self._conn

    async def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def _beat(self) -> None:
        conn = await self._connection()
        cur = await conn.execute(
            statements.compose(statements.heartbeat_beat, self._schema), self._params
        )
        inserted = await cur.fetchone() is not None
        if inserted and self._registered:
            logger.error(
                "Worker pool %s was declared dead by another worker (no heartbeat for over "
                "%gs): the jobs it held were released and may run again elsewhere. "
                "Heartbeat resumed; consider a longer --heartbeat-timeout.",
                self.pool_id,
                self.timeout,
            )
        self._registered = True

    async def _reap(self) -> None:
        conn = await self._connection()
        cur = await conn.execute(
            statements.compose(statements.heartbeat_reap, self._schema), {"pool_id": self.pool_id}
        )
        released = 0
        async for pool_id, hostname, pid, beat_at, jobs, queues in cur:
            released += jobs
            where = f" (host {hostname}, pid {pid})" if hostname is not None else ""
            logger.warning(
                "Worker pool %s: declared worker pool %s%s dead (last heartbeat %s); "
                "released %d job(s) and %d queue(s) it held",
                self.pool_id,
                pool_id,
                where,
                beat_at.isoformat(),
                jobs,
                queues,
            )
        if released:
            self._on_released()

    async def _remove(self) -> None:
        """Best effort: a row left behind is only declared dead (with nothing to
        release) after its timeout."""
        try:
            async with asyncio.timeout(5):
                conn = await self._connection()
                await conn.execute(
                    statements.compose(statements.heartbeat_remove, self._schema),
                    {"pool_id": self.pool_id},
                )
        except (psycopg.Error, TimeoutError) as exc:
            logger.warning(
                "Worker pool %s: could not remove its heartbeat (%s)",
                self.pool_id,
                " ".join(str(exc).split()) or type(exc).__name__,
            )


def _delay(failures: int) -> float:
    return DELAYS[min(failures, len(DELAYS)) - 1]
