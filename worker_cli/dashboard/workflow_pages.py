"""The Workflows pages (GET): the list of workflows, newest first, filtered by
state, and one workflow's page: its state and counts, its steps drawn as a
graph (:mod:`.workflow_graph`) and listed in a table a page at a time.

Every read is bounded (the statements, and the index each reads, are in
:mod:`worker_cli.sql.dashboard_workflows`): the list pages by keyset on the
workflow's id, the running ones through their own index, the others
examining at most :data:`~.filters.WINDOW` workflows per page; no count is
made (a workflow's row keeps its own counts). A workflow's page reads at most
:data:`~.workflow_graph.GRAPH_STEPS` steps for its graph and
:data:`STEPS_PAGE_SIZE` for its table (the table's page is cut from the
graph's steps when it lies among them), each through the steps' primary key
entered by the workflow's id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..jobs.workflow_state import WORKFLOW_STATES
from ..sql import dashboard_workflows as workflows_sql
from .filters import WINDOW
from .inputs import BIGINT, BadInput, parse_job_id, shown
from .workflow_graph import EDGES_READ, GRAPH_STEPS, Graph, layout

if TYPE_CHECKING:
    from .page_data import Reader
    from .site import Site

__all__ = [
    "STEPS_PAGE_SIZE",
    "WORKFLOWS_PAGE_SIZE",
    "WorkflowFilter",
    "WorkflowPage",
    "WorkflowsPage",
    "read_workflow",
    "read_workflows",
    "routes",
    "workflow_filter_of",
]

Row = dict[str, Any]

#: Workflows on a page of the list; steps on a page of a workflow's table.
WORKFLOWS_PAGE_SIZE = 50
STEPS_PAGE_SIZE = 100
#: A workflow's error and cancel reason are cut at this many characters.
TEXT_CUT = 2000
#: The largest position (an int in the database).
MAX_POSITION = 2**31 - 1


@dataclass(frozen=True)
class WorkflowFilter:
    """The list's state filter and cursor (from the query string)."""

    state: str | None = None
    #: The id of the last workflow of the previous page (None: the newest).
    before: int | None = None

    def query(self, **changes: Any) -> dict[str, str]:
        """The query string of this filter (with ``changes``), without empty values."""
        values = {"state": self.state, "before": self.before, **changes}
        return {name: str(value) for name, value in values.items() if value not in (None, "")}


@dataclass
class WorkflowsPage:
    """One page of the Workflows list."""

    filter: WorkflowFilter
    rows: list[Row]
    #: Workflows the window examined below the cursor (None: the running
    #: ones, read through their own index, exactly).
    examined: int | None
    #: The cursor of the next page (older workflows), or None at the oldest.
    next_before: int | None
    #: True when the window ran out before the page was full.
    window_ran_out: bool


@dataclass
class WorkflowPage:
    """One workflow's page: the workflow, its graph, a page of its steps."""

    workflow: Row
    graph: Graph
    #: The table's steps: those after position ``after``, STEPS_PAGE_SIZE at most.
    steps: list[Row] = field(default_factory=list)
    after: int = 0
    #: The position the next page starts after (None: this is the last one).
    next_after: int | None = None


def workflow_filter_of(params: Any) -> tuple[WorkflowFilter, list[str]]:
    """The list's filter from a query string, and what was wrong with it (each
    wrong value left out: the page shows the rest, with a 400)."""
    problems = []
    state = params.get("state") or None
    if state is not None and state not in WORKFLOW_STATES:
        problems.append(f"unknown state {shown(state)}; showing every state")
        state = None
    before = None
    if params.get("before"):
        before = parse_job_id(params["before"])
        if before is None:
            problems.append(f"bad cursor {shown(params['before'])}; showing the newest workflows")
    return WorkflowFilter(state, before), problems


def parse_after(text: str) -> int:
    """The step table's ``?after=``: a position, 0 for the first page."""
    if not (text.isascii() and text.isdigit() and len(text) <= 10) or int(text) > MAX_POSITION:
        raise BadInput(f"bad step position {shown(text)}; showing the first steps")
    return int(text)


async def read_workflows(reader: Reader, workflow_filter: WorkflowFilter) -> WorkflowsPage:
    """A page of the list: the running workflows through their index, the
    others (or all) within a window of the newest by id."""
    before = BIGINT if workflow_filter.before is None else workflow_filter.before
    limit = WORKFLOWS_PAGE_SIZE + 1
    if workflow_filter.state == "running":
        rows = await reader.rows(
            workflows_sql.RUNNING_WORKFLOWS_PAGE, before=before, limit=limit, cut=TEXT_CUT
        )
        more = len(rows) > WORKFLOWS_PAGE_SIZE
        rows = rows[:WORKFLOWS_PAGE_SIZE]
        return WorkflowsPage(workflow_filter, rows, None, rows[-1]["id"] if more else None, False)
    found = await reader.rows(
        workflows_sql.WORKFLOWS_PAGE,
        before=before,
        window=WINDOW,
        limit=limit,
        state=workflow_filter.state,
        cut=TEXT_CUT,
    )
    examined, lowest = found[0]["examined"], found[0]["lowest"]
    rows = [row for row in found if row["id"] is not None]
    if len(rows) > WORKFLOWS_PAGE_SIZE:
        rows = rows[:WORKFLOWS_PAGE_SIZE]
        return WorkflowsPage(workflow_filter, rows, examined, rows[-1]["id"], False)
    if examined == WINDOW:  # workflows below this window remain
        return WorkflowsPage(workflow_filter, rows, examined, lowest, True)
    return WorkflowsPage(workflow_filter, rows, examined, None, False)


async def read_workflow(reader: Reader, workflow_id: int, after: int) -> WorkflowPage | None:
    """A workflow's page, its table's steps after position ``after``; None
    if there is no such workflow."""
    workflow = await reader.row(workflows_sql.WORKFLOW, id=workflow_id, cut=TEXT_CUT)
    if workflow is None:
        return None
    drawn = await reader.rows(
        workflows_sql.WORKFLOW_STEPS_PAGE, workflow_id=workflow_id, after=0, limit=GRAPH_STEPS
    )
    ref_of = {row["id"]: row["ref"] for row in drawn}
    read, edges = 0, []
    if ref_of:
        for row in await reader.rows(
            workflows_sql.WORKFLOW_EDGES, ids=list(ref_of), limit=EDGES_READ
        ):
            read = row["read"]
            if row["parent_id"] is not None:
                edges.append((ref_of[row["parent_id"]], ref_of[row["child_id"]]))
    graph = layout(drawn, edges, total=workflow["steps"], edges_cut=read >= EDGES_READ)
    # The table's page, from the graph's steps when they hold it all.
    steps = [row for row in drawn if row["position"] > after][: STEPS_PAGE_SIZE + 1]
    if len(steps) <= STEPS_PAGE_SIZE and len(drawn) == GRAPH_STEPS:
        steps = await reader.rows(
            workflows_sql.WORKFLOW_STEPS_PAGE,
            workflow_id=workflow_id,
            after=after,
            limit=STEPS_PAGE_SIZE + 1,
        )
    next_after = None
    if len(steps) > STEPS_PAGE_SIZE:
        steps = steps[:STEPS_PAGE_SIZE]
        next_after = steps[-1]["position"]
    return WorkflowPage(workflow, graph, steps, after, next_after)


def routes(dashboard: Site) -> list[Route]:
    pages = _Pages(dashboard)
    return [
        Route("/workflows", pages.workflows, name="workflows"),
        Route("/workflows/{workflow_id}", pages.workflow, name="workflow"),
    ]


def no_such_workflow(dashboard: Site, request: Request, text: str) -> Response:
    """The 404 of a workflow id: not one, or no workflow has it (never added,
    or pruned with the history of finished jobs)."""
    workflow_id = parse_job_id(text)
    if workflow_id is None:
        reason = f"{shown(text)} is not a workflow id (a whole number from 1 to {BIGINT})"
        title = "No such workflow"
    else:
        title = "Unknown workflow"
        reason = (
            f"no workflow has the id {workflow_id}: it was never added, or it finished and "
            "was pruned (a finished workflow is kept a day; failed and cancelled ones 7 days)"
        )
    return dashboard.render(request, "error.html", status=404, title=title, reason=reason)


class _Pages:
    def __init__(self, dashboard: Site) -> None:
        self.dashboard = dashboard

    async def workflows(self, request: Request) -> Response:
        workflow_filter, problems = workflow_filter_of(request.query_params)
        async with self.dashboard.reading() as reader:
            data = await read_workflows(reader, workflow_filter)
            now = await reader.now()
        return self.dashboard.render(
            request,
            "workflows.html",
            status=400 if problems else 200,
            refresh=True,
            title="Workflows",
            page="workflows",
            data=data,
            problems=problems,
            states=WORKFLOW_STATES,
            window=WINDOW,
            now=now,
        )

    async def workflow(self, request: Request) -> Response:
        text = request.path_params["workflow_id"]
        workflow_id = parse_job_id(text)
        if workflow_id is None:
            return no_such_workflow(self.dashboard, request, text)
        problems = []
        after = 0
        if request.query_params.get("after"):
            try:
                after = parse_after(request.query_params["after"])
            except BadInput as exc:
                problems.append(str(exc))
        async with self.dashboard.reading() as reader:
            data = await read_workflow(reader, workflow_id, after)
            now = await reader.now()
        if data is None:
            return no_such_workflow(self.dashboard, request, text)
        return self.dashboard.render(
            request,
            "workflow.html",
            status=400 if problems else 200,
            refresh=True,
            title=f"Workflow {workflow_id}",
            page="workflows",
            data=data,
            wf=data.workflow,
            graph=data.graph,
            problems=problems,
            graph_steps=GRAPH_STEPS,
            steps_page_size=STEPS_PAGE_SIZE,
            now=now,
        )
