"""The actions: run now, reschedule, permanently fail, delete (complete),
cancel, and unlock a dead pool's jobs (pausing and resuming: :mod:`.pause_actions`).

Each is two steps: a GET shows what will happen and asks to confirm (it
changes nothing), and the confirmation is a POST carrying the CSRF token.
Each goes through the same admin functions as the SQL API
(:class:`worker_cli.WorkerUtils`: ``reschedule_jobs``,
``permanently_fail_jobs``, ``complete_jobs``, ``force_unlock_workers``), so a
locked job is left alone exactly as those functions leave it; cancel is
``cancel_job`` (a running job is asked to stop). ``--read-only``
hides the actions and refuses them (403). A POST redirects (303) to the page
it came from, which shows a notice saying what happened, or that it was
refused and nothing changed (a one-time flash cookie: :mod:`.notices`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from ..client.admin_batches import Outcome, Session
from ..errors import JobSpecError
from ..sql import admin as admin_sql
from ..sql import compose
from .inputs import SMALLINT, BadInput, checked_text, parse_int, parse_job_id, parse_run_at
from .security import Csrf, foreign_post

if TYPE_CHECKING:
    from .site import Site

__all__ = ["ACTIONS", "READ_ONLY", "checked_form", "read_form", "redirect", "refused", "routes"]

logger = logging.getLogger("graphile_worker.dashboard")

#: The job actions: path segment -> button label.
ACTIONS = {
    "run-now": "Run now",
    "reschedule": "Reschedule",
    "fail": "Permanently fail",
    "delete": "Delete",
    "cancel": "Cancel",
}

DEFAULT_FAIL_REASON = "permanently failed from the dashboard"

#: The largest form body accepted (the forms hold a few short fields).
MAX_FORM = 16 * 1024


def routes(dashboard: Site) -> list[Route]:
    actions = _Actions(dashboard)
    return [
        Route("/jobs/{job_id}/{action}", actions.confirm_job, methods=["GET"]),
        Route("/jobs/{job_id}/{action}", actions.job_action, methods=["POST"]),
        Route("/pools/unlock", actions.confirm_unlock, methods=["GET"]),
        Route("/pools/unlock", actions.unlock, methods=["POST"]),
    ]


async def read_form(request: Request, limit: int = MAX_FORM) -> dict[str, str] | None:
    """An urlencoded form's fields (the last value of each), or None if the
    body is not one or is longer than ``limit`` bytes."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        return None
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    try:
        fields = parse_qs(body.decode(), keep_blank_values=True, max_num_fields=20)
    except (UnicodeDecodeError, ValueError):
        return None
    return {name: values[-1] for name, values in fields.items()}


#: Why an action is refused by a ``--read-only`` dashboard.
READ_ONLY = "the dashboard is read-only: actions are turned off"


def refused(dashboard: Site, request: Request, reason: str) -> Response:
    """The 403 of an action the dashboard will not take."""
    return dashboard.render(request, "error.html", status=403, title="Refused", reason=reason)


async def checked_form(
    dashboard: Site, request: Request, *, limit: int = MAX_FORM
) -> dict[str, str] | Response:
    """An action's POSTed form, or the response refusing it (read-only, from
    another site, not a form or longer than ``limit`` bytes, CSRF token
    missing or wrong)."""
    if dashboard.read_only:
        return refused(dashboard, request, READ_ONLY)
    foreign = foreign_post(request.headers, dashboard.hosts)
    if foreign is not None:
        return refused(dashboard, request, foreign)
    form = await read_form(request, limit)
    if form is None:
        return refused(dashboard, request, "the request is not one of the dashboard's forms")
    if not dashboard.csrf.valid(request.cookies.get(Csrf.COOKIE), form.get(Csrf.FIELD)):
        return refused(
            dashboard,
            request,
            "the form's security token is missing or does not match: reload the page and try again",
        )
    return form


def redirect(
    dashboard: Site, request: Request, path: str, notice: str, **values: object
) -> Response:
    """A 303 to ``path``, which shows ``notice`` (in a one-time flash
    cookie: a link can carry no notice)."""
    response = RedirectResponse(dashboard.url(request, path), status_code=303)
    texts = {name: str(value) for name, value in values.items()}
    dashboard.flash.set(response, request, path, notice, **texts)
    return response


class _Actions:
    def __init__(self, dashboard: Site) -> None:
        self.dashboard = dashboard

    def _refused(self, request: Request, reason: str) -> Response:
        return refused(self.dashboard, request, reason)

    async def _checked_form(self, request: Request) -> dict[str, str] | Response:
        return await checked_form(self.dashboard, request)

    # --- jobs -------------------------------------------------------------------

    async def confirm_job(self, request: Request, *, error: str | None = None) -> Response:
        job_text, action = request.path_params["job_id"], request.path_params["action"]
        if action not in ACTIONS:
            return self.dashboard.render(
                request, "error.html", status=404, title="Not found", reason="no such action"
            )
        job_id = parse_job_id(job_text)
        if job_id is None:
            return self.dashboard.no_such_job(request, job_text)
        if self.dashboard.read_only:
            return self._refused(request, READ_ONLY)
        async with self.dashboard.reading() as reader:
            job = await reader.job(job_id)
            now = await reader.now()
        if job is None:
            return self._redirect(request, f"/jobs/{job_id}", "gone", job=job_id)
        return self.dashboard.render(
            request,
            "confirm_job.html",
            status=400 if error else 200,
            title=f"{ACTIONS[action]}: job {job_id}",
            page="jobs",
            job=job,
            action=action,
            label=ACTIONS[action],
            error=error,
            now=now,
            default_reason=DEFAULT_FAIL_REASON,
        )

    async def job_action(self, request: Request) -> Response:
        job_text, action = request.path_params["job_id"], request.path_params["action"]
        if action not in ACTIONS:
            return self.dashboard.render(
                request, "error.html", status=404, title="Not found", reason="no such action"
            )
        job_id = parse_job_id(job_text)
        if job_id is None:
            return self.dashboard.no_such_job(request, job_text)
        form = await self._checked_form(request)
        if isinstance(form, Response):
            return form
        if action == "cancel":
            return await self._cancel(request, job_id, form)
        if action == "fail":
            return await self._fail(request, job_id, form)
        try:
            changed = await self._apply(job_id, action, form)
        except (BadInput, JobSpecError) as exc:  # what the utilities refuse is bad input too
            return await self.confirm_job(request, error=str(exc))
        if changed:
            logger.info("Dashboard: %s job %d", action, job_id)
            if action == "delete":
                return self._redirect(request, "/jobs", action, job=job_id)
            return self._redirect(request, f"/jobs/{job_id}", action, job=job_id)
        async with self.dashboard.reading() as reader:
            job = await reader.job(job_id)
        why = "gone" if job is None else "locked"
        return self._redirect(
            request, "/jobs" if job is None else f"/jobs/{job_id}", why, job=job_id
        )

    async def _cancel(self, request: Request, job_id: int, form: dict[str, str]) -> Response:
        """``cancel_job``, and a notice of what it did: cancelled (a job that
        was waiting, scheduled, retrying or failed), asked the running job to
        stop, or nothing (it had finished already)."""
        try:
            reason = checked_text(form.get("reason", ""), "reason").strip() or None
        except BadInput as exc:
            return await self.confirm_job(request, error=str(exc))
        async with self.dashboard.reading() as reader:
            live = await reader.job(job_id) is not None
        state = await (await self.dashboard.utils()).cancel_job(job_id, reason)
        if state == "running":
            why = "cancel-running"
        elif state == "cancelled" and live:
            why = "cancel"
        else:
            why = "finished"
        logger.info("Dashboard: cancel job %d: %s", job_id, state)
        return self._redirect(request, f"/jobs/{job_id}", why, job=job_id, state=state)

    async def _fail(self, request: Request, job_id: int, form: dict[str, str]) -> Response:
        """Permanently fail the job with ``graphile-worker fail``'s statement
        (through ``permanently_fail_jobs``), which keeps its real error: its
        last error becomes ``REASON (was: ERROR)``, the reason alone if it
        never failed. A job already failed for good is left as it is (its
        error is not wrapped again), and a locked one alone."""
        try:
            reason = checked_text(form.get("reason", ""), "reason").strip() or DEFAULT_FAIL_REASON
        except BadInput as exc:
            return await self.confirm_job(request, error=str(exc))
        utils = await self.dashboard.utils()
        async with utils.connection() as conn:
            cursor = await conn.execute(
                compose(admin_sql.ACTIONS["fail"], utils.schema),
                {"ids": [job_id], "reason": reason},
            )
            [(_, outcome)] = await cursor.fetchall()
        if outcome == "changed":
            logger.info("Dashboard: fail job %d", job_id)
            return self._redirect(request, f"/jobs/{job_id}", "fail", job=job_id)
        if outcome == "missing":
            return self._redirect(request, "/jobs", "gone", job=job_id)
        if outcome == "locked":
            return self._redirect(request, f"/jobs/{job_id}", "locked", job=job_id)
        already = f"job {job_id} was already permanently failed: its last error is kept as it is"
        return self._redirect(request, f"/jobs/{job_id}", "bad-input", error=already)

    async def _apply(self, job_id: int, action: str, form: dict[str, str]) -> bool:
        """Run the action through WorkerUtils; whether it changed the job."""
        utils = await self.dashboard.utils()
        if action == "delete":  # graphile-worker remove's statement: recorded as removed
            async with utils.connection() as conn:
                session = Session(conn, utils.schema, by="dashboard")
                outcome = Outcome("remove")
                await session.act(outcome, await session.action("remove"), [job_id])
            return bool(outcome.changed)
        if action == "reschedule":
            run_at = parse_run_at(form.get("run_at", ""))
            priority = parse_int(form.get("priority", ""), "priority", -SMALLINT - 1)
            max_attempts = parse_int(form.get("max_attempts", ""), "max attempts", 1)
            return bool(
                await utils.reschedule_jobs(
                    [job_id], run_at=run_at, priority=priority, max_attempts=max_attempts
                )
            )
        # run-now: due now, by the database's clock; a job without attempts
        # left gets one more (its attempts so far are kept).
        async with self.dashboard.reading() as reader:
            job = await reader.job(job_id)
            now = await reader.now()
        if job is None:
            return False
        more: dict[str, Any] = {}
        if job["attempts"] >= job["max_attempts"]:
            more["max_attempts"] = min(job["attempts"] + 1, SMALLINT)
        return bool(await utils.reschedule_jobs([job_id], run_at=now, **more))

    def _redirect(self, request: Request, path: str, notice: str, **values: object) -> Response:
        return redirect(self.dashboard, request, path, notice, **values)

    # --- pools ------------------------------------------------------------------

    async def confirm_unlock(self, request: Request) -> Response:
        pool_id = request.query_params.get("pool", "")
        if self.dashboard.read_only:
            return self._refused(request, READ_ONLY)
        if not pool_id:
            return self.dashboard.render(
                request, "error.html", status=400, title="No pool", reason="no pool named"
            )
        try:
            checked_text(pool_id, "pool")
        except BadInput as exc:
            return self.dashboard.bad_input(request, exc)
        async with self.dashboard.reading() as reader:
            beat = await reader.pool_alive(pool_id)
        return self.dashboard.render(
            request,
            "confirm_unlock.html",
            title=f"Unlock the jobs of {pool_id}",
            page="pools",
            pool_id=pool_id,
            beat=beat,
        )

    async def unlock(self, request: Request) -> Response:
        form = await self._checked_form(request)
        if isinstance(form, Response):
            return form
        pool_id = form.get("pool", "")
        if not pool_id:
            return self.dashboard.render(
                request, "error.html", status=400, title="No pool", reason="no pool named"
            )
        try:
            checked_text(pool_id, "pool")
        except BadInput as exc:
            return self.dashboard.bad_input(request, exc)
        async with self.dashboard.reading() as reader:
            beat = await reader.pool_alive(pool_id)
        if beat is not None and beat["alive"]:
            return self._redirect(request, "/pools", "alive", pool=pool_id)
        await (await self.dashboard.utils()).force_unlock_workers([pool_id])
        logger.info("Dashboard: unlocked the jobs of pool %s", pool_id)
        return self._redirect(request, "/pools", "unlock", pool=pool_id)
