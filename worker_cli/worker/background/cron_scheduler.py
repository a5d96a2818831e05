"""The cron scheduler that runs inside a worker: adds jobs for due cron items.

Once per UTC minute it adds the jobs of the items that match that minute, with
``run_at`` = the minute and ``_cron: {"ts": ..., "backfilled": false}`` merged
into the payload. ``_private_known_crontabs`` makes this safe with any number
of workers, in Python or Node, running the same crontab (see
``cron_sql.SCHEDULE_CRON_JOBS``). At start, items the database already knew
are backfilled over their ``fill`` period, oldest minute first; new items are
recorded and not backfilled. A timer that fires early sleeps again; one that
fires late (a paused process) catches up every missed minute, once each.

An item in a time zone (its ``?tz=``, or the worker's ``cron_timezone`` when
that is not UTC) fires at the UTC minutes :mod:`worker_cli.jobs.cron_zones`
computes, live and in backfill alike; its jobs' ``_cron`` also get ``local``,
the wall time with its offset. ``ts`` and ``last_execution`` stay UTC instants.

The schedules in the database (:mod:`.schedule_source`) are fired by the same
loop, at the same minutes, by the same rules: each minute, those whose
timetable matches are fired through ``schedules_sql.FIRE_SCHEDULES`` (their
own ``last_execution`` decides which worker adds the job), and at start
those with a ``fill`` are backfilled from where they last fired (never before
``known_since``: their creation, or their last resume).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol
from zoneinfo import ZoneInfo

from psycopg_pool import AsyncConnectionPool

from ...config.zones import UTC_NAMES, zone_named
from ...db.backoff import CRON, retry_until_done
from ...jobs.cron_zones import ZoneTimetable, local_timestamp
from ...jobs.crontab import ParsedCronItem
from ...sql import compose
from ...sql import cron as cron_sql
from ...sql import schedules as schedules_sql
from .schedule_source import DatabaseSchedules, Entry

__all__ = ["Clock", "CronScheduler", "SystemClock", "cron_timestamp"]

logger = logging.getLogger("graphile_worker.cron")

MINUTE = timedelta(minutes=1)


class Clock(Protocol):
    """Where the scheduler reads the time and waits (replaceable in tests)."""

    def now(self) -> datetime: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real UTC clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def round_up_to_minute(ts: datetime) -> datetime:
    floor = ts.replace(second=0, microsecond=0)
    return floor if floor == ts else floor + MINUTE


def cron_timestamp(ts: datetime) -> str:
    """ISO 8601 with milliseconds and Z, as in ``_cron.ts``."""
    ts = ts.astimezone(UTC)
    return ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z"


class CronScheduler:
    """Schedules ``items`` on ``pool`` until cancelled; items without ``tz``
    run in ``default_zone`` (an IANA name, UTC by default as in Node)."""

    def __init__(
        self,
        items: Sequence[ParsedCronItem],
        pool: AsyncConnectionPool[Any],
        schema: str,
        *,
        clock: Clock | None = None,
        default_zone: str = "UTC",
        schedules: DatabaseSchedules | None = None,
    ) -> None:
        self.items = list(items)
        #: The database's schedules (None: only the crontab's items).
        self.schedules = schedules
        self._fire = compose(schedules_sql.FIRE_SCHEDULES, schema)
        self.pool = pool
        self.schema = schema
        self.clock = clock or SystemClock()
        default = None if default_zone in UTC_NAMES else zone_named(default_zone)
        #: The zone of each item that has one (its own, else a non-UTC default).
        self.zones: dict[str, ZoneInfo] = {}
        #: Each item with what says whether it fires at a UTC minute.
        self.timetable: list[tuple[ParsedCronItem, Callable[[datetime], bool]]] = []
        for item in self.items:
            zone = item.tz or default
            if zone is None:
                self.timetable.append((item, item.matches))
            else:
                self.zones[item.identifier] = zone
                self.timetable.append((item, ZoneTimetable(item, zone).fires_at))
        defaulted = [item.identifier for item in self.items if item.tz is None]
        if default is not None and defaulted:
            logger.warning(
                "Cron: %d item(s) without ?tz= run in cron_timezone %s, not in UTC as "
                "graphile-worker (Node) would run them: do not let Node workers run this "
                "crontab",
                len(defaulted),
                default.key,
            )

    async def run(self) -> None:
        start = self.clock.now()
        schedules = self.schedules
        if schedules is not None:
            await retry_until_done(
                "read the schedules", schedules.load, logger=logger, backoff=CRON
            )
        await retry_until_done(
            "register and backfill cron items",
            self.register_and_backfill,
            start,
            logger=logger,
            backoff=CRON,
        )
        async with asyncio.TaskGroup() as group:
            if schedules is not None:
                group.create_task(schedules.watch())
            await self._tick(round_up_to_minute(start))

    async def _tick(self, ts: datetime) -> None:
        """Fire what is due at each minute from ``ts`` on, for ever."""
        while True:
            now = self.clock.now()
            if now < ts:
                await self.clock.sleep((ts - now).total_seconds() + 0.001)
                continue  # woken early (clock skew): check again
            if now - ts >= MINUTE:
                logger.warning("Cron is %s behind (paused process?); catching up", now - ts)
            due = [item for item, fires in self.timetable if fires(ts)]
            if due:
                await retry_until_done(
                    "schedule cron jobs",
                    self.schedule,
                    ts,
                    due,
                    False,
                    logger=logger,
                    backoff=CRON,
                )
            if self.schedules is not None:
                fired = [entry for entry in self.schedules.entries.values() if entry.fires(ts)]
                if fired:
                    await retry_until_done(
                        "fire schedules",
                        self.fire,
                        ts,
                        fired,
                        False,
                        logger=logger,
                        backoff=CRON,
                    )
            ts += MINUTE

    async def register_and_backfill(self, start: datetime) -> None:
        """Record new identifiers; backfill known items over their fill period."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(compose(cron_sql.KNOWN_CRONTABS, self.schema))
            known = {identifier: (since, last) async for identifier, since, last in cur}
            unknown = [item.identifier for item in self.items if item.identifier not in known]
            if unknown:
                await conn.execute(
                    compose(cron_sql.REGISTER_CRONTABS, self.schema),
                    {"identifiers": unknown, "now": start},
                )
        backfill = [
            (item, fires)
            for item, fires in self.timetable
            if item.identifier in known and item.backfill_period
        ]
        # Schedules fire from where they last fired, never before known_since.
        filled = [
            (
                entry,
                max(
                    entry.schedule.last_execution or entry.schedule.known_since,
                    entry.schedule.known_since,
                ),
            )
            for entry in (self.schedules.entries.values() if self.schedules is not None else ())
            if entry.item.backfill_period
        ]
        periods = [item.backfill_period for item, _ in backfill]
        periods += [entry.item.backfill_period for entry, _ in filled]
        if not periods:
            return
        ts = round_up_to_minute(start - max(periods))
        while ts < start:
            due = [
                item
                for item, fires in backfill
                if item.backfill_period >= start - ts
                and ts >= (known[item.identifier][1] or known[item.identifier][0])
                and fires(ts)
            ]
            if due:
                await self.schedule(ts, due, True)
            fired = [
                entry
                for entry, since in filled
                if entry.item.backfill_period >= start - ts and ts > since and entry.fires(ts)
            ]
            if fired:
                await self.fire(ts, fired, True)
            ts += MINUTE

    async def schedule(
        self, ts: datetime, items: Sequence[ParsedCronItem], backfilled: bool
    ) -> list[int]:
        """Add the jobs of ``items`` for the minute ``ts``; returns the ids added."""
        stamp = cron_timestamp(ts)
        specs = [
            {
                "identifier": item.identifier,
                "task": item.task,
                "payload": {**item.payload, "_cron": self._cron_field(item, ts, stamp, backfilled)},
                "queue_name": item.queue_name,
                "max_attempts": item.max_attempts,
                "priority": item.priority,
                "job_key": item.job_key,
                "job_key_mode": item.job_key_mode,
            }
            for item in items
        ]
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                compose(cron_sql.SCHEDULE_CRON_JOBS, self.schema),
                {"specs": json.dumps(specs), "ts": ts},
            )
            added = [int(row[0]) async for row in cur]
        if added:
            logger.info(
                "Cron: added %d job(s) for %s%s",
                len(added),
                stamp,
                " (backfill)" if backfilled else "",
            )
        return added

    async def fire(self, ts: datetime, entries: Sequence[Entry], backfilled: bool) -> list[int]:
        """Add the jobs of the schedules ``entries`` for the minute ``ts``
        (those another worker fired already, or changed since they were
        read, add none); returns the ids added."""
        stamp = cron_timestamp(ts)
        specs = []
        for entry in entries:
            cron: dict[str, Any] = {"ts": stamp, "backfilled": backfilled}
            if entry.zone is not None:
                cron["local"] = local_timestamp(ts, entry.zone)
            specs.append(
                {
                    "identifier": entry.schedule.identifier,
                    "version": entry.schedule.version,
                    "payload": {**(entry.schedule.payload or {}), "_cron": cron},
                }
            )
        async with self.pool.connection() as conn:
            cur = await conn.execute(self._fire, {"specs": json.dumps(specs), "ts": ts})
            added = [(identifier, int(job_id)) async for identifier, job_id in cur]
        if added:
            logger.info(
                "Cron: added %d job(s) of schedule(s) %s for %s%s",
                len(added),
                ", ".join(sorted(identifier for identifier, _ in added)),
                stamp,
                " (backfill)" if backfilled else "",
            )
        return [job_id for _, job_id in added]

    def _cron_field(
        self, item: ParsedCronItem, ts: datetime, stamp: str, backfilled: bool
    ) -> dict[str, Any]:
        """The payload's ``_cron``: Node's ``ts`` (``stamp``, UTC) and
        ``backfilled``, and ``local`` for an item in a time zone."""
        field: dict[str, Any] = {"ts": stamp, "backfilled": backfilled}
        zone = self.zones.get(item.identifier)
        if zone is not None:
            field["local"] = local_timestamp(ts, zone)
        return field
