"""Cron in a time zone: the UTC instants a zoned line fires at, against a
brute-force evaluation of Debian cron's rules written plainly here (no database)."""

from __future__ import annotations

from collections import deque
from datetime import UTC, date, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

import pytest

from worker_cli.jobs.cron_zones import ZoneTimetable, fire_instants, local_timestamp
from worker_cli.jobs.crontab import CronItem, CrontabError, parse_cron_items, parse_crontab

pytestmark = pytest.mark.unit

START = datetime(2026, 1, 1, tzinfo=UTC)
END = datetime(2028, 1, 1, tzinfo=UTC)
MINUTE = timedelta(minutes=1)

ZONES = (
    "Europe/Paris",
    "America/New_York",
    "Australia/Lord_Howe",  # 30-minute shift
    "America/Santiago",  # changes at midnight
    "Africa/Cairo",  # changes at midnight
    "Asia/Tokyo",  # no daylight saving time
)
# Fixed times in each zone's gaps and repeated hours (Paris 02:00-03:00 both;
# New York 02:xx skipped, 01:xx repeated; Lord Howe 02:00-02:30 skipped,
# 01:30-02:00 repeated; Santiago and Cairo 00:xx skipped, 23:xx repeated),
# wildcard hours, a step, a range with days of week.
PATTERNS = (
    "30 2 * * *",
    "15 2 * * *",
    "*/15 2 * * *",
    "30 1 * * *",
    "45 1 * * *",
    "30 0 * * *",
    "45 23 * * *",
    "15 * * * *",
    "*/20 * * * *",
    "10 0-3 * * 0,5",
)


@cache
def walls(zone_name: str) -> list[tuple[datetime, datetime, datetime, bool]]:
    """Every UTC minute of the two years, with the zone's wall time then, the
    wall time a minute before, and whether that wall time was already shown
    in the 3 hours before (the second time round in a repeated hour)."""
    zone = ZoneInfo(zone_name)
    recent: deque[datetime] = deque()
    shown: set[datetime] = set()  # the walls of ``recent``
    result = []
    instant = START
    previous = (START - MINUTE).astimezone(zone).replace(tzinfo=None)
    while instant < END:
        wall = instant.astimezone(zone).replace(tzinfo=None, fold=0)
        result.append((instant, wall, previous, wall in shown))
        recent.append(wall)
        shown.add(wall)
        if len(recent) > 180:
            shown.discard(recent.popleft())
        previous = wall
        instant += MINUTE
    return result


def plain_matches(pattern: str, wall: datetime) -> bool:
    """The five fields read plainly (no lists of values kept)."""

    def field(text: str, value: int, low: int) -> bool:
        for part in text.split(","):
            if part == "*" or (part.startswith("*/") and (value - low) % int(part[2:]) == 0):
                return True
            if "-" in part and int(part.split("-")[0]) <= value <= int(part.split("-")[1]):
                return True
            if part.isdigit() and int(part) == value:
                return True
        return False

    minute, hour, dom, month, dow = pattern.split()
    if not (field(minute, wall.minute, 0) and field(hour, wall.hour, 0)):
        return False
    days = dom == "*" or field(dom, wall.day, 1), dow == "*" or field(dow, wall.isoweekday() % 7, 0)
    day = days[0] or days[1] if dom != "*" and dow != "*" else days[0] and days[1]
    return (
        field(minute, wall.minute, 0)
        and field(hour, wall.hour, 0)
        and field(month, wall.month, 1)
        and day
    )


def brute_force(pattern: str, zone_name: str) -> list[datetime]:
    """Debian cron's rules, minute by minute: a wildcard-hour line fires at
    every UTC minute whose wall time it matches; a fixed-time line fires the
    first time round only, and once right after a gap (the minute whose wall
    time jumped) if a skipped wall time matches."""
    fixed = "*" not in pattern.split()[1]
    fires = []
    for instant, wall, previous, seen in walls(zone_name):
        if not fixed:
            if plain_matches(pattern, wall):
                fires.append(instant)
            continue
        skipped = []
        missing = previous + MINUTE
        while missing < wall:
            skipped.append(missing)
            missing += MINUTE
        if (plain_matches(pattern, wall) and not seen) or any(
            plain_matches(pattern, w) for w in skipped
        ):
            fires.append(instant)
    return fires


def item(pattern: str, zone_name: str) -> object:
    [parsed] = parse_crontab(f"{pattern} t ?id=t&tz={zone_name}")
    return parsed


@pytest.mark.slow  # about 8 s a zone: two years minute by minute
@pytest.mark.parametrize("zone_name", ZONES)
def test_two_years_of_instants_equal_a_minute_by_minute_evaluation(zone_name: str) -> None:
    zone = ZoneInfo(zone_name)
    for pattern in PATTERNS:
        [parsed] = parse_crontab(f"{pattern} t ?id=t&tz={zone_name}")
        computed = list(fire_instants(parsed, zone, START, END))
        expected = brute_force(pattern, zone_name)
        assert computed == expected, (zone_name, pattern, set(computed) ^ set(expected))


@pytest.mark.slow  # the two years of every zone (shared with the test above)
def test_the_brute_force_sees_the_changes_it_is_meant_to() -> None:
    """The zones do change where the patterns look (else the test proves little)."""
    jumps = {
        zone: {
            (previous.hour, previous.minute, wall.hour, wall.minute)
            for _, wall, previous, _ in walls(zone)
            if wall - previous != MINUTE
        }
        for zone in ZONES
    }
    assert jumps["Europe/Paris"] == {(1, 59, 3, 0), (2, 59, 2, 0)}
    assert jumps["America/New_York"] == {(1, 59, 3, 0), (1, 59, 1, 0)}
    assert jumps["Australia/Lord_Howe"] == {(1, 59, 2, 30), (1, 59, 1, 30)}
    assert jumps["America/Santiago"] == {(23, 59, 1, 0), (23, 59, 23, 0)}
    assert jumps["Africa/Cairo"] == {(23, 59, 1, 0), (23, 59, 23, 0)}
    assert jumps["Asia/Tokyo"] == set()


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def test_the_dst_table_in_paris() -> None:
    """The README's table, one case each (2026: 29 March skips 02:xx, 25 October repeats it)."""
    paris = ZoneInfo("Europe/Paris")

    def fires(pattern: str, start: datetime, end: datetime) -> list[str]:
        return [
            local_timestamp(t, paris)
            for t in fire_instants(item(pattern, "Europe/Paris"), paris, start, end)
        ]  # type: ignore[arg-type]

    spring, autumn = utc(2026, 3, 28, 23), utc(2026, 10, 24, 22)
    assert fires("30 2 * * *", spring, spring + timedelta(hours=6)) == ["2026-03-29T03:00:00+02:00"]
    assert fires("30 2 * * *", autumn, autumn + timedelta(hours=6)) == ["2026-10-25T02:30:00+02:00"]
    assert fires("30 * * * *", spring + timedelta(hours=1), spring + timedelta(hours=3)) == [
        "2026-03-29T01:30:00+01:00",
        "2026-03-29T03:30:00+02:00",
    ]
    assert fires("30 * * * *", autumn + timedelta(hours=2), autumn + timedelta(hours=4)) == [
        "2026-10-25T02:30:00+02:00",
        "2026-10-25T02:30:00+01:00",
    ]


def test_the_timetable_answers_minute_by_minute_as_the_instants() -> None:
    lord_howe = ZoneInfo("Australia/Lord_Howe")
    parsed = item("15 2 * * *", "Australia/Lord_Howe")
    timetable = ZoneTimetable(parsed, lord_howe)  # type: ignore[arg-type]
    start = utc(2026, 10, 1)
    asked = [
        start + i * MINUTE for i in range(10 * 24 * 60) if timetable.fires_at(start + i * MINUTE)
    ]
    assert asked == list(fire_instants(parsed, lord_howe, start, start + timedelta(days=10)))  # type: ignore[arg-type]
    assert local_timestamp(asked[2], lord_howe) == "2026-10-04T02:30:00+11:00"  # after the gap


def test_lines_without_tz_keep_utc_and_no_zone() -> None:
    [parsed] = parse_crontab("30 2 * * * t")
    assert parsed.tz is None and parsed.fixed_hour
    [wild] = parse_crontab("30 */2 * * * t")
    assert not wild.fixed_hour


@pytest.mark.parametrize(
    "line,message",
    [
        (
            "30 2 * * * t ?id=t&tz=Europe/Pariss",
            "crontab line 1: unknown time zone 'Europe/Pariss': expected an IANA name",
        ),
        ("30 2 * * * t ?tz=Europe/Paris", "crontab line 1: tz=Europe/Paris needs an explicit id"),
        ("30 2 * * * t ?id=t&tz=../etc/passwd", "crontab line 1: unknown time zone"),
    ],
)
def test_bad_zones_and_a_zone_without_id_are_one_clear_error(line: str, message: str) -> None:
    with pytest.raises(CrontabError) as raised:
        parse_crontab(line)
    assert str(raised.value).startswith(message)
    assert "\n" not in str(raised.value)


def test_cron_items_take_tz_with_the_same_rules() -> None:
    [parsed] = parse_cron_items(
        [CronItem(task="t", pattern="30 2 * * *", identifier="t", tz="Asia/Tokyo")]
    )
    assert parsed.tz == ZoneInfo("Asia/Tokyo")
    with pytest.raises(CrontabError, match="cron item 0: tz='Asia/Tokyo' needs an explicit id"):
        parse_cron_items([{"task": "t", "pattern": "30 2 * * *", "tz": "Asia/Tokyo"}])
    with pytest.raises(CrontabError, match="cron item 0: unknown time zone 'Mars/Olympus'"):
        parse_cron_items(
            [{"task": "t", "pattern": "* * * * *", "identifier": "x", "tz": "Mars/Olympus"}]
        )


def test_a_date_is_enough_for_the_day_fields() -> None:
    [parsed] = parse_crontab("0 0 1 * 1 t")
    assert parsed.matches_day(date(2026, 6, 1)) and parsed.matches_day(date(2026, 6, 8))
    assert not parsed.matches_day(date(2026, 6, 9))
