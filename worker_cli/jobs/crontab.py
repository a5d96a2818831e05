"""The crontab format of graphile-worker: parsing and matching (no I/O).

A line is five time fields (UTC, or the zone of its ``?tz=`` option), a task
identifier, optional ``?options`` and an optional JSON5 payload::

    # m  h  dom mon dow  task               options              payload
    30   4  *   *   1    send_weekly_email  ?fill=2d&max=10      {onboarding: false}

Fields take numbers, ``*``, ``*/n`` (every n-th value from the field's
minimum), ranges ``a-b`` and comma-separated lists of these. Day of week is
0-6 from Sunday (7 is Sunday too). When both day of month and day of week are
restricted, a day matching either matches, as in cron. When a line's zone
fires it (daylight saving time) is :mod:`worker_cli.jobs.cron_zones`'s business.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl
from zoneinfo import ZoneInfo

from ..config.zones import zone_named
from ..errors import ConfigurationError
from .job_spec import IDENTIFIER_MAX, KEY_MAX

__all__ = [
    "CronItem",
    "CrontabError",
    "ParsedCronItem",
    "parse_cron_item",
    "parse_cron_items",
    "parse_crontab",
    "parse_time_phrase",
]

#: The longest ``fill``: a year (a yearly item's missed run). At start-up the
#: worker walks the period minute by minute (527,040 minutes for 366 days).
MAX_FILL = timedelta(days=366)

_TIME_FIELD = r"[0-9*/,-]+"
_LINE = re.compile(
    rf"^({_TIME_FIELD})\s+({_TIME_FIELD})\s+({_TIME_FIELD})\s+({_TIME_FIELD})\s+({_TIME_FIELD})"
    r"(?:\s+(.*))?$"
)
_PATTERN = re.compile(
    rf"^({_TIME_FIELD})\s+({_TIME_FIELD})\s+({_TIME_FIELD})\s+({_TIME_FIELD})\s+({_TIME_FIELD})$"
)
_COMMAND = re.compile(r"^([_a-zA-Z][_a-zA-Z0-9:/_-]*)(?:\s+\?(\S+))?(?:\s+(.+))?$")
_TASK = re.compile(r"^[_a-zA-Z][_a-zA-Z0-9:/_-]*$")
_ID = re.compile(r"^[_a-zA-Z][-_a-zA-Z0-9]*$")
_QUEUE = re.compile(r"^[-a-zA-Z0-9_:]+$")
_PHRASE_PART = re.compile(r"([0-9]+)([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
#: Digits a number of a crontab may have: more is out of every range (and
#: Python refuses to read numbers of over 4300 digits).
_DIGITS = 12
_HUGE = 10**_DIGITS

# (name, lowest, highest) of the five time fields.
_FIELDS = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day of month", 1, 31),
    ("month", 1, 12),
    ("day of week", 0, 6),
)


class CrontabError(ConfigurationError, ValueError):
    """A crontab line (or cron item) is invalid; the message says where and why."""


@dataclass(frozen=True)
class CronItem:
    """A cron item as a person writes it in library mode."""

    task: str
    pattern: str
    identifier: str | None = None
    payload: Mapping[str, Any] | None = None
    backfill_period: timedelta = timedelta(0)
    max_attempts: int | None = None
    queue_name: str | None = None
    priority: int | None = None
    job_key: str | None = None
    job_key_mode: str | None = None
    #: The IANA zone of the pattern (``Europe/Paris``); needs ``identifier``.
    tz: str | None = None


@dataclass(frozen=True)
class ParsedCronItem:
    """A validated cron item: the values each time field matches, and its options."""

    identifier: str
    task: str
    minutes: frozenset[int]
    hours: frozenset[int]
    dates: frozenset[int]
    months: frozenset[int]
    dows: frozenset[int]
    payload: Mapping[str, Any] = field(default_factory=dict)
    backfill_period: timedelta = timedelta(0)
    max_attempts: int | None = None
    queue_name: str | None = None
    priority: int | None = None
    job_key: str | None = None
    job_key_mode: str | None = None
    #: The hour field is a number, list or range (no ``*``): a *fixed-time*
    #: item, which a daylight saving change moves rather than skips or doubles.
    fixed_hour: bool = False
    #: The zone of ``?tz=`` (None: the worker's ``cron_timezone``, UTC by default).
    tz: ZoneInfo | None = None

    def matches(self, ts: datetime) -> bool:
        """Whether the item fires at the wall-clock minute ``ts`` (in UTC for
        an item without a zone)."""
        if ts.minute not in self.minutes or ts.hour not in self.hours:
            return False
        return self.matches_day(ts)

    def ever_fires(self) -> bool:
        """Whether any day of any year matches (``0 0 31 2 *`` never does):
        eight years hold every leap day on every day of the week."""
        day, end = date(2024, 1, 1), date(2032, 1, 1)
        while day < end:
            if self.matches_day(day):
                return True
            day += timedelta(days=1)
        return False

    def matches_day(self, day: date) -> bool:
        """Whether the item fires on ``day`` (its month, day of month and of week)."""
        if day.month not in self.months:
            return False
        dow = day.isoweekday() % 7  # Sunday = 0
        date_restricted = len(self.dates) != 31
        dow_restricted = len(self.dows) != 7
        if date_restricted and dow_restricted:
            return day.day in self.dates or dow in self.dows
        if date_restricted:
            return day.day in self.dates
        if dow_restricted:
            return dow in self.dows
        return True


def parse_crontab(text: str) -> list[ParsedCronItem]:
    """Parse a crontab file's text; errors name the line number."""
    items: list[ParsedCronItem] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            items.append(_parse_line(line))
        except CrontabError as exc:
            raise CrontabError(f"crontab line {number}: {exc}") from None
    _check_unique(items, lambda index: f"crontab line {_line_of(text, index)}")
    return items


def parse_cron_items(items: Iterable[CronItem | Mapping[str, Any]]) -> list[ParsedCronItem]:
    """Validate cron items given in code (``CronItem`` or dicts with its fields)."""
    parsed: list[ParsedCronItem] = []
    for index, raw in enumerate(items):
        where = f"cron item {index}"
        try:
            item = raw if isinstance(raw, CronItem) else CronItem(**raw)
        except TypeError as exc:
            raise CrontabError(f"{where}: {exc}") from None
        try:
            parsed.append(_parse_item(item))
        except CrontabError as exc:
            raise CrontabError(f"{where}: {exc}") from None
    _check_unique(parsed, lambda index: f"cron item {index}")
    return parsed


def parse_cron_item(item: CronItem) -> ParsedCronItem:
    """Validate one cron item (a database schedule's; the error says what is wrong)."""
    return _parse_item(item)


def parse_time_phrase(phrase: str) -> timedelta:
    """``4w3d2h1m`` -> timedelta; units s, m, h, d, w."""
    seconds = _phrase_seconds(phrase)
    if seconds > timedelta.max.total_seconds():
        raise CrontabError(f"time phrase {_shown(phrase)} is longer than Python can hold")
    return timedelta(seconds=seconds)


def _phrase_seconds(phrase: str) -> int:
    if not re.fullmatch(r"(?:[0-9]+[smhdw])+", phrase):
        raise CrontabError(
            f"invalid time phrase {_shown(phrase)}: expected numbers with units s, m, h, d or w "
            "(for example 2d or 1h30m)"
        )
    return sum(_number(n) * _UNITS[unit] for n, unit in _PHRASE_PART.findall(phrase))


def _parse_line(line: str) -> ParsedCronItem:
    match = _LINE.match(line)
    if not match:
        raise CrontabError(
            f"{_shown(line)} is not a crontab line: expected five time fields "
            "(minute hour day-of-month month day-of-week) and a task identifier"
        )
    fields = match.groups()[:5]
    command = match.group(6)
    if not command:
        raise CrontabError("the task identifier is missing after the five time fields")
    parts = _COMMAND.match(command)
    if not parts:
        raise CrontabError(
            f"invalid task identifier in {_shown(command)}: it must start with a letter or _ "
            "and hold only letters, digits, _, -, : and /"
        )
    task, options_text, payload_text = parts.groups()
    _check_length("task identifier", task, IDENTIFIER_MAX)
    options = _parse_options(options_text or "")
    payload = _parse_payload(payload_text) if payload_text else {}
    ranges = _parse_fields(fields)
    if "tz" in options and "identifier" not in options:
        raise _id_needed(f"tz={options['tz'].key}")
    return ParsedCronItem(
        identifier=options.pop("identifier", task),
        task=task,
        payload=payload,
        **ranges,
        **options,
    )


def _parse_item(item: CronItem) -> ParsedCronItem:
    if not isinstance(item.task, str) or not _TASK.match(item.task):
        raise CrontabError(f"invalid task identifier {_shown(item.task)}")
    _check_length("task identifier", item.task, IDENTIFIER_MAX)
    pattern = _PATTERN.match(item.pattern.strip()) if isinstance(item.pattern, str) else None
    if not pattern:
        raise CrontabError(
            f"invalid cron pattern {_shown(item.pattern)}: expected five time fields"
        )
    identifier = item.identifier if item.identifier is not None else item.task
    if not isinstance(identifier, str) or (not _ID.match(identifier) and identifier != item.task):
        raise CrontabError(f"invalid identifier {_shown(identifier)}")
    _check_length("identifier", identifier, IDENTIFIER_MAX)
    if item.payload is not None and not isinstance(item.payload, Mapping):
        raise CrontabError("payload must be a dict")
    _check_json(item.payload or {})
    if item.queue_name is not None and not (
        isinstance(item.queue_name, str) and _QUEUE.match(item.queue_name)
    ):
        raise CrontabError(f"invalid queue name {_shown(item.queue_name)}")
    _check_length("queue name", item.queue_name, IDENTIFIER_MAX)
    if item.job_key is not None and not (
        isinstance(item.job_key, str) and 1 <= len(item.job_key) <= KEY_MAX
    ):
        raise CrontabError(f"job_key must be a string of 1 to {KEY_MAX} characters")
    if item.job_key_mode not in (None, "replace", "preserve_run_at"):
        raise CrontabError(f"jobKeyMode {item.job_key_mode!r} must be replace or preserve_run_at")
    _check_small_int("max_attempts", item.max_attempts, 1)
    _check_small_int("priority", item.priority, -32768)
    _check_fill(item.backfill_period, "backfill_period")
    zone = None
    if item.tz is not None:
        zone = _zone(item.tz)
        if item.identifier is None:
            raise _id_needed(f"tz={item.tz!r}")
    return ParsedCronItem(
        identifier=identifier,
        task=item.task,
        payload=dict(item.payload or {}),
        backfill_period=item.backfill_period,
        max_attempts=item.max_attempts,
        queue_name=item.queue_name,
        priority=item.priority,
        job_key=item.job_key,
        job_key_mode=item.job_key_mode,
        tz=zone,
        **_parse_fields(pattern.groups()),
    )


def _parse_fields(fields: Iterable[str]) -> dict[str, Any]:
    """The five time fields as the keyword arguments of ParsedCronItem."""
    fields = list(fields)
    names = ("minutes", "hours", "dates", "months", "dows")
    parsed: dict[str, Any] = {
        name: _parse_field(text, *spec)
        for name, text, spec in zip(names, fields, _FIELDS, strict=True)
    }
    parsed["fixed_hour"] = "*" not in fields[1]
    return parsed


def _parse_field(text: str, name: str, low: int, high: int) -> frozenset[int]:
    wraps = name == "day of week"  # 7 is Sunday too
    values: set[int] = set()

    def add(value: int, part: str) -> None:
        if wraps and value == high + 1:
            value = low
        if not low <= value <= high:
            shown = value if value < _HUGE else f"of over {_DIGITS} digits"
            raise CrontabError(
                f"{name} value {shown} in {_shown(part)} is out of range {low}-{high}"
            )
        values.add(value)

    for part in text.split(","):
        if re.fullmatch(r"[0-9]+", part):
            add(_number(part), part)
        elif match := re.fullmatch(r"([0-9]+)-([0-9]+)", part):
            start, end = _number(match.group(1)), _number(match.group(2))
            if start >= end:
                raise CrontabError(
                    f"{name} range {_shown(part)} must go from a smaller to a larger value"
                )
            for value in range(start, min(end, high + 2) + 1):  # high + 2: out of range
                add(value, part)
        elif match := re.fullmatch(r"\*(?:/([0-9]+))?", part):
            step = _number(match.group(1) or "1")
            if step < 1:
                raise CrontabError(f"{name} step in {_shown(part)} must be at least 1")
            values.update(range(low, high + 1, step))
        else:
            raise CrontabError(
                f"{name} field {_shown(part)} is not a number, a range (a-b), * or */n"
            )
    return frozenset(values)


def _parse_options(text: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    seen: set[str] = set()
    for key, val in parse_qsl(text, keep_blank_values=True, strict_parsing=bool(text)):
        if key in seen:
            raise CrontabError(f"option {key!r} is given twice")
        seen.add(key)
        if key == "id":
            if not _ID.match(val):
                raise CrontabError(
                    f"id {_shown(val)} must start with a letter or _ and hold only letters, "
                    "digits, _ and -"
                )
            _check_length("id", val, IDENTIFIER_MAX)
            result["identifier"] = val
        elif key == "fill":
            seconds = _phrase_seconds(val)
            if seconds > MAX_FILL.total_seconds():
                raise _fill_error(f"fill {_shown(val)}")
            result["backfill_period"] = timedelta(seconds=seconds)
        elif key == "max":
            if not re.fullmatch(r"[0-9]+", val) or not 1 <= _number(val) <= 32767:
                raise CrontabError(f"max {_shown(val)} must be a whole number from 1 to 32767")
            result["max_attempts"] = _number(val)
        elif key == "queue":
            if not _QUEUE.match(val):
                raise CrontabError(f"queue {_shown(val)} may only hold letters, digits, _, - and :")
            _check_length("queue", val, IDENTIFIER_MAX)
            result["queue_name"] = val
        elif key == "priority":
            if not re.fullmatch(r"-?[0-9]+", val) or not -32768 <= _number(val) <= 32767:
                raise CrontabError(
                    f"priority {_shown(val)} must be a whole number from -32768 to 32767"
                )
            result["priority"] = _number(val)
        elif key == "jobKey":
            if not 1 <= len(val) <= 512:
                raise CrontabError("jobKey must be 1 to 512 characters long")
            result["job_key"] = val
        elif key == "tz":
            # The query string made a "+" a space; no zone name has a space,
            # and some have a "+" (Etc/GMT+5): the "+" as written.
            result["tz"] = _zone(val.replace(" ", "+"))
        elif key == "jobKeyMode":
            if val not in ("replace", "preserve_run_at"):
                raise CrontabError(f"jobKeyMode {_shown(val)} must be replace or preserve_run_at")
            result["job_key_mode"] = val
        else:
            raise CrontabError(
                f"unknown option {_shown(key)}; known options: id, fill, max, queue, priority, "
                "jobKey, jobKeyMode, tz"
            )
    return result


def _parse_payload(text: str) -> dict[str, Any]:
    if not text.startswith("{"):
        raise CrontabError(f"the payload {_shown(text)} must be a JSON5 object: {{...}}")
    import json5  # only crontabs with a payload need it

    try:
        payload = json5.loads(text)
    except (ValueError, RecursionError) as exc:
        raise CrontabError(f"the payload {_shown(text)} is not valid JSON5: {exc}") from None
    if not isinstance(payload, dict):
        raise CrontabError("the payload must be an object ({...})")
    _check_json(payload)
    return payload


def _zone(name: object) -> ZoneInfo:
    if not isinstance(name, str):
        raise CrontabError(f"tz {name!r} must be the name of a time zone")
    try:
        return zone_named(name)
    except ValueError as exc:
        raise CrontabError(str(exc)) from None


def _id_needed(option: str) -> CrontabError:
    """A line in a time zone must name its identifier: graphile-worker (Node)
    would run a line of the same default identifier (the task) in UTC."""
    return CrontabError(
        f"{option} needs an explicit id (?id=...&tz=...): the identifier must not be one "
        "a graphile-worker (Node) crontab uses, as Node runs its lines in UTC"
    )


def _check_json(payload: Mapping[str, Any]) -> None:
    """The payload must be JSON, which PostgreSQL takes: no Infinity or NaN
    (JSON5 has them), nothing json cannot encode."""
    try:
        json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise CrontabError(f"the payload cannot be sent as JSON ({exc})") from None


def _check_fill(period: object, what: str) -> None:
    if not isinstance(period, timedelta) or not timedelta(0) <= period <= MAX_FILL:
        raise _fill_error(what)


def _fill_error(what: str) -> CrontabError:
    return CrontabError(f"{what} must be from 0 to {MAX_FILL.days}d (a year), the longest backfill")


def _check_length(what: str, value: str | None, limit: int) -> None:
    if value is not None and len(value) > limit:
        raise CrontabError(
            f"{what} {value[:40]!r}... is {len(value)} characters long; the limit is {limit}"
        )


def _number(text: str) -> int:
    """A (whole, optionally negative) number of a crontab; one of more than
    ``_DIGITS`` digits is read as ``±_HUGE``, out of every range."""
    digits = text.lstrip("-").lstrip("0") or "0"
    value = int(digits) if len(digits) <= _DIGITS else _HUGE
    return -value if text.startswith("-") else value


def _shown(text: object) -> str:
    """A value as a message quotes it: a long one cut to its start and length."""
    if isinstance(text, str) and len(text) > 60:
        return f"{text[:40]!r}... ({len(text)} characters)"
    return repr(text)


def _check_small_int(name: str, value: object, low: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 32767:
        raise CrontabError(f"{name} {value!r} must be a whole number from {low} to 32767")


def _check_unique(items: list[ParsedCronItem], where: Any) -> None:
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        if item.identifier in first:
            raise CrontabError(
                f"{where(index)}: identifier {item.identifier!r} is already used by "
                f"{where(first[item.identifier])}; give one of them ?id=..."
            )
        first[item.identifier] = index


def _line_of(text: str, index: int) -> int:
    """The line number of the ``index``-th item line of a crontab."""
    count = -1
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line and not line.startswith("#"):
            count += 1
            if count == index:
                return number
    return 0
