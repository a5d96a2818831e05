"""A workflow as a value: steps (jobs to be), the steps each waits for, and
when each may run (no I/O). Checked as it is built, and whole before it is
written: a workflow the database receives is a graph of known steps, without
a cycle, every step's job one ``add_job`` would accept.

``Workflow.add`` only takes earlier steps (or their refs) as parents, so a
workflow built with it has no cycle; :meth:`Workflow.check` checks the whole
graph again all the same (steps given by another route, a step of another
workflow passed as a parent).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, get_args

from ..errors import JobSpecError
from .job_spec import JobSpec, encode_payload

__all__ = [
    "MAX_EDGES",
    "MAX_STEPS",
    "STEP_FLAG",
    "RunIf",
    "Step",
    "Workflow",
    "WorkflowError",
    "batch",
    "is_step",
]

#: When a step runs, from how its parents ended: all succeeded (the default),
#: whatever they ended as, or at least one failed for good or was cancelled.
RunIf: TypeAlias = Literal["succeeded", "finished", "failed"]
RUN_IF: tuple[str, ...] = get_args(RunIf)

#: The most steps one workflow may have, and the most parent links in all.
MAX_STEPS = 100_000
MAX_EDGES = 1_000_000
#: The longest ref (a step's name in its workflow).
MAX_REF = 128
#: The flag a step's job carries (added by ``py_workflow_start``): a worker
#: tells a step's job by it, with no extra read.
STEP_FLAG = "py:workflow"


def is_step(flags: Mapping[str, bool] | None) -> bool:
    """A job with these flags is a workflow step's."""
    return flags is not None and STEP_FLAG in flags


class WorkflowError(JobSpecError):
    """A workflow that cannot be added, naming the step and what is wrong."""


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a workflow: the job it becomes once it may run."""

    #: The step's name in its workflow (given, or made unique).
    ref: str
    #: The job: its task, payload and ``add_job`` options.
    job: JobSpec
    #: The refs of the steps it waits for.
    after: tuple[str, ...]
    run_if: RunIf
    #: The workflow it belongs to (a step of another one is no parent here).
    workflow: Workflow = field(repr=False, compare=False)


class Workflow:
    """Steps that wait for other steps; added whole by ``add_workflow``."""

    def __init__(self, name: str | None = None) -> None:
        if name is not None:
            _check_name("name", name)
        self.name = name
        self._steps: dict[str, Step] = {}
        self._edges = 0

    @property
    def steps(self) -> tuple[Step, ...]:
        """The steps in the order they were added (parents before children)."""
        return tuple(self._steps.values())

    def add(
        self,
        task_identifier: str,
        payload: Any = None,
        *,
        after: Iterable[Step | str] = (),
        run_if: RunIf = "succeeded",
        ref: str | None = None,
        **job_options: Any,
    ) -> Step:
        """Add a step running ``task_identifier`` with ``payload`` once the
        steps of ``after`` (earlier steps of this workflow, or their refs) have
        ended as ``run_if`` says. ``job_options`` are ``add_job``'s. Raises
        :class:`WorkflowError` naming what is wrong; the workflow is unchanged."""
        if ref is None:
            ref = self._unique_ref(task_identifier)
        else:
            _check_name("ref", ref)
            if ref in self._steps:
                raise WorkflowError("ref", f"{ref!r} names two steps of the workflow")
        if run_if not in RUN_IF:
            raise WorkflowError(
                f"step {ref!r}: run_if", f"is {run_if!r}; expected one of {', '.join(RUN_IF)}"
            )
        parents = self._parents(ref, after)
        if not parents and run_if != "succeeded":
            raise WorkflowError(
                f"step {ref!r}: run_if", f"{run_if!r} needs at least one step in after"
            )
        if len(self._steps) >= MAX_STEPS:
            raise WorkflowError("steps", f"a workflow has at most {MAX_STEPS:,} steps")
        if self._edges + len(parents) > MAX_EDGES:
            raise WorkflowError("after", f"a workflow has at most {MAX_EDGES:,} links in all")
        job = _job(ref, task_identifier, payload, job_options)
        step = Step(ref, job, parents, run_if, self)
        self._steps[ref] = step
        self._edges += len(parents)
        return step

    def check(self) -> None:
        """Raise :class:`WorkflowError` unless the workflow is a graph that can
        be added: at least one step, every parent a step of it, no cycle."""
        if not self._steps:
            raise WorkflowError("steps", "a workflow needs at least one step")
        children: dict[str, list[str]] = {ref: [] for ref in self._steps}
        waiting: dict[str, int] = {}
        for step in self._steps.values():
            for parent in step.after:
                if parent == step.ref:
                    raise WorkflowError(f"step {step.ref!r}", "cannot wait for itself")
                if parent not in self._steps:
                    raise WorkflowError(f"step {step.ref!r}", f"waits for unknown step {parent!r}")
                children[parent].append(step.ref)
            waiting[step.ref] = len(step.after)
        ready = deque(ref for ref, count in waiting.items() if count == 0)
        seen = 0
        while ready:
            seen += 1
            for child in children[ready.popleft()]:
                waiting[child] -= 1
                if waiting[child] == 0:
                    ready.append(child)
        if seen < len(self._steps):
            cycle = sorted(ref for ref, count in waiting.items() if count > 0)
            raise WorkflowError("after", f"steps wait for each other in a cycle: {cycle[:5]}")

    def records(self) -> list[dict[str, Any]]:
        """The steps as ``py_add_workflow`` reads them (checked first): each
        one's ref, job (a ``job_spec`` record), run_if and parents."""
        self.check()
        return [
            {
                "ref": step.ref,
                "spec": step.job.to_json_record(),
                "run_if": step.run_if,
                "after": list(step.after),
            }
            for step in self._steps.values()
        ]

    def _unique_ref(self, task_identifier: str) -> str:
        base = task_identifier if isinstance(task_identifier, str) else "step"
        ref, n = base, 1
        while ref in self._steps:
            n += 1
            ref = f"{base}-{n}"
        return ref

    def _parents(self, ref: str, after: Iterable[Step | str]) -> tuple[str, ...]:
        if isinstance(after, str | Step):
            after = (after,)
        parents: list[str] = []
        for parent in after:
            if isinstance(parent, Step):
                if parent.workflow is not self:
                    raise WorkflowError(
                        f"step {ref!r}: after", f"step {parent.ref!r} is another workflow's"
                    )
                name = parent.ref
            elif isinstance(parent, str):
                name = parent
            else:
                raise WorkflowError(
                    f"step {ref!r}: after",
                    f"holds a {type(parent).__name__}; expected steps or their refs",
                )
            if name == ref:
                raise WorkflowError(f"step {ref!r}", "cannot wait for itself")
            if name not in self._steps:
                raise WorkflowError(
                    f"step {ref!r}: after", f"{name!r} is not an earlier step of this workflow"
                )
            if name not in parents:
                parents.append(name)
        return tuple(parents)


def _job(ref: str, task_identifier: str, payload: Any, options: Mapping[str, Any]) -> JobSpec:
    """The step's job, checked as ``add_job`` checks one; errors name the step."""
    if "job_key" in options or "job_key_mode" in options:
        raise WorkflowError(
            f"step {ref!r}: job_key", "a step's job is its workflow's: it takes no job key"
        )
    try:
        job = JobSpec(identifier=task_identifier, payload=payload, **options)
    except TypeError:
        unknown = sorted(set(options) - set(JobSpec.__dataclass_fields__))
        raise WorkflowError(f"step {ref!r}", f"unknown option(s) {', '.join(unknown)}") from None
    try:
        job.validate()
        encode_payload(payload)
    except JobSpecError as exc:
        raise WorkflowError(f"step {ref!r}: {exc.field}", exc.reason) from None
    return job


def _check_name(what: str, value: object) -> None:
    if not isinstance(value, str):
        raise WorkflowError(what, f"must be a string, not {type(value).__name__}")
    if not 1 <= len(value) <= MAX_REF:
        raise WorkflowError(what, f"must be 1 to {MAX_REF} characters long")


Callback = str | tuple[str, Any] | JobSpec


def batch(
    jobs: Iterable[Callback],
    *,
    on_success: Callback | None = None,
    on_finish: Callback | None = None,
    on_failure: Callback | None = None,
    name: str | None = None,
) -> Workflow:
    """A batch: the jobs of ``jobs`` (each a task identifier, a ``(task,
    payload)`` pair or a :class:`JobSpec`), then ``on_success`` once every one
    has succeeded, ``on_finish`` once every one has ended whatever the
    outcome, ``on_failure`` once every one has ended if at least one failed
    for good or was cancelled. Each callback is a job as the others, and reads
    the batch's outcomes through ``helpers.parents``. Add it with
    ``add_workflow``; its refs are ``job-1``... and ``on_success``,
    ``on_finish``, ``on_failure``."""
    wf = Workflow(name)
    members = [_add_callback(wf, f"job-{n}", job, ()) for n, job in enumerate(jobs, 1)]
    if not members:
        raise WorkflowError("jobs", "a batch needs at least one job")
    for ref, callback, run_if in (
        ("on_success", on_success, "succeeded"),
        ("on_finish", on_finish, "finished"),
        ("on_failure", on_failure, "failed"),
    ):
        if callback is not None:
            _add_callback(wf, ref, callback, members, run_if)  # type: ignore[arg-type]
    return wf


def _add_callback(
    wf: Workflow,
    ref: str,
    job: Callback,
    after: Iterable[Step],
    run_if: RunIf = "succeeded",
) -> Step:
    if isinstance(job, JobSpec):
        options = {
            name: getattr(job, name)
            for name in JobSpec.__dataclass_fields__
            if name not in ("identifier", "payload") and getattr(job, name) is not None
        }
        return wf.add(job.identifier, job.payload, after=after, run_if=run_if, ref=ref, **options)
    if isinstance(job, tuple):
        if len(job) != 2:
            raise WorkflowError(
                ref, "a job is a task identifier, a (task, payload) pair or a JobSpec"
            )
        return wf.add(job[0], job[1], after=after, run_if=run_if, ref=ref)
    return wf.add(job, None, after=after, run_if=run_if, ref=ref)
