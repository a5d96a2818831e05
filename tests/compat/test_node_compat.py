"""Our schema and SQL API against the real graphile-worker 0.18.0 from npm."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from catalog import differences, snapshot
from dbhelpers import rows, value
from node_worker import NodeWorker
from pg_server import PgServer
from workers import until

from worker_cli import Helpers, JobSpec, Workflow, make_worker_utils, run_once
from worker_cli.schema.migrate import MigrationFiles, migrate
from worker_cli.worker.background.workflow_repair import WorkflowRepair

pytestmark = [pytest.mark.db, pytest.mark.node]


# A Node task that records each run in a table, in the order they ran.
RECORDING_TASK = """\
module.exports = async (payload, helpers) => {
  await helpers.query(
    "insert into public.ran (task, payload, job_id) values ($1, $2, $3)",
    [helpers.job.task_identifier, JSON.stringify(payload), helpers.job.id],
  );
};
"""


@pytest.fixture
def node_tasks(tmp_path: Path) -> Path:
    """A Node worker folder whose tasks/ has recording tasks a, b and c."""
    tasks = tmp_path / "node_worker" / "tasks"
    tasks.mkdir(parents=True)
    for name in ("a", "b", "c"):
        (tasks / f"{name}.cjs").write_text(RECORDING_TASK)
    return tasks.parent


def create_ran_table(url: str) -> None:
    rows(
        url,
        "create table public.ran (seq serial primary key, task text, payload json, job_id bigint)",
    )


def ran(url: str) -> list[dict[str, object]]:
    return rows(url, "select task, payload from public.ran order by seq")


async def test_node_sees_our_schema_as_current_and_runs_our_jobs(
    db: str, node: NodeWorker, node_tasks: Path
) -> None:
    before = rows(db, "select id, ts, breaking from graphile_worker.migrations order by id")
    result = node.run("-c", db, "--schema-only")
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert "warn" not in output.lower() and "revision" not in output.lower(), output
    assert rows(db, "select id, ts, breaking from graphile_worker.migrations order by id") == before

    create_ran_table(db)
    async with make_worker_utils(connection_string=db) as utils:
        await utils.add_job("a", {"hello": "from python"})
    result = node.run("-c", db, "--once", cwd=node_tasks)
    assert result.returncode == 0, result.stderr
    assert ran(db) == [{"task": "a", "payload": {"hello": "from python"}}]
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0


async def test_after_node_migration_we_run_nothing_and_node_runs_our_rows(
    empty_db: str, node: NodeWorker, node_tasks: Path
) -> None:
    result = node.run("-c", empty_db, "--schema-only")
    assert result.returncode == 0, result.stderr
    async with await psycopg.AsyncConnection.connect(empty_db, autocommit=True) as conn:
        report = await migrate(conn, "graphile_worker")
    # Node's revisions are all there; only our own objects are added.
    assert report.applied == () and report.revision == 20
    assert report.applied_py == tuple(MigrationFiles().py_revisions())

    create_ran_table(empty_db)
    past = datetime.now(UTC) - timedelta(minutes=1)
    async with make_worker_utils(connection_string=empty_db) as utils:
        await utils.add_job("c", {"p": 5}, priority=5, queue_name="serial")
        await utils.add_job("b", {"p": 0}, job_key="b-key", run_at=past)
        await utils.add_job("b", {"p": 0, "replaced": True}, job_key="b-key", run_at=past)
        await utils.add_jobs(
            [
                JobSpec(identifier="a", payload={"p": -1}, priority=-1, flags=["x"]),
                # Another queue: Node's --once can exit before it fetches a job from
                # the queue its previous job has just released.
                JobSpec(identifier="a", payload={"p": 9}, priority=9, queue_name="other"),
            ]
        )
        future = await utils.add_job(
            "a", {"later": True}, run_at=datetime.now(UTC) + timedelta(hours=1)
        )
    result = node.run("-c", empty_db, "--once", "-j", "1", cwd=node_tasks)
    assert result.returncode == 0, result.stderr
    assert ran(empty_db) == [
        {"task": "a", "payload": {"p": -1}},
        {"task": "b", "payload": {"p": 0, "replaced": True}},
        {"task": "c", "payload": {"p": 5}},
        {"task": "a", "payload": {"p": 9}},
    ]
    assert [r["id"] for r in rows(empty_db, "select id from graphile_worker.jobs")] == [future.id]


async def test_node_runs_a_job_added_by_sql_after_our_migration(
    db: str, node: NodeWorker, node_tasks: Path
) -> None:
    create_ran_table(db)
    rows(db, "select graphile_worker.add_job('b', '{\"via\": \"sql\"}')")
    rows(
        db,
        "select graphile_worker.add_jobs(array[('c', '[1]', null, null, null, null, null, null)"
        "::graphile_worker.job_spec])",
    )
    result = node.run("-c", db, "--once", cwd=node_tasks)
    assert result.returncode == 0, result.stderr
    assert sorted(map(str, ran(db))) == sorted(
        map(
            str,
            [
                {"task": "b", "payload": {"via": "sql"}},
                {"task": "c", "payload": [1]},
            ],
        )
    )


@pytest.mark.parametrize("schema", ["graphile_worker", "My Jobs"])
async def test_same_structure_as_node(pg: PgServer, node: NodeWorker, schema: str) -> None:
    with pg.database() as ours, pg.database() as theirs:
        async with await psycopg.AsyncConnection.connect(ours, autocommit=True) as conn:
            await migrate(conn, schema)
        result = node.run("-c", theirs, "--schema-only", "--schema", schema)
        assert result.returncode == 0, result.stderr
        mine, reference = snapshot(ours, schema), snapshot(theirs, schema)
        assert not differences(mine, reference), "\n".join(differences(mine, reference))
        # The comparison really looked at something.
        assert len(reference["columns"]) > 50 and len(reference["functions"]) == 7


# A Node task that waits for a row in public.go, then fails.
WAIT_THEN_FAIL_TASK = """\
module.exports = async (payload, helpers) => {
  const record = "insert into public.ran (task, job_id) values ('slow', $1)";
  await helpers.query(record, [helpers.job.id]);
  for (;;) {
    const { rows } = await helpers.query("select count(*)::int as n from public.go");
    if (rows[0].n > 0) break;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  throw new Error("node failed it");
};
"""


async def test_the_states_of_jobs_node_runs_and_a_cancel_node_cannot_stop(
    db: str, node: NodeWorker, node_tasks: Path
) -> None:
    """Node completes a job: no history, so unknown; Node fails a job we
    cancelled while it ran: never retried, then recorded as cancelled."""
    from worker_cli.worker.background.pruner import HistoryPruner

    create_ran_table(db)
    rows(db, "create table public.go (x int)")
    (node_tasks / "tasks" / "slow.cjs").write_text(WAIT_THEN_FAIL_TASK)
    async with make_worker_utils(connection_string=db) as utils:
        done = await utils.add_job("a", {})
        result = node.run("-c", db, "--once", cwd=node_tasks)
        assert result.returncode == 0, result.stderr
        assert await utils.get_job_status(done.id) == "unknown"

        slow = await utils.add_job("slow", {}, max_attempts=5)
        proc = await asyncio.create_subprocess_exec(*node.argv("-c", db, "--once"), cwd=node_tasks)
        try:
            running = "select count(*) from public.ran where task = 'slow'"
            await until(lambda: value(db, running), within=30, what="the Node task running")
            assert await utils.cancel_job(slow.id, "stop") == "running"
            rows(db, "insert into public.go values (1)")
            async with asyncio.timeout(30):
                assert await proc.wait() == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        # Node failed it, and cannot retry it: attempts were used up by the cancel.
        [row] = rows(db, "select attempts, max_attempts, locked_by, last_error "
                         "from graphile_worker._private_jobs")  # fmt: skip
        assert row["attempts"] == row["max_attempts"] and row["locked_by"] is None
        assert "node failed it" in row["last_error"]
        assert value(db, "select count(*) from public.ran where task = 'slow'") == 1
        pruner = HistoryPruner(utils, schema="graphile_worker", interval=(60, 120))
        assert await pruner.finalize_cancelled() == 1
        record = await utils.get_job_result(slow.id)
        assert (record.state, record.cancel_reason) == ("cancelled", "stop")
        assert "node failed it" in (record.last_error or "")


async def test_a_workflow_advances_through_node_steps(
    db: str, node: NodeWorker, node_tasks: Path
) -> None:
    """A step whose task only Node has: Node runs its job (deleting the row on
    success, failing it for good on error) and the repair sweep records the
    outcome; the step after it then runs on a Python worker."""
    create_ran_table(db)
    wf = Workflow("mixed")
    node_step = wf.add("a", {"from": "python"}, ref="node_step")
    python_step = wf.add("py_task", after=[node_step], ref="python_step")
    wf.add("b", after=[python_step], ref="node_again")
    seen: list[dict[str, object]] = []

    async def py_task(payload: object, helpers: Helpers) -> str:
        seen.append({ref: (p.state, p.result) for ref, p in helpers.parents.items()})
        return "from python"

    async with make_worker_utils(connection_string=db) as utils:
        added = await utils.add_workflow(wf)
        result = node.run("-c", db, "--once", cwd=node_tasks)
        assert result.returncode == 0, result.stderr
        assert ran(db) == [{"task": "a", "payload": {"from": "python"}}]
        info = await utils.get_workflow(added.id)
        assert info is not None and info.steps["node_step"].state == "unknown"
        # A Python worker's repair sweep records it: succeeded, with no result.
        assert await WorkflowRepair(utils.pool, schema="graphile_worker").sweep() == 1
        assert await run_once(db, task_list={"py_task": py_task}, no_handle_signals=True) == 0
        assert seen == [{"node_step": ("succeeded", None)}]
        result = node.run("-c", db, "--once", cwd=node_tasks)
        assert result.returncode == 0, result.stderr
        assert await WorkflowRepair(utils.pool, schema="graphile_worker").sweep() == 1
        info = await utils.get_workflow(added.id)
        assert info is not None and info.state == "succeeded"
        assert info.steps["python_step"].result == "from python"
