"""A workflow as it is built (worker_cli/jobs/workflow.py): each refusal is one
line naming the step and the problem, and leaves the workflow unchanged."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from worker_cli.errors import JobSpecError
from worker_cli.jobs import workflow as workflow_module
from worker_cli.jobs.workflow import Step, Workflow, WorkflowError

pytestmark = pytest.mark.unit


def refused(action: Any) -> str:
    with pytest.raises(WorkflowError) as info:
        action()
    assert isinstance(info.value, JobSpecError)  # what add_job's callers already catch
    message = str(info.value)
    assert "\n" not in message
    return message


def test_steps_take_earlier_steps_or_their_refs_and_get_unique_refs() -> None:
    wf = Workflow(name="nightly import")
    fetch = wf.add("fetch", {"day": "2026-11-29"})
    parse_a = wf.add("parse", {"part": 1}, after=[fetch])
    parse_b = wf.add("parse", {"part": 2}, after="fetch", priority=5, max_attempts=3)
    zipped = wf.add(
        "zip", after=[parse_a, "parse-2", parse_a], ref="zip-all", timeout=timedelta(minutes=5)
    )
    notify = wf.add("notify", after=[zipped], run_if="finished", queue_name="mail")
    assert [s.ref for s in wf.steps] == ["fetch", "parse", "parse-2", "zip-all", "notify"]
    assert parse_b.ref == "parse-2" and parse_b.after == ("fetch",)
    assert zipped.after == ("parse", "parse-2")  # a parent named twice counts once
    assert parse_b.job.priority == 5 and parse_b.job.max_attempts == 3
    assert notify.job.queue_name == "mail" and notify.run_if == "finished"
    assert fetch.job.identifier == "fetch" and fetch.job.payload == {"day": "2026-11-29"}
    wf.check()


def test_each_refusal_names_the_step_and_changes_nothing() -> None:
    wf = Workflow()
    first = wf.add("a", ref="first")
    other = Workflow().add("b")
    cases = {
        "ref: 'first' names two steps of the workflow": lambda: wf.add("a", ref="first"),
        "step 'x': after: 'later' is not an earlier step of this workflow": lambda: wf.add(
            "a", ref="x", after=["later"]
        ),
        "step 'x': cannot wait for itself": lambda: wf.add("a", ref="x", after=["x"]),
        "step 'x': after: step 'b' is another workflow's": lambda: wf.add(
            "a", ref="x", after=[other]
        ),
        "step 'x': after: holds a int; expected steps or their refs": lambda: wf.add(
            "a", ref="x", after=[first, 3]
        ),
        "step 'x': run_if: is 'always'; expected one of succeeded, finished, failed": (
            lambda: wf.add("a", ref="x", after=[first], run_if="always")  # type: ignore[arg-type]
        ),
        "step 'x': run_if: 'failed' needs at least one step in after": lambda: wf.add(
            "a", ref="x", run_if="failed"
        ),
        "step 'x': priority: is 40000; it must be between -32768 and 32767": lambda: wf.add(
            "a", ref="x", priority=40000
        ),
        "step 'x': unknown option(s) colour": lambda: wf.add("a", ref="x", colour="red"),
        "step 'x': job_key: a step's job is its workflow's: it takes no job key": lambda: wf.add(
            "a", ref="x", job_key="k"
        ),
        "step 'x': payload: cannot be encoded as JSON": lambda: wf.add("a", {1j}, ref="x"),
        "step 'x': identifier: must not be empty": lambda: wf.add("", ref="x"),
        "ref: must be 1 to 128 characters long": lambda: wf.add("a", ref="r" * 129),
        "name: must be a string, not int": lambda: Workflow(name=3),  # type: ignore[arg-type]
    }
    for expected, action in cases.items():
        message = refused(action)
        assert message.startswith(expected), (expected, message)
    assert [s.ref for s in wf.steps] == ["first"]
    wf.check()


def test_check_refuses_an_empty_workflow_unknown_parents_and_cycles() -> None:
    assert refused(Workflow().check) == "steps: a workflow needs at least one step"
    # Graphs Workflow.add cannot build (its parents are earlier steps), made by hand.
    wf = Workflow()
    a = wf.add("a")
    b = wf.add("b", after=[a])
    wf._steps["a"] = Step("a", a.job, ("b",), "succeeded", wf)
    assert refused(wf.check) == "after: steps wait for each other in a cycle: ['a', 'b']"
    wf._steps["a"] = Step("a", a.job, ("gone",), "succeeded", wf)
    assert refused(wf.check) == "step 'a': waits for unknown step 'gone'"
    wf._steps["a"] = Step("a", a.job, ("a",), "succeeded", wf)
    assert refused(wf.check) == "step 'a': cannot wait for itself"
    assert b.after == ("a",)


def test_the_documented_maximums_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workflow_module, "MAX_STEPS", 4)
    monkeypatch.setattr(workflow_module, "MAX_EDGES", 2)
    wf = Workflow()
    root = wf.add("a")
    wf.add("b", after=[root])
    wf.add("c", after=[root])
    wf.add("d")
    assert refused(lambda: wf.add("e")) == "steps: a workflow has at most 4 steps"
    wf2 = Workflow()
    x, y = wf2.add("x"), wf2.add("y")
    wf2.add("z", after=[x, y])
    assert (
        refused(lambda: wf2.add("w", after=[x])) == "after: a workflow has at most 2 links in all"
    )
