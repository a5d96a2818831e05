"""The bulk actions of the Jobs page: retry, reschedule, permanently fail or
delete every job matching the list's filter (task, named queue, state).

As the single-job actions (:mod:`.actions`), each is two steps: a GET
(``/bulk/<action>?task=...&queue=...&state=...``) counts the matching jobs,
and those a worker holds (they will be skipped), and asks to confirm; the
confirmation is a POST carrying the CSRF token, the filter and the highest id
counted (a job added after the count is never touched). Refused (403) in
``--read-only``, and refused (400) without any filter: never every job.

The work is the command line's (``graphile-worker retry --task ...``):
:class:`worker_cli.client.admin_batches.Session` walks the matches by id,
:data:`~worker_cli.client.admin_batches.BATCH` ids a statement, each a
transaction of its own on an autocommit connection, through graphile-worker's
admin functions (``reschedule_jobs``, ``permanently_fail_jobs``,
``complete_jobs``), so a locked job is left alone; ``fail`` keeps the last
error (``<reason> (was: <last error>)``). The POST redirects (303) to the
filtered Jobs page, whose one-time notice says what was done.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from ..client.admin_batches import BATCH, Filters, Outcome, Session
from ..jobs.job_state import STATE_ALIASES
from ..jobs.last_error import storable
from .actions import READ_ONLY, checked_form, refused
from .filters import JOB_STATES
from .inputs import BIGINT, BadInput, checked_text, parse_int, shown

if TYPE_CHECKING:
    from starlette.datastructures import ImmutableMultiDict

    from .site import Site

__all__ = ["BULK_ACTIONS", "routes"]

logger = logging.getLogger("graphile_worker.dashboard")

#: The bulk actions: path segment -> (button label, the CLI's action, done, why unchanged).
BULK_ACTIONS: dict[str, tuple[str, str, str, str]] = {
    "retry": ("Retry all", "retry", "Retried", "changed meanwhile"),
    "reschedule": ("Reschedule all", "reschedule", "Rescheduled", "changed meanwhile"),
    "fail": ("Permanently fail all", "fail", "Permanently failed", "already failed for good"),
    "delete": ("Delete all", "remove", "Deleted", "changed meanwhile"),
}
DEFAULT_FAIL_REASON = "permanently failed from the dashboard"
#: ``reschedule``: the latest run_at, in minutes from now (366 days).
MAX_DELAY_MINUTES = 366 * 24 * 60


def routes(dashboard: Site) -> list[Route]:
    bulk = _Bulk(dashboard)
    return [
        Route("/bulk/{action}", bulk.confirm, methods=["GET"]),
        Route("/bulk/{action}", bulk.act, methods=["POST"]),
    ]


def filters_of(values: ImmutableMultiDict[str, str] | dict[str, str]) -> Filters:
    """The filter of a bulk action (the Jobs page's ``task``, ``queue``,
    ``state``); a wrong value is refused (BadInput), never left out (that would
    widen the action), and so is no filter at all."""
    task = checked_text(values.get("task") or "", "task") or None
    queue = checked_text(values.get("queue") or "", "queue") or None
    state = values.get("state") or None
    state = STATE_ALIASES.get(state, state) if state else None  # an earlier version's link
    if state is not None and state not in JOB_STATES:
        raise BadInput(f"unknown state {shown(state)}")
    if task is None and queue is None and state is None:
        raise BadInput(
            "a bulk action needs a filter (task, queue or state): refusing to act on every job"
        )
    return Filters(task=task, queue=queue, state=state)


def filter_query(filters: Filters) -> dict[str, str]:
    """The Jobs page's query string of ``filters``."""
    values = {"task": filters.task, "queue": filters.queue, "state": filters.state}
    return {name: value for name, value in values.items() if value is not None}


def jobs(count: int) -> str:
    return f"{count:,} job" + ("" if count == 1 else "s")


def describe(outcome: Outcome, filters: Filters, done: str, unchanged: str) -> str:
    """What a bulk action did, in one sentence (the notice)."""
    text = f"{done} {jobs(len(outcome.changed))} ({filters.describe()})"
    if outcome.locked:
        text += f"; skipped {jobs(len(outcome.locked))} locked by a worker"
    if outcome.unchanged:
        text += f"; left {jobs(len(outcome.unchanged))} as they were ({unchanged})"
    if outcome.missing:
        text += f"; {jobs(len(outcome.missing))} gone meanwhile"
    return text


class _Bulk:
    def __init__(self, dashboard: Site) -> None:
        self.dashboard = dashboard

    def _error(self, request: Request, status: int, title: str, reason: str) -> Response:
        return self.dashboard.render(
            request, "error.html", status=status, title=title, reason=reason
        )

    async def confirm(self, request: Request, *, error: str | None = None) -> Response:
        action = request.path_params["action"]
        if action not in BULK_ACTIONS:
            return self._error(request, 404, "Not found", "no such bulk action")
        if self.dashboard.read_only:
            return refused(self.dashboard, request, READ_ONLY)
        try:
            filters = filters_of(request.query_params)
        except BadInput as exc:
            return self.dashboard.bad_input(request, exc)
        async with self.dashboard.reading() as reader:
            matches = await Session(reader.conn, reader.schema).matches(filters)
            now = await reader.now()
        label = BULK_ACTIONS[action][0]
        return self.dashboard.render(
            request,
            "confirm_bulk.html",
            status=400 if error else 200,
            title=f"{label}: {filters.describe()}",
            page="jobs",
            action=action,
            label=label,
            filters=filters,
            query=filter_query(filters),
            matches=matches,
            batch=BATCH,
            batches=-(-matches.count // BATCH),
            error=error,
            now=now,
            default_reason=DEFAULT_FAIL_REASON,
            max_delay=MAX_DELAY_MINUTES,
        )

    async def act(self, request: Request) -> Response:
        action = request.path_params["action"]
        if action not in BULK_ACTIONS:
            return self._error(request, 404, "Not found", "no such bulk action")
        form = await checked_form(self.dashboard, request)
        if isinstance(form, Response):
            return form
        try:
            filters = filters_of(form)
            upto = parse_int(form.get("upto", ""), "highest id", 0, BIGINT)
            params = _params(action, form)
        except BadInput as exc:
            return self.dashboard.bad_input(request, exc)
        if upto is None:
            return self.dashboard.bad_input(request, BadInput("the highest id counted is missing"))
        _, name, done, unchanged = BULK_ACTIONS[action]
        outcome = Outcome(name)
        utils = await self.dashboard.utils()
        async with utils.connection() as conn:
            session = Session(conn, utils.schema, by="dashboard")
            matches = await session.matches(filters)
            if matches.count:
                statement = await session.action(name)
                await session.act_on_matches(outcome, statement, filters, upto, **params)
        logger.info(
            "Dashboard: bulk %s (%s): %d changed, %d locked, %d unchanged",
            action,
            filters.describe(),
            len(outcome.changed),
            len(outcome.locked),
            len(outcome.unchanged),
        )
        if not (outcome.changed or outcome.locked or outcome.unchanged or outcome.missing):
            return self._back(request, filters, "bulk-none", filters.describe())
        return self._back(request, filters, "bulk", describe(outcome, filters, done, unchanged))

    def _back(self, request: Request, filters: Filters, kind: str, detail: str) -> Response:
        """A 303 to the filtered Jobs page, which shows the notice."""
        response = RedirectResponse(
            self.dashboard.url(request, "/jobs", filter_query(filters)), status_code=303
        )
        self.dashboard.flash.set(response, request, "/jobs", kind, detail=detail)
        return response


def _params(action: str, form: dict[str, str]) -> dict[str, Any]:
    """The action statement's parameters from the confirmation's form."""
    if action == "fail":
        reason = checked_text(form.get("reason", ""), "reason").strip() or DEFAULT_FAIL_REASON
        return {"reason": storable(reason)}
    if action == "reschedule":
        minutes = parse_int(form.get("minutes", ""), "minutes from now", 0, MAX_DELAY_MINUTES)
        return {
            "run_at": None,
            "delay": timedelta(minutes=minutes or 0),
            "priority": None,
            "attempts": None,
            "max_attempts": None,
        }
    return {}
