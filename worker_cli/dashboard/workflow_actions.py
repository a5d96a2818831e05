"""A workflow's actions: cancel it, retry it. As the job actions
(:mod:`.actions`): a GET shows what will happen and asks to confirm (it
changes nothing), the confirmation is a POST carrying the CSRF token,
``--read-only`` refuses both (403), and the POST redirects (303) to the
workflow's page, which shows a notice of what happened.

They go through the utilities, as ``graphile-worker workflow --cancel`` and
``--retry`` do: ``cancel_workflow`` (``py_cancel_workflow``: no step of it
starts any more, its waiting steps are cancelled, its running ones asked to
stop) and ``retry_workflow`` (``py_retry_workflow``: its failed and
cancelled steps run again, and every step after them).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import JobSpecError
from ..sql import dashboard_workflows as workflows_sql
from .actions import READ_ONLY, checked_form, redirect, refused
from .inputs import BadInput, checked_text, parse_job_id
from .workflow_pages import TEXT_CUT, no_such_workflow

if TYPE_CHECKING:
    from .site import Site

__all__ = ["WORKFLOW_ACTIONS", "routes"]

logger = logging.getLogger("graphile_worker.dashboard")

#: The workflow actions: path segment -> button label.
WORKFLOW_ACTIONS = {"cancel": "Cancel workflow", "retry": "Retry workflow"}


def routes(dashboard: Site) -> list[Route]:
    actions = _WorkflowActions(dashboard)
    return [
        Route("/workflows/{workflow_id}/{action}", actions.confirm, methods=["GET"]),
        Route("/workflows/{workflow_id}/{action}", actions.act, methods=["POST"]),
    ]


class _WorkflowActions:
    def __init__(self, dashboard: Site) -> None:
        self.dashboard = dashboard

    def _not_found(self, request: Request) -> Response:
        return self.dashboard.render(
            request, "error.html", status=404, title="Not found", reason="no such action"
        )

    async def confirm(self, request: Request, *, error: str | None = None) -> Response:
        text, action = request.path_params["workflow_id"], request.path_params["action"]
        if action not in WORKFLOW_ACTIONS:
            return self._not_found(request)
        workflow_id = parse_job_id(text)
        if workflow_id is None:
            return no_such_workflow(self.dashboard, request, text)
        if self.dashboard.read_only:
            return refused(self.dashboard, request, READ_ONLY)
        async with self.dashboard.reading() as reader:
            wf = await reader.row(workflows_sql.WORKFLOW, id=workflow_id, cut=TEXT_CUT)
            now = await reader.now()
        if wf is None:
            return no_such_workflow(self.dashboard, request, text)
        return self.dashboard.render(
            request,
            "confirm_workflow.html",
            status=400 if error else 200,
            title=f"{WORKFLOW_ACTIONS[action]}: workflow {workflow_id}",
            page="workflows",
            wf=wf,
            action=action,
            label=WORKFLOW_ACTIONS[action],
            error=error,
            now=now,
        )

    async def act(self, request: Request) -> Response:
        text, action = request.path_params["workflow_id"], request.path_params["action"]
        if action not in WORKFLOW_ACTIONS:
            return self._not_found(request)
        workflow_id = parse_job_id(text)
        if workflow_id is None:
            return no_such_workflow(self.dashboard, request, text)
        form = await checked_form(self.dashboard, request)
        if isinstance(form, Response):
            return form
        if action == "cancel":
            return await self._cancel(request, workflow_id, form)
        return await self._retry(request, workflow_id)

    async def _cancel(self, request: Request, workflow_id: int, form: dict[str, str]) -> Response:
        """``cancel_workflow``, and a notice of what it did: the workflow
        ended (its waiting steps cancelled), or it goes on until its running
        steps stop, or nothing (it had finished already)."""
        try:
            reason = checked_text(form.get("reason", ""), "reason").strip() or None
        except BadInput as exc:
            return await self.confirm(request, error=str(exc))
        async with self.dashboard.reading() as reader:
            before = await reader.row(workflows_sql.WORKFLOW, id=workflow_id, cut=TEXT_CUT)
        utils = await self.dashboard.utils()
        try:
            state = await utils.cancel_workflow(workflow_id, reason)
        except JobSpecError as exc:  # what the utilities refuse is bad input too
            return await self.confirm(request, error=str(exc))
        path = f"/workflows/{workflow_id}"
        if state is None:
            return redirect(
                self.dashboard, request, "/workflows", "workflow-gone", workflow=workflow_id
            )
        if before is not None and before["state"] != "running":
            return redirect(
                self.dashboard,
                request,
                path,
                "workflow-finished",
                workflow=workflow_id,
                state=state,
            )
        logger.info("Dashboard: cancel workflow %d: %s", workflow_id, state)
        why = "workflow-cancel-running" if state == "running" else "workflow-cancel"
        return redirect(self.dashboard, request, path, why, workflow=workflow_id, state=state)

    async def _retry(self, request: Request, workflow_id: int) -> Response:
        """``retry_workflow``, and a notice of how many steps run again (none:
        it had no failed or cancelled step)."""
        reset = await (await self.dashboard.utils()).retry_workflow(workflow_id)
        path = f"/workflows/{workflow_id}"
        if reset is None:
            return redirect(
                self.dashboard, request, "/workflows", "workflow-gone", workflow=workflow_id
            )
        if reset == 0:
            return redirect(self.dashboard, request, path, "workflow-nothing", workflow=workflow_id)
        logger.info("Dashboard: retry workflow %d: %d steps", workflow_id, reset)
        steps = f"{reset:,} step{'' if reset == 1 else 's'}"
        return redirect(
            self.dashboard, request, path, "workflow-retry", workflow=workflow_id, detail=steps
        )
