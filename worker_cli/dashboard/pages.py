"""The pages (GET): overview, jobs, a job, worker pools, crontab, /healthz.

Nothing here writes; each page reads in one read-only transaction
(:meth:`.app.Dashboard.reading`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from .queries import JOB_STATES, WINDOW
from .reads import PAGE_SIZE, JobFilter

if TYPE_CHECKING:
    from .app import Dashboard

__all__ = ["NOTICES", "routes"]

logger = logging.getLogger("graphile_worker.dashboard")

#: What an action's redirect says (``?notice=``): fixed sentences, filled
#: with the job id or pool named in the query string (escaped like any value).
NOTICES = {
    "run-now": "Job {job} will run now.",
    "reschedule": "Job {job} was rescheduled.",
    "fail": "Job {job} was permanently failed.",
    "delete": "Job {job} was deleted (completed).",
    "locked": (
        "Job {job} is locked by a worker that is running it: nothing was changed "
        "(the admin functions leave locked jobs alone until their lock is 4 hours old)."
    ),
    "gone": "Job {job} no longer exists: nothing was changed.",
    "unlock": "Released the jobs and named queues that pool {pool} held.",
    "alive": ("Pool {pool} has a live heartbeat: its jobs are running. Nothing was changed."),
}


def routes(dashboard: Dashboard) -> list[Route]:
    pages = _Pages(dashboard)
    return [
        Route("/", pages.overview, name="overview"),
        Route("/jobs", pages.jobs, name="jobs"),
        Route("/jobs/{job_id:int}", pages.job, name="job"),
        Route("/pools", pages.pools, name="pools"),
        Route("/crontab", pages.crontab, name="crontab"),
        Route("/healthz", pages.healthz, name="healthz"),
    ]


def notice(request: Request) -> str | None:
    """The sentence an action's redirect asked for, if any."""
    template = NOTICES.get(request.query_params.get("notice", ""))
    if template is None:
        return None
    return template.format(
        job=request.query_params.get("job", ""), pool=request.query_params.get("pool", "")
    )


class _Pages:
    def __init__(self, dashboard: Dashboard) -> None:
        self.dashboard = dashboard

    async def overview(self, request: Request) -> Response:
        async with self.dashboard.reading() as reader:
            data = await reader.overview()
        return self.dashboard.render(
            request,
            "overview.html",
            refresh=True,
            title="Overview",
            page="overview",
            data=data,
            now=data.now,
            window=WINDOW,
            notice=notice(request),
        )

    async def jobs(self, request: Request) -> Response:
        params = request.query_params
        problems = []
        state = params.get("state") or None
        if state is not None and state not in JOB_STATES:
            problems.append(f"unknown state {state!r}; showing every state")
            state = None
        before_text = params.get("before") or ""
        job_filter = JobFilter(
            task=params.get("task") or None, queue=params.get("queue") or None, state=state
        )
        if before_text:
            if before_text.isdigit() and 0 < int(before_text) < 2**63:
                job_filter = JobFilter(job_filter.task, job_filter.queue, state, int(before_text))
            else:
                problems.append(f"bad cursor {before_text!r}; showing the newest jobs")
        async with self.dashboard.reading() as reader:
            page = await reader.jobs(job_filter)
            tasks = await reader.task_identifiers()
            now = await reader.now()
        return self.dashboard.render(
            request,
            "jobs.html",
            status=400 if problems else 200,
            refresh=True,
            title="Jobs",
            page="jobs",
            data=page,
            tasks=tasks,
            states=JOB_STATES,
            problems=problems,
            now=now,
            window=WINDOW,
            page_size=PAGE_SIZE,
            notice=notice(request),
        )

    async def job(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        async with self.dashboard.reading() as reader:
            job = await reader.job(job_id)
            now = await reader.now()
        if job is None:
            return self.dashboard.render(
                request,
                "error.html",
                status=404,
                title="No such job",
                reason=f"job {job_id} does not exist (it may have completed and been deleted)",
                notice=notice(request),
            )
        return self.dashboard.render(
            request,
            "job.html",
            refresh=True,
            title=f"Job {job_id}",
            page="jobs",
            job=job,
            now=now,
            notice=notice(request),
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
            notice=notice(request),
        )

    async def crontab(self, request: Request) -> Response:
        async with self.dashboard.reading() as reader:
            items = await reader.crontab()
            now = await reader.now()
        return self.dashboard.render(
            request,
            "crontab.html",
            refresh=True,
            title="Crontab",
            page="crontab",
            items=items,
            now=now,
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
