"""The pages (GET): overview, jobs, finished jobs, a job (live or finished),
worker pools, crontab, /healthz.

Nothing here writes; each page reads in one read-only transaction
(:meth:`.app.Dashboard.reading`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ..jobs.job_state import STATE_ALIASES
from .filters import FINISHED_STATES, JOB_STATES, WINDOW
from .finished import finished_filter_of
from .inputs import BadInput, checked_text, parse_cursor, parse_job_id, shown
from .page_data import NEWEST, PAGE_SIZE, JobFilter, Reader

if TYPE_CHECKING:
    from .site import Site

__all__ = ["routes"]

logger = logging.getLogger("graphile_worker.dashboard")


def routes(dashboard: Site) -> list[Route]:
    pages = _Pages(dashboard)
    return [
        Route("/jobs", pages.jobs, name="jobs"),
        Route("/jobs/{job_id}", pages.job, name="job"),
        Route("/finished", pages.finished, name="finished"),
        Route("/pools", pages.pools, name="pools"),
        Route("/healthz", pages.healthz, name="healthz"),
    ]


def job_filter_of(request: Request) -> tuple[JobFilter, list[str]]:
    """The job list's filter from the query string, and what was wrong with
    it (each wrong value left out: the page shows the rest, with a 400)."""
    params = request.query_params
    problems = []
    texts: dict[str, str | None] = {}
    for name in ("task", "queue"):
        try:
            texts[name] = checked_text(params.get(name) or "", name) or None
        except BadInput as exc:
            problems.append(f"{exc}; showing every {name}")
            texts[name] = None
    state = params.get("state") or None
    state = STATE_ALIASES.get(state, state) if state else None  # an earlier version's link
    if state is not None and state not in JOB_STATES:
        problems.append(f"unknown state {shown(state)}; showing every state")
        state = None
    before = NEWEST
    if params.get("before"):
        try:
            before = parse_cursor(params["before"])
        except BadInput as exc:
            problems.append(str(exc))
    return JobFilter(texts["task"], texts["queue"], state, before), problems


class _Pages:
    def __init__(self, dashboard: Site) -> None:
        self.dashboard = dashboard

    async def _listing(
        self,
        request: Request,
        template: str,
        read: Callable[[Reader], Awaitable[Any]],
        problems: list[str],
        **context: Any,
    ) -> Response:
        """A page that lists jobs (the Jobs page, the Finished view): what
        ``read`` reads, the task identifiers for its filter, the database's
        time; a 400 when the filter had problems (they are shown)."""
        async with self.dashboard.reading() as reader:
            data = await read(reader)
            tasks = await reader.task_identifiers()
            now = await reader.now()
        return self.dashboard.render(
            request,
            template,
            status=400 if problems else 200,
            refresh=True,
            data=data,
            tasks=tasks,
            problems=problems,
            now=now,
            **context,
        )

    async def jobs(self, request: Request) -> Response:
        job_filter, problems = job_filter_of(request)
        return await self._listing(
            request,
            "jobs.html",
            lambda reader: reader.jobs(job_filter),
            problems,
            title="Jobs",
            page="jobs",
            states=JOB_STATES,
            window=WINDOW,
            page_size=PAGE_SIZE,
        )

    async def job(self, request: Request) -> Response:
        job_id = parse_job_id(request.path_params["job_id"])
        if job_id is None:
            return self.dashboard.no_such_job(request, request.path_params["job_id"])
        async with self.dashboard.reading() as reader:
            job = await reader.job(job_id)
            finished = None if job is not None else await reader.finished_job(job_id)
            attempts = await reader.attempt_errors(job_id)
            progress = await reader.job_progress(job_id)
            logs = await reader.job_logs(job_id)
            now = await reader.now()
        if finished is not None:
            return self.dashboard.render(
                request,
                "finished_job.html",
                refresh=True,
                title=f"Job {job_id}",
                page="finished",
                job=finished,
                attempts=attempts,
                progress=progress,
                logs=logs,
                now=now,
            )
        if job is None:
            return self.dashboard.no_such_job(request, str(job_id))
        return self.dashboard.render(
            request,
            "job.html",
            refresh=True,
            title=f"Job {job_id}",
            page="jobs",
            job=job,
            attempts=attempts,
            progress=progress,
            logs=logs,
            now=now,
        )

    async def finished(self, request: Request) -> Response:
        finished_filter, problems = finished_filter_of(request.query_params)
        return await self._listing(
            request,
            "finished.html",
            lambda reader: reader.finished(finished_filter),
            problems,
            title="Finished jobs",
            page="finished",
            states=FINISHED_STATES,
        )

    async def pools(self, request: Request) -> Response:
        async with self.dashboard.reading() as reader:
            data = await reader.pools()
        return self.dashboard.render(
            request,
            "pools.html",
            refresh=True,
            title="Worker pools",
            page="pools",
            data=data,
            now=data.now,
            window=WINDOW,
        )

    async def healthz(self, request: Request) -> Response:
        """``ok`` (200) when the database answers and the schema can be shown,
        else ``unavailable`` (503; the reason is logged, not shown: this path
        needs no authentication)."""
        problem = await self.dashboard.healthy()
        if problem is None:
            return PlainTextResponse("ok\n")
        logger.warning("Dashboard: /healthz: %s", problem)
        return PlainTextResponse("unavailable\n", status_code=503)
