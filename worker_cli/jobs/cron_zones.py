"""When a cron item in a time zone fires: its instants in UTC (no I/O).

An item's pattern names wall-clock times of its zone; this module turns them
into the UTC instants the scheduler adds jobs at, with Debian cron's rules for
daylight saving changes:

* A *fixed-time* item (its hour field is a number, list or range) whose wall
  time is skipped (spring forward) fires once, at the first instant after the
  gap; one whose wall time happens twice (fall back) fires once, at the first
  occurrence.
* A *wildcard-hour* item (``*`` or ``*/n`` hours) fires at the wall times that
  exist, as often as they exist: nothing in a gap, twice in an overlap, so its
  real intervals are kept.

Items without a zone (UTC) never come here: they match UTC minutes directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from .crontab import ParsedCronItem

__all__ = ["ZoneTimetable", "fire_instants", "local_timestamp"]

MINUTE = timedelta(minutes=1)
DAY = timedelta(days=1)


def fire_instants(
    item: ParsedCronItem, zone: ZoneInfo, start: datetime, end: datetime
) -> Iterator[datetime]:
    """The UTC instants in ``[start, end)`` at which ``item`` fires in ``zone``,
    in order, each once (``start`` and ``end`` are aware datetimes)."""
    day = start.astimezone(zone).date() - DAY  # a day's instants may fall on the next
    last = end.astimezone(zone).date() + DAY
    previous: datetime | None = None
    while day <= last:
        if item.matches_day(day):
            for instant in sorted(_day_instants(item, zone, day)):
                if start <= instant < end and (previous is None or instant > previous):
                    previous = instant
                    yield instant
        day += DAY


def _day_instants(item: ParsedCronItem, zone: ZoneInfo, day: date) -> Iterator[datetime]:
    """The instants of the item's wall times on ``day`` (unordered, maybe repeated)."""
    for hour in item.hours:
        for minute in item.minutes:
            yield from wall_instants(
                datetime.combine(day, time(hour, minute)), zone, item.fixed_hour
            )


def wall_instants(wall: datetime, zone: ZoneInfo, fixed: bool) -> tuple[datetime, ...]:
    """The UTC instants a (naive) wall time of ``zone`` fires at, by the rules above."""
    first = wall.replace(tzinfo=zone).astimezone(UTC)
    if _wall(first, zone) == wall:  # it exists
        if fixed:
            return (first,)
        second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
        return (first,) if second == first else (first, second)
    if not fixed:
        return ()
    # In a gap, fold=1 reads the wall time with the offset after the change:
    # an instant before the gap; the gap ends at the first minute that shows
    # a later wall time.
    instant = wall.replace(tzinfo=zone, fold=1).astimezone(UTC).replace(second=0, microsecond=0)
    while _wall(instant, zone) <= wall and instant < first:
        instant += MINUTE
    return (instant,)


def _wall(instant: datetime, zone: ZoneInfo) -> datetime:
    """The naive wall time of ``zone`` at ``instant``."""
    return instant.astimezone(zone).replace(tzinfo=None, fold=0)


def local_timestamp(instant: datetime, zone: ZoneInfo) -> str:
    """The wall time of ``zone`` at ``instant`` with its offset, as in ``_cron.local``
    (``2026-03-29T03:00:00+02:00``)."""
    return instant.astimezone(zone).isoformat(timespec="seconds")


class ZoneTimetable:
    """One zoned item's fire instants, asked minute by minute (the scheduler's
    loop and its backfill): computed a day at a time and kept until the
    minutes asked about leave that day."""

    def __init__(self, item: ParsedCronItem, zone: ZoneInfo) -> None:
        self.item = item
        self.zone = zone
        self._start = self._end = datetime.min.replace(tzinfo=UTC)
        self._instants: frozenset[datetime] = frozenset()

    def fires_at(self, ts: datetime) -> bool:
        """Whether the item fires at the UTC minute ``ts``."""
        if not self._start <= ts < self._end:
            self._start, self._end = ts, ts + DAY
            self._instants = frozenset(fire_instants(self.item, self.zone, ts, self._end))
        return ts in self._instants
