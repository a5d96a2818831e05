"""Workflows (issue 45) on a real database, with in-process workers: a
workflow is added whole or not at all, its steps become jobs only when they
may run, their outcomes and results go down the graph in the transaction
that ends each job, every workflow reaches a final state, and cancel, retry,
dynamic fan-out, batches and the repair sweep do what they say."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dbhelpers import rows, run_cli, value
from readme_blocks import app_env

from worker_cli import (
    Helpers,
    JobSpec,
    JobSpecError,
    Limit,
    SchemaNotInstalledError,
    WorkerUtils,
    Workflow,
    WorkflowError,
    WorkflowNotFound,
    WorkflowWaitTimeout,
    batch,
    make_sync_worker_utils,
    make_worker_utils,
    run_once,
)
from worker_cli.worker.background.pruner import HistoryPruner
from worker_cli.worker.background.workflow_repair import WorkflowRepair

pytestmark = pytest.mark.db

JOBS = "graphile_worker._private_jobs"
STEPS = "graphile_worker._private_py_workflow_steps"
WORKFLOWS = "graphile_worker._private_py_workflows"


async def drain(db: str, tasks: dict[str, Any], **options: Any) -> None:
    async with asyncio.timeout(60):
        assert await run_once(db, task_list=tasks, no_handle_signals=True, **options) == 0


def job_tasks(db: str) -> list[str]:
    return [
        r["identifier"]
        for r in rows(
            db,
            f"select t.identifier from {JOBS} j join graphile_worker._private_tasks t "
            "on t.id = j.task_id order by j.id",
        )
    ]


class Ran:
    """Tasks that record what they ran and what they saw of their parents."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, str | None, dict[str, tuple[str, Any]]]] = []

    def task(self, name: str, *, fail: bool = False, returns: Any = None) -> Any:
        async def run(payload: Any, helpers: Helpers) -> Any:
            parents = {ref: (p.state, p.result) for ref, p in helpers.parents.items()}
            self.runs.append((name, helpers.step_ref, parents))
            if fail:
                raise ValueError(f"{name} failed")
            return returns if returns is not None else payload

        return run

    def refs(self) -> list[str | None]:
        return [ref for _, ref, _ in self.runs]


# --- creation -----------------------------------------------------------------


async def test_only_the_root_steps_are_jobs_at_first(db: str, utils: WorkerUtils) -> None:
    wf = Workflow("import")
    fetch = wf.add("fetch", {"day": 1})
    parse = wf.add("parse", after=[fetch])
    wf.add("load", after=[parse])
    wf.add("audit")
    added = await utils.add_workflow(wf)
    assert added.steps == 4
    # Only the roots are rows of Node's table: nothing can start the others.
    assert job_tasks(db) == ["fetch", "audit"]
    flags = rows(db, f"select flags from {JOBS}")
    assert all(r["flags"] == {"py:workflow": True} for r in flags)
    info = await utils.get_workflow(added.id)
    assert info is not None and info.state == "running" and info.name == "import"
    assert {ref: s.state for ref, s in info.steps.items()} == {
        "fetch": "waiting",
        "parse": "blocked",
        "load": "blocked",
        "audit": "waiting",
    }
    assert list(info.steps) == ["fetch", "parse", "load", "audit"]  # the order they were added
    assert info.steps["load"].after == ("parse",)


async def test_a_refused_workflow_writes_nothing(db: str, utils: WorkerUtils) -> None:
    wf = Workflow()
    wf.add("a")
    with pytest.raises(WorkflowError, match="'a' names two steps"):
        wf.add("b", ref="a")
    with pytest.raises(WorkflowError, match="'zz' is not an earlier step"):
        wf.add("b", after=["zz"])
    with pytest.raises(WorkflowError, match=r"step 'b': payload"):
        wf.add("b", {"x": object()}, ref="b")
    with pytest.raises(WorkflowError, match="at least one step"):
        await utils.add_workflow(Workflow())
    # Something only the database refuses (a user's trigger): nothing is left.
    rows(
        db,
        """
        create function public.refuse() returns trigger language plpgsql as $$
        begin
          if new.task_id = (select id from graphile_worker._private_tasks
                            where identifier = 'refused') then
            raise exception 'no refused jobs here';
          end if;
          return new;
        end $$;
        create trigger refuse before insert on graphile_worker._private_jobs
          for each row execute function public.refuse();
        """,
    )
    wf = Workflow()
    wf.add("fine")
    wf.add("refused")
    with pytest.raises(psycopg.errors.RaiseException, match="no refused jobs here"):
        await utils.add_workflow(wf)
    assert value(db, f"select count(*) from {WORKFLOWS}") == 0
    assert value(db, f"select count(*) from {STEPS}") == 0
    assert value(db, f"select count(*) from {JOBS}") == 0


async def test_added_inside_the_caller_s_transaction(db: str) -> None:
    wf = Workflow()
    wf.add("a")
    async with await psycopg.AsyncConnection.connect(db) as conn:
        async with make_worker_utils(connection=conn) as utils:
            await utils.add_workflow(wf)
        await conn.rollback()
    assert value(db, f"select count(*) from {WORKFLOWS}") == 0
    assert value(db, f"select count(*) from {JOBS}") == 0
    with psycopg.connect(db) as conn, make_sync_worker_utils(connection=conn) as sync_utils:
        added = sync_utils.add_workflow(wf)
        conn.commit()
    assert value(db, f"select count(*) from {JOBS}") == 1
    with make_sync_worker_utils(connection_string=db) as sync_utils:
        info = sync_utils.get_workflow(added.id)
        assert info is not None and list(info.steps) == ["a"]


async def test_workflows_need_the_schema_s_revision(empty_db: str) -> None:
    wf = Workflow()
    wf.add("a")
    async with make_worker_utils(connection_string=empty_db) as utils:
        with pytest.raises(SchemaNotInstalledError):
            await utils.add_workflow(wf)


# --- resolution ---------------------------------------------------------------


@pytest.mark.parametrize("history", [True, False])
async def test_results_go_down_the_graph(db: str, utils: WorkerUtils, history: bool) -> None:
    ran = Ran()
    wf = Workflow()
    left = wf.add("double", {"n": 1}, ref="left")
    right = wf.add("double", {"n": 2}, ref="right")
    total = wf.add("sum", after=[left, right], ref="total")
    wf.add("report", after=[total], ref="report")

    async def double(payload: Any, helpers: Helpers) -> Any:
        return {"n": payload["n"] * 2}

    async def add_up(payload: Any, helpers: Helpers) -> Any:
        ran.runs.append(
            ("sum", helpers.step_ref, {r: p.result for r, p in helpers.parents.items()})
        )
        return sum(p.result["n"] for p in helpers.parents.values())

    added = await utils.add_workflow(wf)
    tasks = {"double": double, "sum": add_up, "report": ran.task("report")}
    await drain(db, tasks, history=history)
    info = await utils.wait_for_workflow(added.id, timeout=10)
    assert info.state == "succeeded"
    assert (info.total, info.left, info.succeeded) == (4, 0, 4)
    assert info.steps["total"].result == 6
    assert ran.runs[0] == ("sum", "total", {"left": {"n": 2}, "right": {"n": 4}})
    assert ran.runs[1] == ("report", "report", {"total": ("succeeded", 6)})
    assert value(db, f"select count(*) from {JOBS}") == 0


async def test_a_failure_ends_the_steps_that_need_it_naming_it(db: str, utils: WorkerUtils) -> None:
    ran = Ran()
    wf = Workflow()
    check = wf.add("check", max_attempts=1)
    charge = wf.add("charge", after=[check])
    wf.add("ship", after=[charge])
    wf.add("refund", after=[check], run_if="failed")
    wf.add("log", after=[charge], run_if="finished")
    added = await utils.add_workflow(wf)
    tasks = {
        "check": ran.task("check", fail=True),
        "charge": ran.task("charge"),
        "ship": ran.task("ship"),
        "refund": ran.task("refund"),
        "log": ran.task("log"),
    }
    await drain(db, tasks)
    info = await utils.wait_for_workflow(added.id, timeout=10)
    assert info.state == "failed"
    steps = info.steps
    assert steps["check"].state == "failed" and "ValueError: check failed" in (
        steps["check"].error or ""
    )
    assert (steps["charge"].state, steps["charge"].error) == ("cancelled", "parent 'check' failed")
    assert (steps["ship"].state, steps["ship"].error) == (
        "cancelled",
        "parent 'charge' was cancelled",
    )
    assert steps["refund"].state == "succeeded"
    assert steps["log"].state == "succeeded"  # finished: whatever its parent ended as
    assert sorted(ran.refs()) == ["check", "log", "refund"]
    log_run = next(r for r in ran.runs if r[1] == "log")
    assert log_run[2] == {"charge": ("cancelled", None)}
    assert (info.succeeded, info.failed, info.cancelled, info.skipped) == (2, 1, 2, 0)


async def test_a_failure_handler_is_skipped_when_nothing_failed(
    db: str, utils: WorkerUtils
) -> None:
    ran = Ran()
    wf = Workflow()
    work = wf.add("work")
    handler = wf.add("handler", after=[work], run_if="failed")
    wf.add("after_handler", after=[handler])
    added = await utils.add_workflow(wf)
    tasks = {name: ran.task(name) for name in ("work", "handler", "after_handler")}
    await drain(db, tasks)
    info = await utils.wait_for_workflow(added.id, timeout=10)
    assert ran.refs() == ["work"]
    assert (info.steps["handler"].state, info.steps["handler"].error) == (
        "skipped",
        "no parent failed",
    )
    assert info.steps["after_handler"].state == "skipped"
    assert info.steps["after_handler"].error == "parent 'handler' was skipped"
    assert info.state == "succeeded" and info.skipped == 2


async def test_a_retried_step_waits_for_its_last_attempt(db: str, utils: WorkerUtils) -> None:
    attempts: list[int] = []

    async def flaky(payload: Any, helpers: Helpers) -> str:
        attempts.append(helpers.job.attempts)
        if helpers.job.attempts < 2:
            raise RuntimeError("not yet")
        return "done"

    ran = Ran()
    wf = Workflow()
    first = wf.add("flaky")
    wf.add("next", after=[first])
    added = await utils.add_workflow(wf)
    await drain(db, {"flaky": flaky, "next": ran.task("next")})
    assert ran.refs() == []  # the retry is due later: nothing ran after the failure
    info = await utils.get_workflow(added.id)
    assert info is not None and info.steps["flaky"].state == "retrying"
    assert info.steps["next"].state == "blocked"
    rows(db, f"update {JOBS} set run_at = now()")
    await drain(db, {"flaky": flaky, "next": ran.task("next")})
    assert attempts == [1, 2] and ran.refs() == ["next"]
    assert ran.runs[0][2] == {"flaky": ("succeeded", "done")}


async def test_many_steps_end_in_one_round(db: str, utils: WorkerUtils) -> None:
    """A chain of 300 steps after a failure ends whole, each naming its parent."""
    wf = Workflow()
    previous = wf.add("fails", max_attempts=1)
    for n in range(300):
        previous = wf.add("never", after=[previous], ref=f"s{n}")
    added = await utils.add_workflow(wf)

    async def fails(payload: Any, helpers: Helpers) -> None:
        raise ValueError("no")

    await drain(db, {"fails": fails})
    info = await utils.wait_for_workflow(added.id, timeout=10)
    assert info.state == "failed" and info.cancelled == 300 and info.left == 0
    assert info.steps["s299"].error == "parent 's298' was cancelled"


# --- control -------------------------------------------------------------------


async def test_cancelling_a_step_s_job_advances_its_workflow(db: str, utils: WorkerUtils) -> None:
    wf = Workflow()
    first = wf.add("first")
    wf.add("second", after=[first])
    wf.add("cleanup", after=[first], run_if="finished")
    added = await utils.add_workflow(wf)
    info = await utils.get_workflow(added.id)
    assert info is not None
    job_id = info.steps["first"].job_id
    assert job_id is not None
    assert await utils.cancel_job(job_id, "changed my mind") == "cancelled"
    info = await utils.get_workflow(added.id)
    assert info is not None
    assert info.steps["first"].state == "cancelled"
    assert info.steps["first"].error == "cancelled: changed my mind"
    assert info.steps["second"].state == "cancelled"
    assert info.steps["cleanup"].state == "waiting"  # its job exists now
    assert job_tasks(db) == ["cleanup"]


async def test_cancel_workflow_stops_waiting_and_running_steps(db: str, utils: WorkerUtils) -> None:
    started = asyncio.Event()

    async def slow(payload: Any, helpers: Helpers) -> None:
        started.set()
        await asyncio.sleep(30)

    wf = Workflow()
    running = wf.add("slow")
    wf.add("later", after=[running])
    waiting = wf.add("queued", run_at=None, priority=5)
    wf.add("after_queued", after=[waiting])
    added = await utils.add_workflow(wf)
    runner = asyncio.create_task(
        run_once(db, task_list={"slow": slow}, no_handle_signals=True)  # "queued" has no task
    )
    await asyncio.wait_for(started.wait(), 10)
    assert await utils.cancel_workflow(added.id, "stop") == "running"  # "slow" is asked
    info = await utils.wait_for_workflow(added.id, timeout=15)
    await asyncio.wait_for(runner, 15)
    assert info.state == "cancelled"
    states = {ref: (s.state, s.error) for ref, s in info.steps.items()}
    assert states["queued"] == ("cancelled", "cancelled: stop")
    assert states["later"] == ("cancelled", "its workflow was cancelled: stop")
    assert states["after_queued"][0] == "cancelled"
    assert states["slow"][0] == "cancelled"
    assert value(db, f"select count(*) from {JOBS}") == 0
    assert await utils.cancel_workflow(added.id) == "cancelled"  # again: nothing to do
    assert await utils.cancel_workflow(added.id + 1) is None


async def test_retry_runs_the_failed_steps_and_those_after_them(
    db: str, utils: WorkerUtils
) -> None:
    runs: list[str] = []
    broken = {"yes": True}

    async def step(payload: Any, helpers: Helpers) -> Any:
        runs.append(helpers.step_ref or "")
        if helpers.step_ref == "b" and broken["yes"]:
            raise ValueError("b is broken")
        return {r: p.result for r, p in helpers.parents.items()} or helpers.step_ref

    wf = Workflow()
    a = wf.add("step", ref="a", max_attempts=1)
    b = wf.add("step", ref="b", after=[a], max_attempts=1)
    wf.add("step", ref="c", after=[b])
    wf.add("step", ref="d", after=[a])
    added = await utils.add_workflow(wf)
    await drain(db, {"step": step})
    info = await utils.wait_for_workflow(added.id, timeout=10)
    assert info.state == "failed" and sorted(runs) == ["a", "b", "d"]
    old_job = info.steps["b"].job_id
    broken["yes"] = False
    runs.clear()
    assert await utils.retry_workflow(added.id) == 2  # b, and c after it
    assert value(db, f"select count(*) from {JOBS} where id = %s", (old_job,)) == 0
    await drain(db, {"step": step})
    info = await utils.wait_for_workflow(added.id, timeout=10)
    assert info.state == "succeeded"
    assert sorted(runs) == ["b", "c"]  # a and d kept their outcomes
    assert info.steps["c"].result == {"b": {"a": "a"}}
    assert info.steps["b"].retries == 1 and info.steps["a"].retries == 0
    assert await utils.retry_workflow(added.id) == 0
    assert await utils.retry_workflow(added.id + 1) is None


async def test_wait_for_workflow_times_out_and_lists(db: str, utils: WorkerUtils) -> None:
    wf = Workflow("nightly")
    wf.add("nobody_runs_this")
    added = await utils.add_workflow(wf)
    with pytest.raises(WorkflowWaitTimeout, match=r"1 of 1 steps not final"):
        await utils.wait_for_workflow(added.id, timeout=0.2)
    with pytest.raises(WorkflowNotFound, match="workflow 999 does not exist"):
        await utils.wait_for_workflow(999)
    with pytest.raises(JobSpecError, match="timeout"):
        await utils.wait_for_workflow(added.id, timeout=-1)
    refused: list[str] = []

    async def waits(payload: Any, helpers: Helpers) -> None:
        try:
            await utils.wait_for_workflow(added.id, timeout=0.1)
        except RuntimeError as exc:
            refused.append(str(exc))

    await utils.add_job("waits")
    await drain(db, {"waits": waits})
    assert refused and "inside a task run by this process's worker" in refused[0]
    listed = await utils.list_workflows(state="running")
    assert [w.id for w in listed] == [added.id] and listed[0].steps == {}
    assert await utils.list_workflows(state="succeeded") == []
    with pytest.raises(JobSpecError, match="state"):
        await utils.list_workflows(state="done")


# --- dynamic fan-out and batches ------------------------------------------------


async def test_a_running_step_fans_out_and_its_dependents_wait(db: str, utils: WorkerUtils) -> None:
    seen: dict[str, Any] = {}

    async def split(payload: Any, helpers: Helpers) -> str:
        parts = Workflow()
        thumbs = [parts.add("thumb", {"n": n}, ref=f"thumb-{n}") for n in range(20)]
        parts.add("zip", after=thumbs, ref="zip")
        assert await helpers.add_steps(parts, hold_dependents=True) == 21
        return "split"

    async def thumb(payload: Any, helpers: Helpers) -> int:
        return int(payload["n"])

    async def zip_them(payload: Any, helpers: Helpers) -> int:
        return sum(p.result for p in helpers.parents.values())

    async def notify(payload: Any, helpers: Helpers) -> None:
        seen.update({r: p.result for r, p in helpers.parents.items()})

    wf = Workflow()
    s = wf.add("split")
    wf.add("notify", after=[s])
    added = await utils.add_workflow(wf)
    await drain(db, {"split": split, "thumb": thumb, "zip": zip_them, "notify": notify})
    info = await utils.wait_for_workflow(added.id, timeout=10)
    assert info.state == "succeeded" and info.total == 23
    assert info.steps["zip"].result == sum(range(20))
    assert seen == {"split": "split", "zip": sum(range(20))}  # notify waited for the zip
    assert info.steps["thumb-0"].after == ("split",)


async def test_add_steps_refuses_a_taken_ref_and_a_non_step(db: str, utils: WorkerUtils) -> None:
    errors: list[str] = []

    async def grow(payload: Any, helpers: Helpers) -> None:
        parts = Workflow()
        parts.add("x", ref="grow")
        try:
            await helpers.add_steps(parts)
        except WorkflowError as exc:
            errors.append(str(exc))

    async def plain(payload: Any, helpers: Helpers) -> None:
        try:
            await helpers.add_steps(Workflow())
        except WorkflowError as exc:
            errors.append(str(exc))

    wf = Workflow()
    wf.add("grow")
    await utils.add_workflow(wf)
    await utils.add_job("plain")
    await drain(db, {"grow": grow, "plain": plain})
    assert any("'grow' names a step it already has" in e for e in errors), errors
    assert any("not a workflow step" in e for e in errors), errors


async def test_a_batch_calls_back_by_outcome(db: str, utils: WorkerUtils) -> None:
    ran = Ran()
    ok = batch(
        [("work", {"n": n}) for n in range(5)],
        on_success="done",
        on_finish=("finally", {"x": 1}),
        on_failure=JobSpec(identifier="alert", priority=1),
        name="thumbnails",
    )
    bad = batch(
        ["work", ("broken", {})], on_success="done", on_finish="finally", on_failure="alert"
    )
    tasks = {name: ran.task(name) for name in ("work", "done", "finally", "alert")} | {
        "broken": ran.task("broken", fail=True)
    }
    good_id = (await utils.add_workflow(ok)).id
    rows(db, f"update {JOBS} set max_attempts = 1")
    bad_id = (await utils.add_workflow(bad)).id
    rows(db, f"update {JOBS} set max_attempts = 1")
    await drain(db, tasks)
    good = await utils.wait_for_workflow(good_id, timeout=10)
    worse = await utils.wait_for_workflow(bad_id, timeout=10)
    assert good.state == "succeeded"
    assert {r: s.state for r, s in good.steps.items() if r.startswith("on_")} == {
        "on_success": "succeeded",
        "on_finish": "succeeded",
        "on_failure": "skipped",
    }
    assert worse.state == "failed"
    assert {r: s.state for r, s in worse.steps.items() if r.startswith("on_")} == {
        "on_success": "cancelled",
        "on_finish": "succeeded",
        "on_failure": "succeeded",
    }
    finish = next(
        r
        for r in ran.runs
        if r[0] == "finally" and "job-2" in r[2] and r[2]["job-2"][0] == "failed"
    )
    assert finish[2]["job-1"] == ("succeeded", {})  # the task returned its payload
    with pytest.raises(WorkflowError, match="at least one job"):
        batch([])


# --- what other workers leave: the repair sweep ------------------------------------


async def test_steps_ended_elsewhere_are_repaired(db: str, utils: WorkerUtils) -> None:
    wf = Workflow()
    node_done = wf.add("node_task", ref="node_done")
    admin_failed = wf.add("node_task", ref="admin_failed")
    wf.add("after_node", after=[node_done])
    wf.add("after_admin", after=[admin_failed])
    added = await utils.add_workflow(wf)
    info = await utils.get_workflow(added.id)
    assert info is not None
    done_id = info.steps["node_done"].job_id
    failed_id = info.steps["admin_failed"].job_id
    # As a Node worker completes a job (its row deleted, nothing else written),
    # and as an operator fails one for good with Node's function.
    rows(db, "select graphile_worker.complete_jobs(array[%s]::bigint[])", (done_id,))
    rows(
        db,
        "select graphile_worker.permanently_fail_jobs(array[%s]::bigint[], 'by hand')",
        (failed_id,),
    )
    info = await utils.get_workflow(added.id)
    assert info is not None and info.steps["node_done"].state == "unknown"
    assert await WorkflowRepair(utils.pool, schema="graphile_worker").sweep() == 2
    info = await utils.get_workflow(added.id)
    assert info is not None
    assert (info.steps["node_done"].state, info.steps["node_done"].result) == ("succeeded", None)
    assert info.steps["admin_failed"].state == "failed"
    assert info.steps["admin_failed"].error == "by hand"
    assert info.steps["after_node"].state == "waiting"
    assert info.steps["after_admin"].state == "cancelled"
    assert await WorkflowRepair(utils.pool, schema="graphile_worker").sweep() == 0


async def test_a_workflow_that_cannot_advance_fails_alone(db: str, utils: WorkerUtils) -> None:
    """Fault injection: the resolution of one workflow raises (here a trigger
    on the steps, as any bug in it would): that workflow ends failed saying
    why; the job's success is recorded, and another workflow and plain jobs
    in the same batches are not held up."""
    rows(
        db,
        f"""
        create function public.break_it() returns trigger language plpgsql as $$
        begin
          if new.ref = 'doomed_child' and new.state = 'queued' then
            raise exception 'resolution bug';
          end if;
          return new;
        end $$;
        create trigger break_it before update on {STEPS}
          for each row execute function public.break_it();
        """,
    )
    ran = Ran()
    doomed = Workflow("doomed")
    parent = doomed.add("work", ref="doomed_parent")
    doomed.add("work", after=[parent], ref="doomed_child")
    fine = Workflow("fine")
    first = fine.add("work", ref="fine_parent")
    fine.add("work", after=[first], ref="fine_child")
    doomed_id = (await utils.add_workflow(doomed)).id
    fine_id = (await utils.add_workflow(fine)).id
    await utils.add_job("work", {"plain": True})
    await drain(db, {"work": ran.task("work")})
    broken = await utils.wait_for_workflow(doomed_id, timeout=10)
    assert broken.state == "failed" and "resolution bug" in (broken.error or "")
    assert broken.steps["doomed_parent"].state == "succeeded"
    assert broken.steps["doomed_child"].state == "cancelled"
    assert "its workflow could not advance: resolution bug" in (
        broken.steps["doomed_child"].error or ""
    )
    assert (await utils.wait_for_workflow(fine_id, timeout=10)).state == "succeeded"
    assert sorted(r for r in ran.refs() if r) == ["doomed_parent", "fine_child", "fine_parent"]
    assert value(db, f"select count(*) from {JOBS}") == 0


async def test_a_child_whose_job_is_refused_fails_alone(db: str, utils: WorkerUtils) -> None:
    rows(
        db,
        """
        create function public.refuse() returns trigger language plpgsql as $$
        begin
          if new.payload::text like '%%poison%%' then raise exception 'poisoned'; end if;
          return new;
        end $$;
        create trigger refuse before insert on graphile_worker._private_jobs
          for each row execute function public.refuse();
        """,
    )
    ran = Ran()
    wf = Workflow()
    root = wf.add("work")
    wf.add("work", {"poison": 1}, after=[root], ref="poisoned")
    wf.add("work", {"fine": 1}, after=[root], ref="fine")
    added = await utils.add_workflow(wf)
    await drain(db, {"work": ran.task("work")})
    info = await utils.wait_for_workflow(added.id, timeout=10)
    assert info.steps["poisoned"].state == "failed"
    assert (info.steps["poisoned"].error or "").startswith("its job could not be added: poisoned")
    assert info.steps["fine"].state == "succeeded"
    assert info.state == "failed"


async def test_finished_workflows_are_pruned(db: str, utils: WorkerUtils) -> None:
    wf = Workflow()
    wf.add("work")
    added = await utils.add_workflow(wf)
    running = (await utils.add_workflow(wf)).id
    rows(
        db,
        f"update {WORKFLOWS} set state = 'succeeded', finished_at = now() - interval '2 days'"
        " where id = %s",
        (added.id,),
    )
    pruner = HistoryPruner(utils, schema="graphile_worker", interval=(60, 60))
    assert await pruner.prune_workflows() == 1
    assert await utils.get_workflow(added.id) is None
    assert value(db, f"select count(*) from {STEPS} where workflow_id = %s", (added.id,)) == 0
    assert await utils.get_workflow(running) is not None


# --- the command line ---------------------------------------------------------------


async def test_the_workflow_commands(db: str, utils: WorkerUtils) -> None:
    wf = Workflow("nightly")
    first = wf.add("fails", max_attempts=1)
    wf.add("after", after=[first])
    added = await utils.add_workflow(wf)

    async def fails(payload: Any, helpers: Helpers) -> None:
        raise ValueError("bad row 12\nmore detail")

    await drain(db, {"fails": fails})
    shown = run_cli("-c", db, "workflow", str(added.id))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"Workflow {added.id} 'nightly': failed (2 steps: 1 failed, 1 cancelled)"
    assert lines[3].split() == ["fails", "failed", "1", "fails", "ValueError:", "bad", "row", "12"]
    assert "more detail" not in shown.stdout  # the first line of each error
    assert lines[4].split()[:4] == ["after", "cancelled", "-", "after"]
    document = json.loads(run_cli("-c", db, "workflow", str(added.id), "--json").stdout)
    assert document["state"] == "failed"
    assert document["steps"]["after"]["error"] == "parent 'fails' failed"
    retried = run_cli("-c", db, "workflow", str(added.id), "--retry")
    assert retried.stdout.startswith("Retried: 2 step(s) run again.")
    listed = run_cli("-c", db, "workflows", "--state", "running")
    assert listed.stdout.splitlines()[1].split()[:3] == [str(added.id), "nightly", "running"]
    cancelled = run_cli("-c", db, "workflow", str(added.id), "--cancel", "--reason", "enough")
    assert "Cancelled" in cancelled.stdout and ": cancelled (" in cancelled.stdout
    lines_json = run_cli("-c", db, "workflows", "--json").stdout.splitlines()
    assert [json.loads(line)["state"] for line in lines_json] == ["cancelled"]
    missing = run_cli("-c", db, "workflow", "999")
    assert missing.returncode == 1
    assert missing.stderr.strip() == "Error: workflow 999 does not exist (never added, or pruned)"
    assert run_cli("-c", db, "workflow", "x").returncode == 2


# --- the README's example, as written ------------------------------------------------


def readme_section(title: str) -> str:
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_the_readme_workflow_runs_as_written(db: str, tmp_path: Path) -> None:
    section = readme_section("Workflows")
    for block in re.findall(r"```python\n(.*?)```", section, flags=re.S):
        path = tmp_path / block.splitlines()[0].removeprefix("# ")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block, encoding="utf-8")
    [commands] = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    done = subprocess.run(
        ["bash", "-e", "-c", commands],
        cwd=tmp_path,
        env=app_env(db),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("workflow 1\nworkflow 2\nworkflow 3\n")
    assert "order 2: {'charge': 'failed'}" in done.stderr
    assert "order 1: {'charge': 'succeeded'}" in done.stderr
    batch_line = "order 3: {'job-1': 'succeeded', 'job-2': 'succeeded', 'job-3': 'succeeded'}"
    assert batch_line in done.stderr
    shown = done.stdout.splitlines()[3:]
    [expected] = re.findall(r"```text\n(.*?)```", section, flags=re.S)
    lines = expected.splitlines()
    assert shown[0] == lines[0]

    def without_job(line: str) -> list[str]:
        cells = line.split()
        return cells[:2] + cells[3:] if len(cells) > 2 else cells

    assert [without_job(line) for line in shown[-4:]] == [without_job(line) for line in lines[-4:]]


async def test_pauses_and_limits_hold_step_jobs_as_any_job(db: str, utils: WorkerUtils) -> None:
    """A step's job is an ordinary job: a pause of its task holds it (its
    workflow waits), and a limit on its task bounds how many run at once."""
    running = 0
    most = 0

    async def step(payload: Any, helpers: Helpers) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.02)
        running -= 1

    wf = Workflow()
    first = wf.add("first")
    fanned = [wf.add("limited", {"n": n}, after=[first]) for n in range(12)]
    wf.add("paused", after=fanned)
    added = await utils.add_workflow(wf)
    await utils.pause(task="paused")
    await utils.set_limit(Limit(max_running=2), task="limited")
    tasks = {"first": step, "limited": step, "paused": step}
    await drain(db, tasks, concurrency=10)
    info = await utils.get_workflow(added.id)
    assert info is not None and info.state == "running"
    assert info.steps["paused"].state == "paused"
    assert all(info.steps[s.ref].state == "succeeded" for s in fanned)
    assert most == 2  # the limit held among the 12 fanned-out steps
    assert await utils.resume(task="paused")
    await drain(db, tasks, concurrency=10)
    assert (await utils.wait_for_workflow(added.id, timeout=10)).state == "succeeded"
