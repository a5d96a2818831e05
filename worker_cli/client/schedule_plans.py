"""Plans for the schedules of both utilities facades (add, remove, pause,
resume, list, one): each checks its arguments before any I/O, then sends the
statements of :mod:`worker_cli.sql.schedules`."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from ..db.plan import Plan, query
from ..errors import JobSpecError
from ..jobs.schedule import Schedule, check_schedule_identifier, schedule_params
from ..schema.probe import schema_required
from ..sql import compose
from ..sql import schedules as schedules_sql

__all__ = [
    "add_schedule",
    "get_schedule",
    "list_schedules",
    "pause_schedule",
    "remove_schedule",
    "resume_schedule",
]


def add_schedule(
    schema: str,
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
) -> Plan[Schedule]:
    """``add_schedule``: the schedule as stored (added or replaced)."""
    params = schedule_params(
        identifier,
        pattern,
        task_identifier,
        payload,
        tz=tz,
        fill=fill,
        queue_name=queue_name,
        priority=priority,
        max_attempts=max_attempts,
        job_key=job_key,
        paused=paused,
    )
    return _add(schema, params)


def _add(schema: str, params: dict[str, Any]) -> Plan[Schedule]:
    with schema_required(schema):
        crontab = yield from query(compose(schedules_sql.CRONTAB_IDENTIFIER, schema), params)
        if crontab:
            raise JobSpecError(
                "identifier",
                f"{params['identifier']!r} is a crontab item's (a Python or Node worker has run "
                f"it since {crontab[0][0]:%Y-%m-%d %H:%M} UTC); give the schedule another "
                "identifier",
            )
        rows = yield from query(compose(schedules_sql.UPSERT_SCHEDULE, schema), params)
    return Schedule.from_row(rows[0])


def remove_schedule(schema: str, identifier: str) -> Plan[bool]:
    """``remove_schedule``: whether there was one."""
    check_schedule_identifier(identifier)
    return _remove(schema, identifier)


def _remove(schema: str, identifier: str) -> Plan[bool]:
    with schema_required(schema):
        rows = yield from query(
            compose(schedules_sql.REMOVE_SCHEDULE, schema), {"identifier": identifier}
        )
    return bool(rows)


def pause_schedule(schema: str, identifier: str, paused: bool) -> Plan[Schedule | None]:
    """``pause_schedule`` / ``resume_schedule``: the schedule (None: none)."""
    check_schedule_identifier(identifier)
    return _set_paused(schema, identifier, paused)


def _set_paused(schema: str, identifier: str, paused: bool) -> Plan[Schedule | None]:
    with schema_required(schema):
        rows = yield from query(
            compose(schedules_sql.SET_PAUSED, schema),
            {"identifier": identifier, "paused": paused},
        )
    return Schedule.from_row(rows[0]) if rows else None


def resume_schedule(schema: str, identifier: str) -> Plan[Schedule | None]:
    """``resume_schedule``: the schedule (None: none)."""
    return pause_schedule(schema, identifier, False)


def list_schedules(schema: str) -> Plan[list[Schedule]]:
    """``list_schedules``: every schedule, by identifier."""
    with schema_required(schema):
        rows = yield from query(compose(schedules_sql.LIST_SCHEDULES, schema), {})
    return [Schedule.from_row(row) for row in rows]


def get_schedule(schema: str, identifier: str) -> Plan[Schedule | None]:
    """``get_schedule``: one schedule (None: none)."""
    check_schedule_identifier(identifier)
    return _get(schema, identifier)


def _get(schema: str, identifier: str) -> Plan[Schedule | None]:
    with schema_required(schema):
        rows = yield from query(compose(schedules_sql.SCHEDULE, schema), {"identifier": identifier})
    return Schedule.from_row(rows[0]) if rows else None
