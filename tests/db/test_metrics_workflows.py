"""graphile_worker_workflows{state}, scraped over HTTP: the workflows running
now, and those that finished in the last day by state, each counted through
its index up to a cap."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from dbhelpers import rows
from metrics_scrape import Samples, scrape_async, served
from workers import worker

from worker_cli import Helpers, WorkerUtils, Workflow, run_once
from worker_cli.observe import queue_depth
from worker_cli.sql import compose
from worker_cli.sql import workflow_metrics as workflow_metrics_sql

pytestmark = pytest.mark.db

WORKFLOWS = "graphile_worker._private_py_workflows"
METRIC = "graphile_worker_workflows"


def by_state(samples: Samples) -> dict[str, float]:
    return {
        dict(labels)["state"]: count for (name, labels), count in samples.items() if name == METRIC
    }


async def ok(payload: Any, helpers: Helpers) -> None:
    pass


async def fails(payload: Any, helpers: Helpers) -> None:
    raise ValueError("no")


def one_step(task: str, name: str) -> Workflow:
    wf = Workflow(name)
    wf.add(task, max_attempts=1)
    return wf


async def scrape_workflows(db: str) -> dict[str, float]:
    """The family, as a worker that runs none of the workflows' tasks serves it."""
    async with served() as server, worker(db, {"other": ok}, metrics_registry=server.registry):
        return by_state(await scrape_async(server.url))


async def test_workflows_running_and_finished_in_the_last_day(
    db: str, utils: WorkerUtils, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Running now (their steps not run), and finished in the last day by
    state; one finished two days ago is not counted; a state with none is 0."""
    assert await scrape_workflows(db) == {
        "running": 0,
        "succeeded": 0,
        "failed": 0,
        "cancelled": 0,
    }
    for name in ("done", "done too", "old"):
        await utils.add_workflow(one_step("ok", name))
    broken = await utils.add_workflow(one_step("fails", "broken"))
    async with asyncio.timeout(60):
        tasks = {"ok": ok, "fails": fails}
        assert await run_once(db, task_list=tasks, no_handle_signals=True) == 0
    stopped = await utils.add_workflow(one_step("later", "stopped"))
    assert await utils.cancel_workflow(stopped.id) == "cancelled"
    for n in range(3):
        await utils.add_workflow(one_step("later", f"waiting {n}"))
    rows(db, f"update {WORKFLOWS} set finished_at = now() - interval '2 days' where name = 'old'")
    info = await utils.get_workflow(broken.id)
    assert info is not None and info.state == "failed"
    assert await scrape_workflows(db) == {
        "running": 3,
        "succeeded": 2,
        "failed": 1,
        "cancelled": 1,
    }
    # Each counted up to the cap: the running ones; the finished ones
    # together, the last to finish first (the cancelled one, then one of the
    # three run_once finished).
    monkeypatch.setattr(queue_depth, "WORKFLOWS_CAP", 2)
    capped = await scrape_workflows(db)
    assert (capped["running"], capped["cancelled"]) == (2, 1), capped
    assert capped["succeeded"] + capped["failed"] == 1, capped


def test_the_count_reads_the_two_indexes(db: str) -> None:
    """On 100,000 workflows, none is read sequentially: the running ones
    through their partial index, the finished ones through the index on
    finished_at, each at most the cap."""
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            f"""
            insert into {WORKFLOWS} (name, state, steps, steps_left, created_at, finished_at)
            select 'wf', s.state, 1, case when s.state = 'running' then 1 else 0 end,
              now() - n * interval '10 seconds',
              case when s.state <> 'running' then now() - n * interval '10 seconds' end
            from generate_series(1, 100000) as n
            cross join lateral (
              select case when n % 50 = 0 then 'running' when n % 10 = 0 then 'failed'
                else 'succeeded' end as state
            ) as s
            """
        )
        conn.execute(f"analyze {WORKFLOWS}")
        query = psycopg.sql.SQL("explain (analyze, format json) ") + compose(
            workflow_metrics_sql.WORKFLOWS_BY_STATE, "graphile_worker"
        )
        [(plan,)] = conn.execute(query, {"cap": 1000}).fetchall()
        found = dict(
            conn.execute(
                compose(workflow_metrics_sql.WORKFLOWS_BY_STATE, "graphile_worker"),
                {"cap": 100_000},
            ).fetchall()
        )
    scans = [
        node
        for node in nodes_of(plan[0]["Plan"])
        if node.get("Relation Name") == "_private_py_workflows"
    ]
    assert {node["Index Name"] for node in scans} == {
        "_private_py_workflows_running",
        "_private_py_workflows_finished_at",
    }, scans
    for node in scans:
        assert node["Actual Rows"] + node.get("Rows Removed by Filter", 0) <= 1000, node
    # Every 50th is running (2,000); the others finished one every 10 s, so
    # 8,639 of them in the last day, less the 172 running: 8,467, of which
    # every 10th (691) failed.
    assert found == {"running": 2000, "succeeded": 7776, "failed": 691}


def nodes_of(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += nodes_of(child)
    return found
