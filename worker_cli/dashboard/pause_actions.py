"""The pause actions: pause a named queue or a task, and resume it, from the
overview's Pauses panel.

As the other actions (:mod:`.actions`), each is a POST carrying the CSRF
token, refused (403) when the dashboard is read-only, that redirects (303)
to the overview with a one-time notice (:mod:`.notices`): what was done, or
that it was refused and nothing changed, with the one line naming the field
that was wrong. Unlike the job actions there is no confirmation page: the
form, filled in, is the confirmation, and a pause is undone with one click.

Both go through :class:`worker_cli.WorkerUtils` (``pause``, ``resume``):
the same checks (:func:`worker_cli.jobs.pause_spec.pause_params`) and the same
SQL as the API and the command line; the length (``10m``, ``2h``) is read
as ``pause --for`` reads it (:func:`worker_cli.jobs.pause_spec.parse_length`).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import JobSpecError
from ..jobs.pause_spec import parse_length, pause_params
from .actions import checked_form, redirect
from .inputs import BadInput, checked_text, form_target, parse_time, shown

if TYPE_CHECKING:
    from .site import Site

__all__ = ["MAX_REASON", "pause_request", "routes"]

logger = logging.getLogger("graphile_worker.dashboard")

#: The longest reason the form takes (the job actions' reasons are as long).
MAX_REASON = 1000

#: What the messages call the utilities' arguments (the form's labels).
_LABELS = {
    "queue": "name",
    "task": "name",
    "until": "until",
    "reason": "reason",
    "hold_queue_lock": "hold off Node workers",
}


def routes(dashboard: Site) -> list[Route]:
    actions = _PauseActions(dashboard)
    return [
        Route("/pauses", actions.pause, methods=["POST"]),
        Route("/pauses/resume", actions.resume, methods=["POST"]),
    ]


def _target(form: dict[str, str]) -> tuple[str, str]:
    """The form's kind (``queue`` or ``task``) and name, checked."""
    return form_target(form, missing="give a queue's name or a task identifier (* for every one)")


def pause_request(form: dict[str, str], now: datetime) -> dict[str, Any]:
    """The arguments of ``WorkerUtils.pause`` from the pause form, checked as
    the utilities check them; BadInput naming the field that is wrong.
    ``now``: the database's clock (an ``until`` must lie ahead of it)."""
    kind, name = _target(form)
    length_text = form.get("for", "").strip()
    until_text = form.get("until", "").strip()
    until: datetime | timedelta | None = None
    if length_text and until_text:
        raise BadInput("for: give a length or an until time, not both")
    if length_text:
        try:
            until = parse_length(length_text)
        except ValueError as exc:
            raise BadInput(f"for: {exc}") from None
    elif until_text:
        until = parse_time(until_text, "until")
        if until <= now:
            raise BadInput(f"until: {shown(until_text)} (UTC) has passed already")
    reason = checked_text(form.get("reason", ""), "reason").strip() or None
    if reason is not None and len(reason) > MAX_REASON:
        raise BadInput(f"reason: {len(reason):,} characters; at most {MAX_REASON:,}")
    hold = bool(form.get("hold_queue_lock"))
    queue, task = (name, None) if kind == "queue" else (None, name)
    try:
        pause_params(queue, task, until, reason, hold)
    except JobSpecError as exc:
        raise BadInput(f"{_LABELS.get(exc.field, exc.field)}: {exc.reason}") from None
    return {"queue": queue, "task": task, "until": until, "reason": reason, "hold_queue_lock": hold}


class _PauseActions:
    def __init__(self, dashboard: Site) -> None:
        self.dashboard = dashboard

    async def pause(self, request: Request) -> Response:
        form = await checked_form(self.dashboard, request)
        if isinstance(form, Response):
            return form
        async with self.dashboard.reading() as reader:
            now = await reader.now()
        try:
            arguments = pause_request(form, now)
        except BadInput as exc:
            return redirect(self.dashboard, request, "/", "bad-input", error=str(exc))
        paused = await (await self.dashboard.utils()).pause(**arguments)
        logger.info("Dashboard: paused %s %s", paused.kind, paused.name)
        return redirect(self.dashboard, request, "/", "pause", what=paused.kind, name=paused.name)

    async def resume(self, request: Request) -> Response:
        form = await checked_form(self.dashboard, request)
        if isinstance(form, Response):
            return form
        try:
            kind, name = _target(form)
        except BadInput as exc:
            return redirect(self.dashboard, request, "/", "bad-input", error=str(exc))
        if not await (await self.dashboard.utils()).resume(**{kind: name}):
            return redirect(self.dashboard, request, "/", "not-paused", what=kind, name=name)
        logger.info("Dashboard: resumed %s %s", kind, name)
        return redirect(self.dashboard, request, "/", "resume", what=kind, name=name)
