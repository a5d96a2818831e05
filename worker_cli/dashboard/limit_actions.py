"""The limit actions: set (or change) the limit of a task or a named queue,
and remove it, from the overview's Limits panel.

As the pause actions (:mod:`.pause_actions`), each is a POST carrying the
CSRF token, refused (403) when the dashboard is read-only, that redirects
(303) to the overview with a one-time notice (:mod:`.notices`): what was
done, or that it was refused and nothing changed, with the one line naming
the field that was wrong. The form, filled in, is the confirmation; setting
the limit of a task or queue that has one replaces it.

Both go through :class:`worker_cli.WorkerUtils` (``set_limit``,
``remove_limit``): the same checks (:class:`worker_cli.jobs.limit_spec.Limit`,
:func:`worker_cli.jobs.limit_spec.limit_params`) and the same SQL as the API and
the command line; the window (``1s``, ``10m``) is read as ``pause --for``
reads a length (:func:`worker_cli.jobs.pause_spec.parse_length`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import JobSpecError, LimitsBusyError
from ..jobs.limit_spec import MAX_PERIOD, MAX_RUNNING, MAX_STARTS, Limit, LimitInfo, limit_params
from ..jobs.pause_spec import parse_length
from .actions import checked_form, redirect
from .formatting import length
from .inputs import BadInput, checked_text, form_target, parse_int, shown

if TYPE_CHECKING:
    from .site import Site

__all__ = ["describe_limit", "limit_request", "routes"]

logger = logging.getLogger("graphile_worker.dashboard")

#: What the messages call the utilities' arguments (the form's labels).
_LABELS = {
    "queue": "name",
    "task": "name",
    "max_running": "max running",
    "max_starts": "max starts",
    "per": "per",
    "partition_by": "partition field",
}


def routes(dashboard: Site) -> list[Route]:
    actions = _LimitActions(dashboard)
    return [
        Route("/limits", actions.set_limit, methods=["POST"]),
        Route("/limits/remove", actions.remove, methods=["POST"]),
    ]


def _target(form: dict[str, str]) -> tuple[str, str]:
    """The form's kind (``queue`` or ``task``) and name, checked."""
    kind, name = form_target(form, missing="give a queue's name or a task identifier")
    if name == "*":
        raise BadInput("name: a limit names one task or queue, not '*'")
    return kind, name


def limit_request(form: dict[str, str]) -> dict[str, Any]:
    """The arguments of ``WorkerUtils.set_limit`` from the limit form,
    checked as the utilities check them; BadInput naming the field that is
    wrong."""
    kind, name = _target(form)
    max_running = parse_int(form.get("max_running", ""), "max running", 1, MAX_RUNNING)
    max_starts = parse_int(form.get("max_starts", ""), "max starts", 1, MAX_STARTS)
    per_text = form.get("per", "").strip()
    per = None
    if per_text:
        try:
            per = parse_length(per_text, what="a window", longest=MAX_PERIOD)
        except ValueError as exc:
            raise BadInput(f"per: {exc}") from None
    if max_starts is not None and per is None:
        raise BadInput(f"per: give the window of the {max_starts} starts (1s, 10m, 1h)")
    if per is not None and max_starts is None:
        raise BadInput(f"max starts: give how many jobs may start per {length(per)}")
    if max_running is None and max_starts is None:
        raise BadInput("max running: give a max running, a max starts with its per, or both")
    field = checked_text(form.get("partition_by", ""), "partition field").strip() or None
    if field is not None and len(field) > 128:
        raise BadInput(f"partition field: {shown(field)} is longer than 128 characters")
    try:
        limit = Limit(max_running, max_starts, per, field)
        queue, task = (name, None) if kind == "queue" else (None, name)
        limit_params(limit, queue, task, None)
    except JobSpecError as exc:
        raise BadInput(f"{_LABELS.get(exc.field, exc.field)}: {exc.reason}") from None
    return {"limit": limit, "queue": queue, "task": task}


def describe_limit(limit: Limit) -> str:
    """``at most 3 running, at most 50 starts per 1s, per value of account_id``."""
    parts = []
    if limit.max_running is not None:
        parts.append(f"at most {limit.max_running:,} running")
    if limit.max_starts is not None:
        parts.append(f"at most {limit.max_starts:,} starts per {length(limit.period)}")
    if limit.partition_by is not None:
        parts.append(f"per value of {limit.partition_by}")
    return ", ".join(parts)


class _LimitActions:
    def __init__(self, dashboard: Site) -> None:
        self.dashboard = dashboard

    async def set_limit(self, request: Request) -> Response:
        form = await checked_form(self.dashboard, request)
        if isinstance(form, Response):
            return form
        try:
            arguments = limit_request(form)
        except BadInput as exc:
            return redirect(self.dashboard, request, "/", "bad-input", error=str(exc))
        try:
            info: LimitInfo = await (await self.dashboard.utils()).set_limit(**arguments)
        except LimitsBusyError as exc:  # nothing was changed: the form says why
            return redirect(self.dashboard, request, "/", "bad-input", error=str(exc))
        logger.info("Dashboard: limited %s %s", info.kind, info.name)
        detail = describe_limit(info.limit)
        return redirect(
            self.dashboard, request, "/", "limit", what=info.kind, name=info.name, detail=detail
        )

    async def remove(self, request: Request) -> Response:
        form = await checked_form(self.dashboard, request)
        if isinstance(form, Response):
            return form
        try:
            kind, name = _target(form)
        except BadInput as exc:
            return redirect(self.dashboard, request, "/", "bad-input", error=str(exc))
        if not await (await self.dashboard.utils()).remove_limit(**{kind: name}):
            return redirect(self.dashboard, request, "/", "not-limited", what=kind, name=name)
        logger.info("Dashboard: removed the limit of %s %s", kind, name)
        return redirect(self.dashboard, request, "/", "unlimit", what=kind, name=name)
