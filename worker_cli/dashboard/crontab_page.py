"""The Crontab page: each item of the workers' crontab with its schedule as
written, its time zone, its last run and its next one, and "Run now".

No table records the schedules the worker pools run (``_private_known_crontabs``
holds an identifier, when it became known and its last execution; the
heartbeats list tasks, not cron items), so the dashboard reads a crontab given
to it (``--crontab PATH``, ``create_app(crontab_file=...)`` or its text,
``crontab=``), parsed at start by the worker's own parser, with the worker's
default zone (``--cron-timezone``). Its next runs are the worker's own
instants (:func:`~worker_cli.jobs.cron_zones.fire_instants`, daylight saving
as the scheduler applies it); its last runs are ``_private_known_crontabs``'
(the scheduler's record, shared with Node). The identifiers the workers know
that the file has not are listed apart, with their last run.

"Run now" adds the item's job at once, as the scheduler would at one of its
minutes: the same ``add_job`` call with its task, payload (and ``_cron``:
``ts`` the moment it was added, ``backfilled`` false, ``local`` for an item in
a zone), queue, max attempts, priority, job key and mode. It leaves
``_private_known_crontabs`` alone: the last run stays the scheduler's last
minute, so no scheduled run is skipped and none is backfilled because of it.

The schedules in the database (``_private_py_schedules``: ``add_schedule``,
``graphile-worker schedule``) are listed apart, each with its pattern, zone
(none: the workers' ``--cron-timezone``, as the dashboard was told it), its
state, its last run and lag, and its next runs, computed by the same code from
the crontab code's item of the schedule
(:func:`~worker_cli.jobs.schedule.schedule_item`); they are added, changed,
paused, resumed and removed from here (:mod:`.schedule_actions`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from ..config.zones import UTC_NAMES, zone_named
from ..errors import ConfigurationError
from ..jobs.cron_zones import fire_instants, local_timestamp
from ..jobs.crontab import CrontabError, ParsedCronItem, parse_crontab
from ..jobs.schedule import Schedule, schedule_item
from ..sql import compose
from ..sql import cron as cron_sql
from .actions import READ_ONLY, checked_form, redirect, refused
from .formatting import fill_phrase

if TYPE_CHECKING:
    from .site import Site

__all__ = [
    "NEXT_RUNS",
    "CronLine",
    "Crontab",
    "NextRun",
    "cron_zone",
    "load_crontab",
    "next_runs",
    "routes",
]

logger = logging.getLogger("graphile_worker.dashboard")

UTC_ZONE = ZoneInfo("UTC")
#: How far ahead a next run is looked for (a 29 February item waits up to
#: eight years around 2100; an item no date matches, ``0 0 31 2 *``, never runs).
HORIZON = timedelta(days=366 * 9)
#: The next runs shown of each item and schedule.
NEXT_RUNS = 3
#: The schedules in the database listed at most.
SCHEDULES_SHOWN = 500


@dataclass(frozen=True)
class NextRun:
    """An instant a cron item or a schedule fires at: in UTC, and as the wall
    time of its zone (``2026-03-29 03:00 CEST``; empty in UTC)."""

    at: datetime
    local: str


def next_runs(
    item: ParsedCronItem, zone: ZoneInfo, now: datetime, count: int = NEXT_RUNS
) -> list[NextRun]:
    """The first ``count`` instants at or after ``now`` the scheduler fires
    ``item`` at in ``zone`` (fewer when it fires fewer within HORIZON)."""
    instants = fire_instants(item, zone, now, now + HORIZON)
    return [NextRun(at, _local(at, zone)) for at in islice(instants, count)]


def cron_zone(cron_timezone: str) -> ZoneInfo:
    """The zone of the items and schedules without one (the workers'
    ``--cron-timezone``); ConfigurationError naming it when there is none such."""
    try:
        return UTC_ZONE if cron_timezone in UTC_NAMES else zone_named(cron_timezone)
    except ValueError as exc:
        raise ConfigurationError(f"cron_timezone: {exc}") from None


@dataclass(frozen=True)
class CronLine:
    """A parsed cron item, with its line's time fields and options as written."""

    item: ParsedCronItem
    number: int
    schedule: str
    options: str


@dataclass(frozen=True)
class Crontab:
    """The crontab the dashboard shows: where it came from, its lines, and the
    zone of the lines without ``?tz=`` (the workers' ``cron_timezone``)."""

    #: The file's path ("" for a crontab given as text).
    source: str
    lines: tuple[CronLine, ...]
    default_zone: ZoneInfo

    def find(self, identifier: str) -> CronLine | None:
        return next((line for line in self.lines if line.item.identifier == identifier), None)

    def zone_of(self, item: ParsedCronItem) -> ZoneInfo:
        return item.tz or self.default_zone

    def next_runs(self, item: ParsedCronItem, now: datetime) -> list[NextRun]:
        """The next NEXT_RUNS instants from ``now`` the scheduler fires ``item`` at."""
        return next_runs(item, self.zone_of(item), now)

    def payload(self, item: ParsedCronItem, ts: datetime) -> dict[str, Any]:
        """The payload the scheduler gives a job of ``item`` added at ``ts``."""
        stamp = ts.astimezone(UTC)
        cron: dict[str, Any] = {
            "ts": stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z",
            "backfilled": False,
        }
        zone = self.zone_of(item)
        if zone.key not in UTC_NAMES:
            cron["local"] = local_timestamp(ts, zone)
        return {**item.payload, "_cron": cron}


def load_crontab(
    crontab: str | None = None,
    crontab_file: str | Path | None = None,
    cron_timezone: str = "UTC",
) -> Crontab | None:
    """The crontab of ``crontab`` (its text) or ``crontab_file``, None if
    neither is given; ConfigurationError (CrontabError) saying why it cannot be
    read, as the worker says it."""
    default_zone = cron_zone(cron_timezone)
    if crontab is not None and crontab_file is not None:
        raise ConfigurationError("give at most one of crontab and crontab_file")
    source = ""  # text given in code: no file to name
    if crontab_file is not None:
        path = Path(crontab_file)
        source = str(path)
        try:
            crontab = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigurationError(f"cannot read crontab {source!r}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            line = path.read_bytes()[: exc.start].count(b"\n") + 1
            raise ConfigurationError(f"crontab {source!r} line {line}: not UTF-8 text") from None
    if crontab is None:
        return None
    try:
        items = parse_crontab(crontab)
    except CrontabError as exc:
        raise CrontabError(f"{source}: {exc}" if crontab_file is not None else str(exc)) from None
    return Crontab(source, tuple(_lines(crontab, items)), default_zone)


def _lines(text: str, items: list[ParsedCronItem]) -> list[CronLine]:
    """``items`` with their lines: parse_crontab makes one item of each line
    that is neither empty nor a comment, in order."""
    numbered = [
        (number, raw.strip())
        for number, raw in enumerate(text.splitlines(), start=1)
        if raw.strip() and not raw.strip().startswith("#")
    ]
    lines = []
    for item, (number, line) in zip(items, numbered, strict=True):
        parts = line.split(None, 5)
        rest = parts[5].split(None, 2) if len(parts) > 5 else []
        options = rest[1] if len(rest) > 1 and rest[1].startswith("?") else ""
        lines.append(CronLine(item, number, " ".join(parts[:5]), options))
    return lines


def routes(dashboard: Site, crontab: Crontab | None, zone: ZoneInfo = UTC_ZONE) -> list[Route]:
    """The Crontab page and "Run now"; ``zone``: the workers' ``--cron-timezone``."""
    page = _CrontabPage(dashboard, crontab, zone)
    return [
        Route("/crontab", page.show, methods=["GET"], name="crontab"),
        Route("/crontab/run-now", page.confirm, methods=["GET"]),
        Route("/crontab/run-now", page.run_now, methods=["POST"]),
    ]


def schedule_row(schedule: Schedule, zone: ZoneInfo, now: datetime) -> dict[str, Any]:
    """What the Crontab page shows of a schedule in the database: its zone
    (``zone`` when it has none: UTC, as the workers fire it), its next runs
    (none while it is paused), or why its stored item cannot be read (a zone
    gone from the zone database)."""
    options = [
        f"{name} {value}"
        for name, value in (
            ("queue", schedule.queue_name),
            ("priority", schedule.priority),
            ("max attempts", schedule.max_attempts),
            ("job key", schedule.job_key),
            ("fill", fill_phrase(schedule.fill)),
        )
        if value not in (None, "")
    ]
    row: dict[str, Any] = {
        "schedule": schedule,
        "options": " · ".join(options),
        "payload": (
            json.dumps(schedule.payload, ensure_ascii=False)
            if schedule.payload
            else (f"({schedule.payload_error})" if schedule.payload_error else "")
        ),
        "zone": schedule.tz or zone.key,
        "zone_given": schedule.tz is not None,
        "next_runs": [],
        "error": None,
    }
    try:
        item = schedule_item(schedule)
    except (CrontabError, ValueError, TypeError) as exc:
        row["error"] = str(exc)
        return row
    if not schedule.paused:
        row["next_runs"] = next_runs(item, item.tz or zone, now)
    return row


class _CrontabPage:
    def __init__(self, dashboard: Site, crontab: Crontab | None, zone: ZoneInfo) -> None:
        self.dashboard = dashboard
        self.crontab = crontab
        self.zone = zone

    async def show(self, request: Request) -> Response:
        async with self.dashboard.reading() as reader:
            known = await reader.crontab()
            schedules = await reader.schedules(SCHEDULES_SHOWN + 1)
            now = await reader.now()
        return self.dashboard.render(
            request,
            "crontab.html",
            refresh=True,
            title="Crontab",
            page="crontab",
            crontab=self.crontab,
            items=self._rows(known, now),
            others=self._others(known),
            # A schedule without a zone fires in UTC, whatever the workers'
            # --cron-timezone (jobs/schedule.py): so are its next runs.
            schedules=[schedule_row(s, UTC_ZONE, now) for s in schedules[:SCHEDULES_SHOWN]],
            schedules_truncated=len(schedules) > SCHEDULES_SHOWN,
            next_count=NEXT_RUNS,
            now=now,
        )

    def _rows(self, known: list[dict[str, Any]], now: datetime) -> list[dict[str, Any]]:
        """The crontab's items, in the file's order, with their last and next runs."""
        if self.crontab is None:
            return []
        by_id = {row["identifier"]: row for row in known}
        rows = []
        for line in self.crontab.lines:
            item, zone = line.item, self.crontab.zone_of(line.item)
            rows.append(
                {
                    "line": line,
                    "item": item,
                    "payload": json.dumps(item.payload, ensure_ascii=False) if item.payload else "",
                    "zone": zone.key,
                    "zone_given": item.tz is not None,
                    "known": by_id.get(item.identifier),
                    "next_runs": self.crontab.next_runs(item, now),
                }
            )
        return rows

    def _others(self, known: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The identifiers the workers know that the crontab has not."""
        if self.crontab is None:
            return known
        return [row for row in known if self.crontab.find(row["identifier"]) is None]

    def _line(self, request: Request, identifier: str) -> CronLine | Response:
        """The crontab line of ``identifier``, or the response refusing a run."""
        if self.dashboard.read_only:
            return refused(self.dashboard, request, READ_ONLY)
        line = self.crontab.find(identifier) if self.crontab is not None else None
        if line is None:
            return self.dashboard.render(
                request,
                "error.html",
                status=404,
                title="No such cron item",
                reason=f"{identifier!r} is not an item of the dashboard's crontab"
                if self.crontab is not None
                else "the dashboard was given no crontab (--crontab PATH)",
            )
        return line

    async def confirm(self, request: Request) -> Response:
        line = self._line(request, request.query_params.get("item", ""))
        if isinstance(line, Response):
            return line
        assert self.crontab is not None
        async with self.dashboard.reading() as reader:
            now = await reader.now()
        return self.dashboard.render(
            request,
            "confirm_cron.html",
            title=f"Run now: cron item {line.item.identifier}",
            page="crontab",
            line=line,
            item=line.item,
            zone=self.crontab.zone_of(line.item).key,
            payload=json.dumps(self.crontab.payload(line.item, now), indent=2, ensure_ascii=False),
            now=now,
        )

    async def run_now(self, request: Request) -> Response:
        form = await checked_form(self.dashboard, request)
        if isinstance(form, Response):
            return form
        line = self._line(request, form.get("item", ""))
        if isinstance(line, Response):
            return line
        assert self.crontab is not None
        item = line.item
        async with self.dashboard.reading() as reader:
            now = await reader.now()
        params = {
            "task": item.task,
            "payload": json.dumps(self.crontab.payload(item, now)),
            "queue_name": item.queue_name,
            "run_at": now,
            "max_attempts": item.max_attempts,
            "job_key": item.job_key,
            "priority": item.priority,
            "job_key_mode": item.job_key_mode,
        }
        utils = await self.dashboard.utils()
        async with utils.connection() as conn:
            cursor = await conn.execute(compose(cron_sql.RUN_CRON_ITEM, utils.schema), params)
            job_id, due = await cursor.fetchone() or (None, False)
        logger.info("Dashboard: ran cron item %s now: job %s", item.identifier, job_id)
        if not due:  # its job key's pending job keeps its run_at (preserve_run_at)
            return RedirectResponse(self.dashboard.url(request, f"/jobs/{job_id}"), 303)
        return redirect(self.dashboard, request, f"/jobs/{job_id}", "run-now", job=job_id)


def _local(instant: datetime | None, zone: ZoneInfo) -> str:
    """``2026-03-29 03:00 CEST`` (the wall time of ``zone``); empty in UTC."""
    if instant is None or zone.key in UTC_NAMES:
        return ""
    return instant.astimezone(zone).strftime("%Y-%m-%d %H:%M %Z")
