"""The actions on the schedules in the database, from the Crontab page: add
one, change one (its form filled with it; the same identifier replaces it),
pause, resume and remove one.

As the other actions (:mod:`.actions`), each is a POST carrying the CSRF
token, refused (403) when the dashboard is read-only, that redirects (303) to
the Crontab page with a one-time notice (:mod:`.notices`). The add and change
form is a page of its own (``/crontab/schedules/new``,
``/crontab/schedules/edit?schedule=ID``): a value that is refused shows the
form again (400), filled in as it was sent, with the one line naming the
field that was wrong, and nothing is written. Pause and resume are one click
(each undoes the other); remove asks to confirm first, as the job actions do.

All go through :class:`worker_cli.WorkerUtils` (``add_schedule``,
``pause_schedule``, ``resume_schedule``, ``remove_schedule``): the same checks
(:func:`worker_cli.jobs.schedule.schedule_params`) and the same statements as
the API and the command line. The payload is JSON text (an object), the fill
a phrase like ``2d`` (crontab's ``?fill=``). The add form refuses an
identifier a schedule has already (the change form replaces it), and one of
an item of the dashboard's crontab, as the utilities refuse one a worker's
crontab has run.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, available_timezones

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import JobSpecError
from ..jobs.schedule import PAYLOAD_MAX, Schedule, check_schedule_identifier, schedule_params
from .actions import READ_ONLY, checked_form, redirect, refused
from .formatting import fill_phrase
from .inputs import SMALLINT, BadInput, parse_int, shown

if TYPE_CHECKING:
    from .crontab_page import Crontab
    from .site import Site

__all__ = ["FIELDS", "FieldError", "ScheduleForm", "routes", "schedule_request"]

logger = logging.getLogger("graphile_worker.dashboard")

#: The form's fields (besides the paused box), in its order.
FIELDS = (
    "identifier",
    "pattern",
    "task",
    "payload",
    "tz",
    "fill",
    "queue",
    "priority",
    "max_attempts",
    "job_key",
)

#: What the messages call each field (the form's labels).
LABELS = {
    "identifier": "identifier",
    "pattern": "pattern",
    "task": "task",
    "payload": "payload",
    "tz": "time zone",
    "fill": "fill",
    "queue": "queue",
    "priority": "priority",
    "max_attempts": "max attempts",
    "job_key": "job key",
    "paused": "paused",
}

#: The form's field of each of ``add_schedule``'s arguments (JobSpecError's ``field``).
_ARGUMENTS = {
    "identifier": "identifier",
    "pattern": "pattern",
    "task_identifier": "task",
    "payload": "payload",
    "tz": "tz",
    "fill": "fill",
    "queue_name": "queue",
    "priority": "priority",
    "max_attempts": "max_attempts",
    "job_key": "job_key",
    "paused": "paused",
}

#: The longest form body taken: a payload of PAYLOAD_MAX bytes of JSON,
#: URL-encoded (up to three times as long), and the other fields; a longer
#: payload still gets its one line from the checks.
MAX_SCHEDULE_FORM = 8 * PAYLOAD_MAX


class FieldError(BadInput):
    """A value of the schedule form the dashboard refuses: ``field`` names
    the form's field, the message says why (``label: reason``)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{LABELS.get(field, field)}: {reason}")
        self.field = field


@dataclass
class ScheduleForm:
    """The schedule form as shown: its values (as text), whether it changes
    the schedule of its identifier (``replace``), and the refusal to show."""

    values: dict[str, str] = field(default_factory=lambda: dict.fromkeys(FIELDS, ""))
    paused: bool = False
    replace: bool = False
    error: FieldError | None = None

    @classmethod
    def posted(cls, form: dict[str, str]) -> ScheduleForm:
        """The form as it was sent."""
        return cls(
            {name: form.get(name, "") for name in FIELDS},
            paused=bool(form.get("paused")),
            replace=form.get("replace") == "1",
        )

    @classmethod
    def of(cls, schedule: Schedule) -> ScheduleForm:
        """The change form of a stored schedule."""
        values = {
            "identifier": schedule.identifier,
            "pattern": schedule.pattern,
            "task": schedule.task_identifier,
            "payload": (
                json.dumps(schedule.payload, indent=2, ensure_ascii=False)
                if schedule.payload is not None
                else ""
            ),
            "tz": schedule.tz or "",
            "fill": fill_phrase(schedule.fill),
            "queue": schedule.queue_name or "",
            "priority": "" if schedule.priority is None else str(schedule.priority),
            "max_attempts": "" if schedule.max_attempts is None else str(schedule.max_attempts),
            "job_key": schedule.job_key or "",
        }
        return cls(values, paused=schedule.paused, replace=True)


def schedule_request(form: dict[str, str], crontab: Crontab | None) -> dict[str, Any]:
    """The arguments of ``WorkerUtils.add_schedule`` from the schedule form,
    checked as the utilities check them; FieldError naming the field that is
    wrong. An identifier of an item of ``crontab`` (the dashboard's) is refused."""
    values: dict[str, str] = {}
    for name in FIELDS:
        text = form.get(name, "")
        if "\x00" in text:
            raise FieldError(
                name, f"{shown(text)} contains a NUL character, which the database cannot store"
            )
        values[name] = text if name == "payload" else text.strip()
    payload = None
    if values["payload"].strip():
        try:
            payload = json.loads(values["payload"])
        except (ValueError, RecursionError) as exc:
            raise FieldError("payload", f"not JSON: {exc}") from None
        if not isinstance(payload, dict):
            raise FieldError(
                "payload",
                f"is a JSON {_json_kind(payload)}; a schedule's payload is an object "
                '({"key": "value"}: its jobs get _cron added to it)',
            )
    numbers: dict[str, int | None] = {}
    for name, low in (("priority", -SMALLINT - 1), ("max_attempts", 1)):
        try:
            numbers[name] = parse_int(values[name], LABELS[name], low)
        except BadInput as exc:
            raise FieldError(name, str(exc).split(": ", 1)[1]) from None
    arguments: dict[str, Any] = {
        "identifier": values["identifier"],
        "pattern": values["pattern"],
        "task_identifier": values["task"],
        "payload": payload,
        "tz": values["tz"] or None,
        "fill": values["fill"] or None,
        "queue_name": values["queue"] or None,
        "priority": numbers["priority"],
        "max_attempts": numbers["max_attempts"],
        "job_key": values["job_key"] or None,
        "paused": bool(form.get("paused")),
    }
    try:
        check_schedule_identifier(arguments["identifier"])
        line = crontab.find(arguments["identifier"]) if crontab is not None else None
        if line is not None:
            raise JobSpecError(
                "identifier",
                f"{line.item.identifier!r} is the identifier of an item of the dashboard's "
                f"crontab (line {line.number}); give the schedule another identifier",
            )
        schedule_params(**arguments)
    except JobSpecError as exc:
        raise _field_error(exc) from None
    return arguments


def _field_error(exc: JobSpecError) -> FieldError:
    return FieldError(_ARGUMENTS.get(exc.field, exc.field), exc.reason)


def _json_kind(value: object) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"


@cache
def zone_names() -> list[str]:
    """The zones the form suggests (the zone database's, sorted)."""
    return sorted(available_timezones())


def routes(dashboard: Site, crontab: Crontab | None, zone: ZoneInfo) -> list[Route]:
    """The schedules' actions; ``crontab``: the dashboard's (its identifiers
    are refused); ``zone``: the workers' ``--cron-timezone`` (the form says
    it is the zone of a schedule without one)."""
    actions = _ScheduleActions(dashboard, crontab, zone)
    return [
        Route("/crontab/schedules/new", actions.new, methods=["GET"]),
        Route("/crontab/schedules/edit", actions.edit, methods=["GET"]),
        Route("/crontab/schedules", actions.save, methods=["POST"]),
        Route("/crontab/schedules/pause", actions.pause, methods=["POST"]),
        Route("/crontab/schedules/resume", actions.resume, methods=["POST"]),
        Route("/crontab/schedules/remove", actions.confirm_remove, methods=["GET"]),
        Route("/crontab/schedules/remove", actions.remove, methods=["POST"]),
    ]


class _ScheduleActions:
    def __init__(self, dashboard: Site, crontab: Crontab | None, zone: ZoneInfo) -> None:
        self.dashboard = dashboard
        self.crontab = crontab
        self.zone = zone

    async def _form(self, request: Request, form: ScheduleForm) -> Response:
        """The add or change form (400 when it shows a refusal)."""
        async with self.dashboard.reading() as reader:
            tasks = await reader.task_identifiers()
            now = await reader.now()
        identifier = form.values.get("identifier", "")
        return self.dashboard.render(
            request,
            "schedule_form.html",
            status=400 if form.error else 200,
            title=f"Change schedule {identifier}" if form.replace else "Add a schedule",
            page="crontab",
            form=form,
            labels=LABELS,
            tasks=tasks,
            zones=zone_names(),
            default_zone=self.zone.key,
            payload_max=PAYLOAD_MAX,
            now=now,
        )

    def _no_such_schedule(self, request: Request, identifier: str) -> Response:
        return self.dashboard.render(
            request,
            "error.html",
            status=404,
            title="No such schedule",
            reason=f"no schedule in the database has the identifier {shown(identifier)}",
        )

    async def _stored(self, request: Request) -> Schedule | Response:
        """The schedule ``?schedule=`` names, or the response saying there is none."""
        if self.dashboard.read_only:
            return refused(self.dashboard, request, READ_ONLY)
        identifier = request.query_params.get("schedule", "")
        try:
            schedule = await (await self.dashboard.utils()).get_schedule(identifier)
        except JobSpecError:  # no schedule can have it
            schedule = None
        return self._no_such_schedule(request, identifier) if schedule is None else schedule

    async def new(self, request: Request) -> Response:
        if self.dashboard.read_only:
            return refused(self.dashboard, request, READ_ONLY)
        return await self._form(request, ScheduleForm())

    async def edit(self, request: Request) -> Response:
        schedule = await self._stored(request)
        if isinstance(schedule, Response):
            return schedule
        return await self._form(request, ScheduleForm.of(schedule))

    async def save(self, request: Request) -> Response:
        """Add the schedule (or replace it, from the change form); the form
        again with the refusal when a value is wrong, nothing written."""
        posted = await checked_form(self.dashboard, request, limit=MAX_SCHEDULE_FORM)
        if isinstance(posted, Response):
            return posted
        form = ScheduleForm.posted(posted)
        try:
            arguments = schedule_request(posted, self.crontab)
        except FieldError as exc:
            form.error = exc
            return await self._form(request, form)
        utils = await self.dashboard.utils()
        identifier = arguments["identifier"]
        if not form.replace and await utils.get_schedule(identifier) is not None:
            form.error = FieldError(
                "identifier",
                f"{identifier!r} is a schedule's already; change it from its Edit button, or "
                "give this one another identifier",
            )
            return await self._form(request, form)
        try:
            schedule = await utils.add_schedule(**arguments)
        except JobSpecError as exc:  # a crontab's identifier, seen by the database
            form.error = _field_error(exc)
            return await self._form(request, form)
        logger.info("Dashboard: saved schedule %s (version %d)", identifier, schedule.version)
        detail = (
            ", paused: it adds no job until it is resumed"
            if schedule.paused
            else ": Python workers fire it from its next run"
        )
        kind = "schedule-add" if schedule.version == 1 else "schedule-change"
        return redirect(self.dashboard, request, "/crontab", kind, name=identifier, detail=detail)

    async def _identifier(self, request: Request) -> tuple[str, Response | None]:
        """The POSTed form's schedule identifier, or the response refusing it."""
        form = await checked_form(self.dashboard, request)
        if isinstance(form, Response):
            return "", form
        identifier = form.get("schedule", "")
        try:
            check_schedule_identifier(identifier)
        except JobSpecError as exc:
            return identifier, redirect(
                self.dashboard, request, "/crontab", "bad-input", error=str(exc)
            )
        return identifier, None

    async def pause(self, request: Request) -> Response:
        return await self._set_paused(request, paused=True)

    async def resume(self, request: Request) -> Response:
        return await self._set_paused(request, paused=False)

    async def _set_paused(self, request: Request, *, paused: bool) -> Response:
        identifier, refusal = await self._identifier(request)
        if refusal is not None:
            return refusal
        utils = await self.dashboard.utils()
        change = utils.pause_schedule if paused else utils.resume_schedule
        if await change(identifier) is None:
            return redirect(self.dashboard, request, "/crontab", "schedule-gone", name=identifier)
        logger.info("Dashboard: %s schedule %s", "paused" if paused else "resumed", identifier)
        kind = "schedule-pause" if paused else "schedule-resume"
        return redirect(self.dashboard, request, "/crontab", kind, name=identifier)

    async def confirm_remove(self, request: Request) -> Response:
        schedule = await self._stored(request)
        if isinstance(schedule, Response):
            return schedule
        async with self.dashboard.reading() as reader:
            now = await reader.now()
        return self.dashboard.render(
            request,
            "confirm_schedule.html",
            title=f"Remove schedule {schedule.identifier}",
            page="crontab",
            schedule=schedule,
            zone=schedule.tz or self.zone.key,
            now=now,
        )

    async def remove(self, request: Request) -> Response:
        identifier, refusal = await self._identifier(request)
        if refusal is not None:
            return refusal
        if not await (await self.dashboard.utils()).remove_schedule(identifier):
            return redirect(self.dashboard, request, "/crontab", "schedule-gone", name=identifier)
        logger.info("Dashboard: removed schedule %s", identifier)
        return redirect(self.dashboard, request, "/crontab", "schedule-remove", name=identifier)
