"""IANA time zones by name, for cron (``?tz=`` and ``cron_timezone``).

One place reads a zone name, so that every way of giving one (a crontab line,
a cron item, the worker option) rejects an unknown name with the same message.
"""

from __future__ import annotations

from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["UTC_NAMES", "zone_named"]

#: Names of UTC itself: a default zone of one of these keeps Node's UTC crontab.
UTC_NAMES = frozenset({"UTC", "Etc/UTC"})


def zone_named(name: str) -> ZoneInfo:
    """The zone called ``name`` (``Europe/Paris``); ValueError naming it if
    there is no such zone in the system's or the ``tzdata`` package's database."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError, OSError):
        raise ValueError(
            f"unknown time zone {name!r}: expected an IANA name such as Europe/Paris "
            "(the zone database is the system's, or the tzdata package's)"
        ) from None
