"""What is known of a workflow, as ``get_workflow``, ``wait_for_workflow`` and
``list_workflows`` return it, and what a step's task sees of its parents
(``helpers.parents``).

A workflow is ``running`` until every step is final, then ``failed`` if a step
failed, else ``cancelled`` if one was cancelled, else ``succeeded``. A step's
state is one word of the jobs' vocabulary while it has a job (``waiting``,
``scheduled``, ``running``, ``retrying``, ``paused``; ``unknown`` for the
moment between its job's end and the repair sweep when a Node worker ran
it), ``blocked`` before it has one, and once final ``succeeded``, ``failed``,
``cancelled`` or ``skipped`` (its ``error`` says why, naming the parent).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, TypeAlias

__all__ = [
    "FINAL_STEP_STATES",
    "WORKFLOW_FIELDS",
    "AddedWorkflow",
    "ParentOutcome",
    "StepContext",
    "StepInfo",
    "WorkflowInfo",
    "WorkflowState",
    "step_contexts",
]

WorkflowState: TypeAlias = Literal["running", "succeeded", "failed", "cancelled"]
WORKFLOW_STATES: tuple[str, ...] = ("running", "succeeded", "failed", "cancelled")
#: The states a step does not leave (unless ``retry_workflow`` runs it again).
FINAL_STEP_STATES = frozenset({"succeeded", "failed", "cancelled", "skipped"})


@dataclass(frozen=True, slots=True)
class AddedWorkflow:
    """What ``add_workflow`` returns."""

    id: int
    name: str | None
    #: How many steps it has.
    steps: int


@dataclass(frozen=True, slots=True)
class StepInfo:
    """One step of a workflow (see the module's docstring for ``state``)."""

    ref: str
    state: str
    task_identifier: str
    run_if: str
    #: Its job's id, once it has one (the last one, after a retry).
    job_id: int | None
    #: What its task returned (succeeded; None when it returned None or its
    #: job was finished by a Node worker).
    result: Any
    #: Why it failed, was cancelled or skipped; a running job's last error.
    error: str | None
    #: The refs of the steps it waits for.
    after: tuple[str, ...]
    #: How many times ``retry_workflow`` ran it again.
    retries: int
    created_at: datetime
    queued_at: datetime | None
    finished_at: datetime | None

    @property
    def finished(self) -> bool:
        """The step is final."""
        return self.state in FINAL_STEP_STATES


#: STEP_COLUMNS of sql/workflows.py WORKFLOW_STEPS, in order.
_STEP_FIELDS = (
    "ref",
    "state",
    "task_identifier",
    "run_if",
    "job_id",
    "result",
    "error",
    "after",
    "retries",
    "created_at",
    "queued_at",
    "finished_at",
)


#: The fields of a workflow (not its steps): WORKFLOW's columns in
#: sql/workflows.py, in order.
WORKFLOW_FIELDS = (
    "id",
    "name",
    "state",
    "total",
    "left",
    "succeeded",
    "failed",
    "cancelled",
    "skipped",
    "error",
    "cancel_requested_at",
    "cancel_reason",
    "created_at",
    "finished_at",
)


@dataclass(frozen=True, slots=True)
class WorkflowInfo:
    """A workflow: its state, its counts and (``get_workflow``) its steps by ref."""

    id: int
    name: str | None
    state: WorkflowState
    #: Steps in all, and those not final yet.
    total: int
    left: int
    succeeded: int
    failed: int
    cancelled: int
    skipped: int
    #: Why it could not advance (an error in its resolution), if so.
    error: str | None
    cancel_requested_at: datetime | None
    cancel_reason: str | None
    created_at: datetime
    finished_at: datetime | None
    #: Its steps in the order they were added (empty in ``list_workflows``).
    steps: dict[str, StepInfo] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        """The workflow is final (every step is)."""
        return self.state != "running"

    @classmethod
    def from_rows(cls, row: Sequence[Any], steps: Sequence[Sequence[Any]] = ()) -> WorkflowInfo:
        """From a row of WORKFLOW and the rows of WORKFLOW_STEPS."""
        infos = {}
        for step in steps:
            values = dict(zip(_STEP_FIELDS, step, strict=True))
            values["after"] = tuple(values["after"])
            infos[values["ref"]] = StepInfo(**values)
        values = dict(zip(WORKFLOW_FIELDS, row, strict=True))
        return cls(**values, steps=infos)


@dataclass(frozen=True, slots=True)
class ParentOutcome:
    """A parent step as its children see it (``helpers.parents[ref]``)."""

    #: succeeded, failed, cancelled or skipped (a child runs once every
    #: parent is final).
    state: str
    #: What it returned (None unless it succeeded and returned something).
    result: Any
    #: Why it failed, was cancelled or skipped.
    error: str | None


@dataclass(frozen=True, slots=True)
class StepContext:
    """A fetched step's place in its workflow, read with its job (one
    statement per fetch, whatever the number of steps and parents)."""

    workflow_id: int
    ref: str
    parents: dict[str, ParentOutcome]


def step_contexts(rows: Sequence[Sequence[Any]]) -> dict[int, StepContext]:
    """The contexts of fetched steps from the rows of STEP_CONTEXTS (one per
    parent; one with a null parent for a root step), by job id."""
    contexts: dict[int, StepContext] = {}
    for job_id, workflow_id, ref, parent, state, result, error in rows:
        context = contexts.get(job_id)
        if context is None:
            context = contexts[job_id] = StepContext(workflow_id, ref, {})
        if parent is not None:
            value = json.loads(result) if result is not None else None
            context.parents[parent] = ParentOutcome(state, value, error)
    return contexts
