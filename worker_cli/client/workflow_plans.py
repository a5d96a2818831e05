"""Plans for the workflow methods of both utilities facades (add, read, list,
cancel, retry) and for a running step's ``helpers.add_steps``: each checks
its arguments before any I/O, then sends the statements of
:mod:`worker_cli.sql.workflows`."""

from __future__ import annotations

import json
import math
from typing import Any

from psycopg import errors as pg_errors

from ..db.plan import Plan, query
from ..errors import GraphileWorkerError, JobSpecError
from ..jobs.inside_worker import in_worker_task
from ..jobs.job_state import check_job_id
from ..jobs.payloads import json_default
from ..jobs.text_args import check_text
from ..jobs.workflow import Workflow, WorkflowError
from ..jobs.workflow_state import WORKFLOW_STATES, AddedWorkflow, WorkflowInfo
from ..schema.probe import schema_required
from ..sql import compose
from ..sql import workflows as workflows_sql

__all__ = [
    "WorkflowNotFound",
    "WorkflowWaitTimeout",
    "add_workflow",
    "cancel_workflow",
    "check_workflow_id",
    "check_workflow_wait",
    "extend_workflow",
    "get_workflow",
    "list_workflows",
    "retry_workflow",
]


def check_workflow_id(workflow_id: int) -> None:
    """A workflow id is a positive int (as a job id is)."""
    try:
        check_job_id(workflow_id)
    except JobSpecError as exc:
        raise JobSpecError("workflow_id", exc.reason) from None


class WorkflowNotFound(LookupError, GraphileWorkerError):
    """``wait_for_workflow``: no workflow has this id (never added, or pruned)."""

    def __init__(self, workflow_id: int) -> None:
        super().__init__(f"workflow {workflow_id} does not exist (never added, or pruned)")
        self.workflow_id = workflow_id


class WorkflowWaitTimeout(TimeoutError, GraphileWorkerError):
    """``wait_for_workflow`` gave up: the workflow was not final within the
    timeout. ``last`` is the workflow as last read."""

    def __init__(self, workflow_id: int, timeout: float, last: WorkflowInfo) -> None:
        super().__init__(
            f"workflow {workflow_id} did not finish within {timeout:g}s "
            f"({last.left} of {last.total} steps not final)"
        )
        self.workflow_id = workflow_id
        self.last = last


def check_workflow_wait(workflow_id: int, timeout: float | None, *, allow_in_task: bool) -> None:
    """The arguments of ``wait_for_workflow``, checked before any I/O; and
    refused inside a job of this process's worker unless ``allow_in_task``
    (as ``wait_for_job``: a pool whose slots all wait never runs the steps
    they wait for)."""
    check_workflow_id(workflow_id)
    if not allow_in_task and in_worker_task():
        raise RuntimeError(
            "wait_for_workflow was called inside a task run by this process's worker: "
            "waiting there holds a slot, and a pool whose slots all wait never runs the "
            "steps they wait for. Add a step after them instead (helpers.add_steps), or "
            "pass allow_in_task=True if the pool can spare the slot."
        )
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout < 0
    ):
        raise JobSpecError("timeout", f"is {timeout!r}; it must be None or seconds, 0 or more")


def _encode(wf: Workflow) -> str:
    if not isinstance(wf, Workflow):
        raise WorkflowError("workflow", f"must be a Workflow, not {type(wf).__name__}")
    return json.dumps(wf.records(), default=json_default, allow_nan=False, separators=(",", ":"))


def add_workflow(schema: str, wf: Workflow) -> Plan[AddedWorkflow]:
    """``add_workflow``: the whole graph in one statement (so in one
    transaction, or the caller's); its root steps become jobs."""
    steps = _encode(wf)
    return _add(schema, wf, steps)


def _add(schema: str, wf: Workflow, steps: str) -> Plan[AddedWorkflow]:
    with schema_required(schema):
        rows = yield from query(
            compose(workflows_sql.ADD_WORKFLOW, schema), {"name": wf.name, "steps": steps}
        )
    return AddedWorkflow(int(rows[0][0]), wf.name, len(wf.steps))


def get_workflow(schema: str, workflow_id: int) -> Plan[WorkflowInfo | None]:
    """``get_workflow``: the workflow and its steps; None if there is none."""
    check_workflow_id(workflow_id)
    return _get(schema, workflow_id)


def _get(schema: str, workflow_id: int) -> Plan[WorkflowInfo | None]:
    params = {"workflow_id": workflow_id}
    with schema_required(schema):
        rows = yield from query(compose(workflows_sql.WORKFLOW, schema), params)
        if not rows:
            return None
        steps = yield from query(compose(workflows_sql.WORKFLOW_STEPS, schema), params)
    return WorkflowInfo.from_rows(rows[0], steps)


def list_workflows(
    schema: str, state: str | None, limit: int, before: int | None
) -> Plan[list[WorkflowInfo]]:
    """``list_workflows``: a page of workflows, newest first (no steps)."""
    if state is not None and state not in WORKFLOW_STATES:
        raise JobSpecError("state", f"is {state!r}; expected one of {', '.join(WORKFLOW_STATES)}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
        raise JobSpecError("limit", "must be an int from 1 to 10,000")
    if before is not None:
        check_workflow_id(before)
    return _list(schema, {"state": state, "limit": limit, "before": before})


def _list(schema: str, params: dict[str, Any]) -> Plan[list[WorkflowInfo]]:
    with schema_required(schema):
        rows = yield from query(compose(workflows_sql.LIST_WORKFLOWS, schema), params)
    return [WorkflowInfo.from_rows(row) for row in rows]


def cancel_workflow(schema: str, workflow_id: int, reason: str | None) -> Plan[str | None]:
    """``cancel_workflow``: the workflow's state after the call (None: no such
    workflow)."""
    check_workflow_id(workflow_id)
    check_text(reason, "reason")
    return _one(
        schema, workflows_sql.CANCEL_WORKFLOW, {"workflow_id": workflow_id, "reason": reason}
    )


def retry_workflow(schema: str, workflow_id: int) -> Plan[int | None]:
    """``retry_workflow``: how many steps run again (None: no such workflow)."""
    check_workflow_id(workflow_id)
    return _one(schema, workflows_sql.RETRY_WORKFLOW, {"workflow_id": workflow_id})


def extend_workflow(
    schema: str, workflow_id: int, from_ref: str, wf: Workflow, hold_dependents: bool
) -> Plan[int]:
    """``helpers.add_steps``: the number of steps added."""
    steps = _encode(wf)
    params = {
        "workflow_id": workflow_id,
        "from_ref": from_ref,
        "steps": steps,
        "hold_dependents": bool(hold_dependents),
    }
    return _extend(schema, params)


def _extend(schema: str, params: dict[str, Any]) -> Plan[int]:
    try:
        added: int = yield from _one(schema, workflows_sql.EXTEND_WORKFLOW, params)
    except pg_errors.InvalidParameterValue as exc:  # the SQL function's refusal
        raise WorkflowError("add_steps", exc.diag.message_primary or str(exc)) from None
    return added


def _one(schema: str, statement: Any, params: dict[str, Any]) -> Plan[Any]:
    with schema_required(schema):
        rows = yield from query(compose(statement, schema), params)
    return rows[0][0]
