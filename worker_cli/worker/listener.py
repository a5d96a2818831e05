"""The listener: a connection of its own that LISTENs for news.

``jobs:insert`` (sent by ``add_job``) means there may be new jobs: the
fetcher is nudged. ``<schema>:py:cancel`` means jobs were cancelled while
running: the cancel watch looks for this pool's. ``<schema>:py:control``
means a queue or task was paused or resumed: the pause watch reads the
pauses again. ``worker:migrate`` with
``breaking`` means another worker applied a schema revision this one does
not know: the pool stops. A lost
connection is re-opened with the :data:`retry.RECONNECT` backoff; once
listening again, the fetcher is nudged (jobs may have been added meanwhile)
and the pool's idle connections are checked (the outage likely broke them).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

import psycopg
from psycopg import sql

from ..db.connections import WorkerConnections
from ..db.retry import RECONNECT, one_line
from ..observe.events import Events
from ..schema import lifecycle, statements

__all__ = ["Listener"]

logger = logging.getLogger("graphile_worker")


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
    ) -> None:
        self._connections = connections
        self._on_jobs = on_jobs
        #: The channel of cancel requests (migrations/py/000008.sql).
        self._cancel_channel = lifecycle.channel(schema, "cancel")
        self._on_cancel = on_cancel
        #: The channel of pauses and resumes (migrations/py/000014.sql).
        self._control_channel = lifecycle.channel(schema, "control")
        self._on_control = on_control
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
                    await conn.execute(statements.listen_jobs_insert)
                    if self._on_cancel is not None:
                        channel = sql.Identifier(self._cancel_channel)
                        await conn.execute(sql.SQL("listen {}").format(channel))
                        self._on_cancel("")  # requests made while we were not listening
                    if self._on_control is not None:
                        channel = sql.Identifier(self._control_channel)
                        await conn.execute(sql.SQL("listen {}").format(channel))
                        self._on_control()  # pauses made while we were not listening
                    # Last: what pg_stat_activity shows of a listening worker.
                    await conn.execute(statements.listen_worker_migrate)
                    if failures:
                        logger.info("Worker pool %s: listening again", pool_id)
                        await self._on_reconnected()
                    failures = 0
                    self._events.emit("pool:listen:success", pool=self._owner)
                    self._on_jobs()  # catch up on jobs added while we were not listening
                    async for notify in conn.notifies():
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

    def _notified(self, channel: str, payload: str) -> None:
        if channel == "jobs:insert":
            self._on_jobs()
        elif channel == self._cancel_channel and self._on_cancel is not None:
            self._on_cancel(payload)
        elif channel == self._control_channel and self._on_control is not None:
            self._on_control()
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
