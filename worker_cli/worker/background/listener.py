"""The listener: a connection of its own that LISTENs for news.

``jobs:insert`` (sent by ``add_job``) means there may be new jobs: the
fetcher is nudged. ``<schema>:py:cancel`` means jobs were cancelled while
running: the cancel watch looks for this pool's. ``<schema>:py:control``
means a queue or task was paused or resumed: the pause watch reads the
pauses again. ``<schema>:py:schedules`` means a schedule in the database
changed: the cron scheduler reads them again. ``worker:migrate`` with
``breaking`` means another worker applied a schema revision this one does
not know: the pool stops. A lost
connection is re-opened with the :data:`retry.RECONNECT` backoff; once
listening again, the fetcher is nudged (jobs may have been added meanwhile)
and the pool's idle connections are checked (the outage likely broke them).

Each time it starts listening it checks that notifications arrive: it sends
one to itself from the pool (through the main connection string, as
``add_job`` callers send theirs). A pooler in transaction mode (PgBouncer)
runs the LISTEN on whichever server connection it lends and takes that back
at once, so nothing ever arrives: a warning says so, once, and that jobs are
found by polling. The remedy is ``--listen-url``: a direct connection string
for this connection alone (:attr:`WorkerConnections.listen_conninfo`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from ...db.backoff import RECONNECT, one_line
from ...db.connections import WorkerConnections
from ...db.notifications import notifications
from ...observe.events import Events
from ...schema import channels
from ...sql import listen as listen_sql

__all__ = ["Listener"]

logger = logging.getLogger("graphile_worker")

#: Seconds the listener waits for its own probe notification (it usually
#: arrives within milliseconds).
PROBE_TIMEOUT = 2.0


class Listener:
    """LISTENs for one pool; :meth:`run` is its loop (cancel it to stop)."""

    def __init__(
        self,
        connections: WorkerConnections,
        *,
        on_jobs: Callable[[], None],
        on_breaking_migration: Callable[[str], None],
        on_reconnected: Callable[[], Awaitable[None]],
        events: Events,
        owner: object,
        schema: str = "graphile_worker",
        on_cancel: Callable[[str], None] | None = None,
        on_control: Callable[[], None] | None = None,
        on_schedules: Callable[[], None] | None = None,
        probe_pool: AsyncConnectionPool[Any] | None = None,
        poll_interval: float = 2.0,
    ) -> None:
        self._connections = connections
        #: Sends the probe notification (None: no probe).
        self._probe_pool = probe_pool
        #: The channel of the probe (each probe has its own payload).
        self._probe_channel = channels.channel(schema, "probe")
        self._poll_interval = poll_interval
        #: The payload of the probe on its way (None: none, or it arrived).
        self._probe_token: str | None = None
        #: The warning that notifications do not arrive was logged.
        self._warned = False
        self._on_jobs = on_jobs
        #: The channel of cancel requests (migrations/py/000008.sql).
        self._cancel_channel = channels.channel(schema, "cancel")
        self._on_cancel = on_cancel
        #: The channel of pauses and resumes (migrations/py/000014.sql).
        self._control_channel = channels.channel(schema, "control")
        self._on_control = on_control
        #: The channel of schedules' changes (migrations/py/000027.sql).
        self._schedules_channel = channels.channel(schema, "schedules")
        self._on_schedules = on_schedules
        self._on_breaking_migration = on_breaking_migration
        self._on_reconnected = on_reconnected
        self._events = events
        self._owner = owner

    async def run(self) -> None:
        pool_id = self._connections.pool_id
        failures = 0
        while True:
            self._events.emit("pool:listen:connecting", pool=self._owner)
            try:
                async with await self._connections.connect("listen") as conn:
                    await conn.execute(listen_sql.LISTEN_JOBS_INSERT)
                    if self._on_cancel is not None:
                        channel = sql.Identifier(self._cancel_channel)
                        await conn.execute(sql.SQL(listen_sql.LISTEN).format(channel))
                        self._on_cancel("")  # requests made while we were not listening
                    if self._on_control is not None:
                        channel = sql.Identifier(self._control_channel)
                        await conn.execute(sql.SQL(listen_sql.LISTEN).format(channel))
                        self._on_control()  # pauses made while we were not listening
                    if self._on_schedules is not None:
                        channel = sql.Identifier(self._schedules_channel)
                        await conn.execute(sql.SQL(listen_sql.LISTEN).format(channel))
                        self._on_schedules()  # changes made while we were not listening
                    if self._probe_pool is not None:
                        channel = sql.Identifier(self._probe_channel)
                        await conn.execute(sql.SQL(listen_sql.LISTEN).format(channel))
                    # Last: what pg_stat_activity shows of a listening worker.
                    await conn.execute(listen_sql.LISTEN_WORKER_MIGRATE)
                    if failures:
                        logger.info("Worker pool %s: listening again", pool_id)
                        await self._on_reconnected()
                    failures = 0
                    self._events.emit("pool:listen:success", pool=self._owner)
                    self._on_jobs()  # catch up on jobs added while we were not listening
                    async with self._probing():
                        async for notify in notifications(conn):
                            self._notified(notify.channel, notify.payload)
                            # Let the fetcher send its query before psycopg goes on
                            # reading this connection: ~0.1 ms off add_job -> task start.
                            await asyncio.sleep(0)
            except psycopg.Error as exc:
                failures += 1
                delay = RECONNECT.delay(failures)
                logger.warning(
                    "Worker pool %s: LISTEN connection lost (%s); reconnecting in %.1fs",
                    pool_id,
                    one_line(exc),
                    delay,
                )
                self._events.emit("pool:listen:error", pool=self._owner, error=exc)
                await asyncio.sleep(delay)

    @contextlib.asynccontextmanager
    async def _probing(self) -> AsyncIterator[None]:
        """While the block reads the connection's notifications: send the probe
        (a task of its own, from the pool) and, if its notification has not
        arrived :data:`PROBE_TIMEOUT` seconds after it was sent, warn. Probes
        of other pools arrive too, and are ignored (no UNLISTEN: the
        connection's last statement stays a LISTEN, as ``pg_stat_activity``
        shows a listening worker)."""
        if self._probe_pool is None:
            yield
            return
        self._probe_token = token = secrets.token_hex(8)
        sending = asyncio.create_task(self._send_probe(self._probe_pool, token))
        try:
            yield
        finally:
            self._probe_token = None
            sending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sending

    async def _send_probe(self, pool: AsyncConnectionPool[Any], token: str) -> None:
        try:
            async with pool.connection() as sender:
                await sender.execute(listen_sql.NOTIFY_PROBE, (self._probe_channel, token))
        except psycopg.Error as exc:
            logger.warning(
                "Worker pool %s: could not check that notifications arrive: %s",
                self._connections.pool_id,
                one_line(exc),
            )
            return
        await asyncio.sleep(PROBE_TIMEOUT)
        if self._probe_token == token:
            self._warn_no_notifications()

    def _warn_no_notifications(self) -> None:
        if self._warned:
            return
        self._warned = True
        logger.warning(
            "Worker pool %s: notifications do not reach this worker (is the connection "
            "string a pooler's in transaction mode?): new jobs are found by polling every "
            "%d ms; give --listen-url a direct connection string to PostgreSQL for LISTEN",
            self._connections.pool_id,
            round(self._poll_interval * 1000),
        )

    def _notified(self, channel: str, payload: str) -> None:
        if channel == self._probe_channel:
            if payload == self._probe_token:
                self._probe_token = None  # notifications arrive
        elif channel == "jobs:insert":
            self._on_jobs()
        elif channel == self._cancel_channel and self._on_cancel is not None:
            self._on_cancel(payload)
        elif channel == self._control_channel and self._on_control is not None:
            self._on_control()
        elif channel == self._schedules_channel and self._on_schedules is not None:
            self._on_schedules()
        elif channel == "worker:migrate":
            try:
                details = json.loads(payload)
            except ValueError:
                return
            if details.get("breaking"):
                self._on_breaking_migration(
                    f"breaking schema migration {details.get('migrationNumber')} was applied "
                    "by another worker"
                )
