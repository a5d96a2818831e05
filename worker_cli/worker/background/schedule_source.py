"""The database's schedules as the cron scheduler sees them.

:class:`DatabaseSchedules` keeps the schedules of ``_private_py_schedules``
(migrations/py/000027.sql) read from the database, each turned into the
crontab code's item (:func:`~worker_cli.jobs.schedule.schedule_item`) with
what says whether it fires at a UTC minute: the same instants, the same
daylight saving rules as a crontab line. :meth:`DatabaseSchedules.watch`
reads them again when told (the listener's ``<schema>:py:schedules``
notification: a change is seen within milliseconds) and every
:data:`POLL` seconds (the safety net: a lost notification, a pooler that
drops LISTEN). What is read only decides which schedules a worker *tries*
to fire at a minute: the fire statement checks each one's version, pause and
``known_since`` in the database, so a worker that has not seen a change yet
cannot fire the old pattern, a paused schedule or a removed one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
from psycopg_pool import AsyncConnectionPool

from ...errors import ConfigurationError
from ...jobs.cron_zones import ZoneTimetable
from ...jobs.crontab import CrontabError, ParsedCronItem
from ...jobs.schedule import Schedule, schedule_item
from ...sql import compose
from ...sql import schedules as schedules_sql

__all__ = ["POLL", "DatabaseSchedules", "Entry"]

logger = logging.getLogger("graphile_worker.cron")

#: Seconds between two reads of the schedules without a notification.
POLL = 10.0


@dataclass(frozen=True)
class Entry:
    """One schedule that may fire: as stored, its item, and its timetable."""

    schedule: Schedule
    item: ParsedCronItem
    fires: Callable[[datetime], bool]
    zone: ZoneInfo | None


class DatabaseSchedules:
    """The schedules a worker fires (see the module's docstring)."""

    def __init__(
        self, db: AsyncConnectionPool[Any], schema: str, *, default_zone: ZoneInfo | None
    ) -> None:
        self._db = db
        self._list = compose(schedules_sql.LIST_SCHEDULES, schema)
        self._default_zone = default_zone
        #: The schedules that may fire (not paused), by identifier.
        self.entries: dict[str, Entry] = {}
        self._changed = asyncio.Event()
        #: Identifiers whose stored item could not be read (warned once).
        self._unreadable: set[tuple[str, int]] = set()

    def notified(self) -> None:
        """A schedule changed (the listener's notification): read them again."""
        self._changed.set()

    async def load(self) -> None:
        """Read the schedules (raises the database's error)."""
        async with self._db.connection() as conn:
            cur = await conn.execute(self._list)
            rows = await cur.fetchall()
        entries: dict[str, Entry] = {}
        for row in rows:
            schedule = Schedule.from_row(row)
            if schedule.payload_error is not None:  # 5,000 deep, 5,000 digits: alone
                self._warn(schedule.identifier, schedule.version, schedule.payload_error)
                continue
            if schedule.paused:
                continue
            entry = self._entry(schedule)
            if entry is not None:
                entries[schedule.identifier] = entry
        self.entries = entries

    def _entry(self, schedule: Schedule) -> Entry | None:
        try:
            item = schedule_item(schedule)
        except (CrontabError, ValueError, TypeError) as exc:
            self._warn(schedule.identifier, schedule.version, str(exc))
            return None
        zone = item.tz or self._default_zone
        fires = item.matches if zone is None else ZoneTimetable(item, zone).fires_at
        return Entry(schedule, item, fires, zone)

    def _warn(self, identifier: str, version: int, why: str) -> None:
        """Say once per version that a schedule is skipped, and why."""
        if (identifier, version) not in self._unreadable:
            self._unreadable.add((identifier, version))
            logger.warning(
                "Schedule %r cannot be fired (%s); fix it with add_schedule", identifier, why
            )

    async def watch(self) -> None:
        """Read the schedules again when told, and every :data:`POLL` seconds,
        until cancelled (a failed read is logged; the next one tries again)."""
        while True:
            try:
                async with asyncio.timeout(POLL):
                    await self._changed.wait()
            except TimeoutError:
                pass
            self._changed.clear()
            try:
                await self.load()
            except (psycopg.Error, OSError) as exc:
                logger.warning("Reading the schedules failed: %s", exc)


async def refuse_shared_identifiers(
    conn: psycopg.AsyncConnection[Any], schema: str, identifiers: list[str]
) -> None:
    """Refuse to start a worker whose crontab has an item of the identifier
    of a schedule in the database (ConfigurationError, one line)."""
    if not identifiers:
        return
    cur = await conn.execute(
        compose(schedules_sql.SCHEDULED_IDENTIFIERS, schema), {"identifiers": identifiers}
    )
    shared = [row[0] for row in await cur.fetchall()]
    if shared:
        raise ConfigurationError(
            f"crontab item(s) {', '.join(map(repr, shared))}: the identifier of a schedule in "
            "the database too; rename the crontab item, or remove the schedule "
            "(graphile-worker schedule remove ID)"
        )
