"""The banner an action's redirect shows: what the action did, or that it was
refused and nothing changed.

Each notice is one of a fixed set of sentences (:data:`DONE`, :data:`REFUSED`),
filled with the job id, pool, finished state, or paused or limited queue or
task it is about (and what the limit allows), or the one line saying which
field of a form was refused and why (escaped like any value). A refusal is
shown as one: the page's banner gets the class ``notice-refused``
(``data-outcome="refused"``, ``role="alert"``), a success ``notice-done``
(``data-outcome="done"``).

The notice travels in a one-time flash cookie (:class:`Flash`), never in the
URL: the action's redirect sets it, signed with the dashboard's secret and
bound to the browser's CSRF nonce and to the page it redirects to; that page
shows it and clears it. A pasted, bookmarked or reloaded link shows no banner,
so no link can make the dashboard say that something happened.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..jobs.pause_spec import describe_target
from .filters import FINISHED_STATES
from .security import Csrf, route_path

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

__all__ = ["DONE", "REFUSED", "VALUES", "Flash", "Notice", "cookie_path", "notice_of"]

#: What an action did.
DONE = {
    "bulk": "{detail}.",  # a bulk action's summary (bulk_actions.py)
    "run-now": "Job {job} will run now.",
    "reschedule": "Job {job} was rescheduled.",
    "fail": "Job {job} was permanently failed.",
    "delete": "Job {job} was deleted (completed).",
    "cancel": "Job {job} was cancelled: it will not run. The history records it as cancelled.",
    "cancel-running": (
        "Job {job} is running: its worker was asked to stop it, and it will not be retried. "
        "It is recorded as cancelled when it stops (as succeeded if its task returns normally)."
    ),
    "unlock": "Released the jobs and named queues that pool {pool} held.",
    "pause": (
        "Paused {target}: Python workers start none of its jobs until it is resumed or the "
        "pause ends; running jobs finish."
    ),
    "resume": "Resumed {target}: its jobs run again.",
    "limit": "Limited {target}: {detail}. Every Python worker keeps to it from its next fetch.",
    "unlimit": "Removed the limit of {target}: its jobs start without it.",
    "workflow-cancel": (
        "Workflow {workflow} was cancelled: none of its steps will run any more. It ended {state}."
    ),
    "workflow-cancel-running": (
        "Workflow {workflow} was cancelled: none of its steps will start any more, and "
        "its workers were asked to stop its running steps. It ends when they stop."
    ),
    "workflow-retry": (
        "Workflow {workflow} runs again: {detail} (its failed and cancelled steps, and "
        "the steps after them) start as their parents end."
    ),
    # A schedule in the database (schedule_actions.py); detail: what it does now.
    "schedule-add": "Added schedule {name}{detail}.",
    "schedule-change": "Changed schedule {name}{detail}.",
    "schedule-pause": "Paused schedule {name}: it adds no job until it is resumed.",
    "schedule-resume": (
        "Resumed schedule {name}: it fires again from its next run (the paused time is "
        "not backfilled)."
    ),
    "schedule-remove": "Removed schedule {name}: it adds no more jobs (those it added stay).",
}

#: Why an action was refused: nothing was changed.
REFUSED = {
    "locked": (
        "Job {job} is locked by a worker that is running it: nothing was changed "
        "(the admin functions leave locked jobs alone until their lock is 4 hours old)."
    ),
    "gone": (
        "Job {job} is no longer in the jobs table (it finished, or was removed): "
        "nothing was changed."
    ),
    "finished": "Job {job} had already finished ({state}): nothing was changed.",
    "alive": "Pool {pool} has a live heartbeat: its jobs are running. Nothing was changed.",
    "not-paused": (
        "{target} was not paused (its pause had ended, or was resumed already): "
        "nothing was changed."
    ),
    "not-limited": "{target} had no limit (removed already?): nothing was changed.",
    "bad-input": "{error}. Nothing was changed.",
    "bulk-none": "No job matches ({detail}): nothing was changed.",
    "workflow-gone": (
        "Workflow {workflow} no longer exists (finished and pruned?): nothing was changed."
    ),
    "workflow-finished": "Workflow {workflow} had already finished ({state}): nothing was changed.",
    "workflow-nothing": (
        "Workflow {workflow} has no failed or cancelled step to run again: nothing was changed."
    ),
    "schedule-gone": "Schedule {name} does not exist (removed already?): nothing was changed.",
}

#: The values a notice is filled with (each shortened to Flash.MAX_VALUE).
VALUES = ("job", "pool", "state", "what", "name", "error", "detail", "workflow")


@dataclass(frozen=True)
class Notice:
    """A banner: its sentence, and whether it reports a refusal."""

    text: str
    refused: bool

    @property
    def outcome(self) -> str:
        """``refused`` or ``done`` (the banner's ``data-outcome``)."""
        return "refused" if self.refused else "done"


def notice_of(
    kind: str,
    *,
    job: str = "",
    pool: str = "",
    state: str = "",
    what: str = "",
    name: str = "",
    error: str = "",
    detail: str = "",
    workflow: str = "",
) -> Notice | None:
    """The notice ``kind`` names, filled in; None for a kind there is none of.
    ``what`` and ``name``: a pause's or a limit's kind (``queue``, ``task``)
    and name (``name`` alone: a schedule's identifier); ``error``: the line
    saying which field was refused;
    ``detail``: what a limit allows; ``workflow``: a workflow's id."""
    refused = kind in REFUSED
    template = REFUSED.get(kind) or DONE.get(kind)
    if template is None:
        return None
    state = state if state in (*FINISHED_STATES, "unknown") else "unknown"
    target = describe_target(what, name) if what in ("queue", "task") else "?"
    text = template.format(
        job=job,
        pool=pool,
        state=state,
        name=name,
        target=target,
        error=error,
        detail=detail,
        workflow=workflow,
    )
    return Notice(text[:1].upper() + text[1:], refused)


def cookie_path(request: Request) -> str:
    """The path of the dashboard's cookies: where it is mounted, else ``/``."""
    root: str = request.scope.get("root_path", "")
    return root.rstrip("/") or "/"


class Flash:
    """The one-time notice cookie: ``DATA.SIGNATURE``, DATA the notice's kind,
    values, page and expiry (base64url JSON), SIGNATURE an HMAC under the
    dashboard's CSRF secret of the browser's CSRF nonce and DATA."""

    COOKIE = "graphile_worker_dashboard_notice"
    #: Seconds a notice waits for its page (the redirect follows at once).
    LIFETIME = 60
    #: The longest value (a pool's name, a queue's, an error) repeated in a notice.
    MAX_VALUE = 200

    def __init__(self, csrf: Csrf) -> None:
        self.csrf = csrf

    def set(
        self, response: Response, request: Request, path: str, kind: str, **values: str
    ) -> None:
        """Have the page at ``path`` (inside the dashboard) show ``kind``'s notice."""
        for name, text in values.items():
            if len(text) > self.MAX_VALUE:
                values[name] = text[: self.MAX_VALUE] + "…"
        content = {"kind": kind, "path": path, "until": time.time() + self.LIFETIME, **values}
        data = base64.urlsafe_b64encode(json.dumps(content).encode()).decode().rstrip("=")
        response.set_cookie(
            self.COOKIE,
            f"{data}.{self.csrf.sign('notice', self._message(request, data))}",
            max_age=self.LIFETIME,
            path=cookie_path(request),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )

    def clear(self, request: Request, response: Response) -> None:
        """Clear the cookie from the browser (once its page has shown it)."""
        response.delete_cookie(
            self.COOKIE,
            path=cookie_path(request),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )

    def read(self, request: Request) -> tuple[Notice | None, bool]:
        """The notice this page is to show, if any, and whether to clear the
        cookie: shown, or not one of this dashboard's for this browser, or
        expired (one for another page is left for it)."""
        cookie = request.cookies.get(self.COOKIE)
        if cookie is None or request.method != "GET":
            return None, False
        data, _, signature = cookie.rpartition(".")
        if not self.csrf.signed("notice", self._message(request, data), signature):
            return None, True
        try:
            content = json.loads(base64.urlsafe_b64decode(data + "=" * (-len(data) % 4)))
        except (binascii.Error, ValueError):
            return None, True
        until = content.get("until") if isinstance(content, dict) else None
        if not isinstance(until, int | float) or until <= time.time():
            return None, True
        if content.get("path") != route_path(request.scope):
            return None, False
        values = {name: str(content.get(name, "")) for name in VALUES}
        return notice_of(str(content.get("kind", "")), **values), True

    @staticmethod
    def _message(request: Request, data: str) -> str:
        """What is signed: the browser's CSRF nonce (another browser's cookie
        is of no use) and the notice."""
        return f"{request.cookies.get(Csrf.COOKIE, '')}.{data}"
