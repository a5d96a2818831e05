"""Schedules in the database: cron items added, changed, paused and removed at
run time (``add_schedule``, ``graphile-worker schedule``, the dashboard), which
every Python worker fires as it fires its crontab's lines.

:class:`Schedule` is a schedule as stored (``list_schedules``);
:func:`schedule_params` checks what ``add_schedule`` was given, one field at a
time, so that the error names the field, before anything is sent; and
:func:`schedule_item` turns a stored schedule into the crontab code's
:class:`~worker_cli.jobs.crontab.ParsedCronItem`, so its instants (time zones,
daylight saving changes, backfill) are the crontab's, computed by the same code.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..errors import JobSpecError
from .crontab import CronItem, CrontabError, ParsedCronItem, parse_cron_item
from .crontab import parse_time_phrase as _phrase
from .job_spec import IDENTIFIER_MAX
from .payloads import json_default
from .text_args import check_text

__all__ = [
    "PAYLOAD_MAX",
    "SCHEDULE_COLUMNS",
    "Schedule",
    "check_schedule_identifier",
    "schedule_item",
    "schedule_params",
]

#: The largest payload a schedule keeps, in bytes of JSON: it is copied into
#: every job the schedule adds.
PAYLOAD_MAX = 64 * 1024

_ID = re.compile(r"^[_a-zA-Z][-_a-zA-Z0-9]*$")

#: The columns the schedules' statements return, in :class:`Schedule`'s order.
SCHEDULE_COLUMNS = (
    "identifier",
    "pattern",
    "task_identifier",
    "payload",
    "tz",
    "fill",
    "queue_name",
    "priority",
    "max_attempts",
    "job_key",
    "paused",
    "version",
    "created_at",
    "updated_at",
    "known_since",
    "last_execution",
    "last_run_at",
)


@dataclass(frozen=True)
class Schedule:
    """A schedule as stored (see the module's docstring)."""

    identifier: str
    pattern: str
    task_identifier: str
    payload: Mapping[str, Any] | None
    #: Its IANA zone (None: UTC, or the worker's ``cron_timezone``).
    tz: str | None
    #: The backfill period (a worker starting after a gap adds the missed
    #: runs of this period, as crontab's ``?fill=``).
    fill: timedelta
    queue_name: str | None
    priority: int | None
    max_attempts: int | None
    job_key: str | None
    paused: bool
    #: Grows with each change (a worker tells a changed schedule by it).
    version: int
    created_at: datetime
    updated_at: datetime
    #: It fires at instants from here on (its creation, or its last resume).
    known_since: datetime
    #: The last instant it fired at (UTC), and when that job was added.
    last_execution: datetime | None = None
    last_run_at: datetime | None = None
    #: Why its stored payload cannot be read here (None: it can): JSON that
    #: PostgreSQL takes but Python cannot (nested 5,000 deep, a 5,000-digit
    #: number), written past ``add_schedule``'s checks. ``payload`` is None
    #: then, and workers skip the schedule (with a warning) until it is
    #: replaced.
    payload_error: str | None = None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Schedule:
        """From a row of :data:`SCHEDULE_COLUMNS`, its payload as JSON text
        (parsed here: one that cannot be is this schedule's ``payload_error``)."""
        text = row[3]
        payload, error = None, None
        if text is not None:
            try:
                payload = json.loads(text)
            except (ValueError, RecursionError) as exc:
                error = f"its payload cannot be read: {type(exc).__name__}"
        values: dict[str, Any] = dict(zip(SCHEDULE_COLUMNS, row, strict=False))
        values["payload"] = payload
        return cls(**values, payload_error=error)

    @property
    def lag(self) -> float | None:
        """Seconds between its last instant and the moment its job was added."""
        if self.last_execution is None or self.last_run_at is None:
            return None
        return max(0.0, (self.last_run_at - self.last_execution).total_seconds())

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (times in ISO 8601, ``fill`` in seconds)."""
        out: dict[str, Any] = {}
        for name in SCHEDULE_COLUMNS:
            value = getattr(self, name)
            if isinstance(value, datetime):
                value = value.isoformat()
            elif isinstance(value, timedelta):
                value = value.total_seconds()
            out[name] = value
        if self.payload_error is not None:
            out["payload_error"] = self.payload_error
        return out


def check_schedule_identifier(identifier: object) -> str:
    """A schedule's identifier: letters, digits, ``_`` and ``-`` (as a crontab's ``?id=``),
    starting with a letter or ``_``, at most 128 characters."""
    if not isinstance(identifier, str) or not _ID.match(identifier):
        raise JobSpecError(
            "identifier",
            f"is {identifier!r}; it must start with a letter or _ and hold only letters, "
            "digits, _ and -",
        )
    if len(identifier) > IDENTIFIER_MAX:
        raise JobSpecError(
            "identifier", f"is {len(identifier)} characters long; the limit is {IDENTIFIER_MAX}"
        )
    return identifier


def _fill(fill: object) -> timedelta:
    if fill is None:
        return timedelta(0)
    if isinstance(fill, str):
        try:
            return _phrase(fill)
        except CrontabError as exc:
            raise JobSpecError("fill", str(exc)) from None
    if isinstance(fill, bool) or not isinstance(fill, timedelta | int | float):
        raise JobSpecError("fill", f"is {fill!r}; give a timedelta, seconds, or a phrase like 2d")
    return fill if isinstance(fill, timedelta) else timedelta(seconds=fill)


def schedule_params(
    identifier: str,
    pattern: str,
    task_identifier: str,
    payload: Mapping[str, Any] | None,
    *,
    tz: str | None,
    fill: timedelta | float | str | None,
    queue_name: str | None,
    priority: int | None,
    max_attempts: int | None,
    job_key: str | None,
    paused: bool,
) -> dict[str, Any]:
    """``add_schedule``'s arguments checked (a JobSpecError naming the field)
    and ready to send."""
    check_schedule_identifier(identifier)
    check_text(job_key, "job_key")
    period = _fill(fill)
    base: dict[str, Any] = {"task": "t", "pattern": "* * * * *", "identifier": "t"}
    checks: list[tuple[str, dict[str, Any]]] = [
        ("task_identifier", {"task": task_identifier}),
        ("pattern", {"pattern": pattern}),
        ("tz", {"tz": tz}),
        ("fill", {"backfill_period": period}),
        ("queue_name", {"queue_name": queue_name}),
        ("priority", {"priority": priority}),
        ("max_attempts", {"max_attempts": max_attempts}),
        ("job_key", {"job_key": job_key}),
    ]
    for name, given in checks:
        try:
            parse_cron_item(CronItem(**{**base, **given}))
        except CrontabError as exc:
            raise JobSpecError(name, str(exc)) from None
        except (TypeError, AttributeError) as exc:  # a pattern that is no string, ...
            raise JobSpecError(name, f"is {next(iter(given.values()))!r} ({exc})") from None
    if not isinstance(paused, bool):
        raise JobSpecError("paused", f"is {paused!r}; it must be True or False")
    text = _payload_text(payload)
    item = parse_cron_item(
        CronItem(task=task_identifier, pattern=pattern, identifier=identifier, tz=tz)
    )
    if not item.ever_fires():
        raise JobSpecError(
            "pattern", f"{pattern!r} never fires: no day of any month matches its day fields"
        )
    return {
        "identifier": identifier,
        "pattern": " ".join(pattern.split()),
        "task_identifier": task_identifier,
        "payload": text,
        "tz": tz,
        "fill": period,
        "queue_name": queue_name,
        "priority": priority,
        "max_attempts": max_attempts,
        "job_key": job_key,
        "paused": paused,
    }


def _payload_text(payload: object) -> str | None:
    if payload is None:
        return None
    if not isinstance(payload, Mapping):
        raise JobSpecError(
            "payload",
            f"is a {type(payload).__name__}; a schedule's payload is a dict (its jobs' "
            "payloads get _cron added to it)",
        )
    try:
        text = json.dumps(payload, default=json_default, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise JobSpecError("payload", f"cannot be sent as JSON ({exc})") from None
    if "\\u0000" in text:
        raise JobSpecError("payload", "contains a NUL character, which PostgreSQL cannot hold")
    size = len(text.encode())
    if size > PAYLOAD_MAX:
        raise JobSpecError(
            "payload",
            f"is {size:,} bytes of JSON; a schedule's payload is at most {PAYLOAD_MAX:,} "
            "(it is copied into every job it adds)",
        )
    return text


def schedule_item(schedule: Schedule) -> ParsedCronItem:
    """The crontab code's item of a stored schedule (raises CrontabError if
    what is stored no longer parses: a zone gone from the zone database)."""
    return parse_cron_item(
        CronItem(
            task=schedule.task_identifier,
            pattern=schedule.pattern,
            identifier=schedule.identifier,
            payload=dict(schedule.payload or {}),
            backfill_period=schedule.fill,
            max_attempts=schedule.max_attempts,
            queue_name=schedule.queue_name,
            priority=schedule.priority,
            job_key=schedule.job_key,
            tz=schedule.tz,
        )
    )
