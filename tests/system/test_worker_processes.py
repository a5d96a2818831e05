"""Worker processes as users run them: the CLI, several processes, Node beside us."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from dbhelpers import cli_path, rows, run_cli, value
from node_worker import NodeWorker
from worker_fleet import (
    create_runs,
    make_tasks,
    overlapping_runs,
    start,
    stop,
    wait_for,
    wait_until_listening,
)

from worker_cli import WorkerUtils

pytestmark = pytest.mark.db


@pytest.mark.slow
async def test_four_processes_drain_5000_jobs_each_once(
    utils: WorkerUtils, db: str, tmp_path: Path
) -> None:
    folder = make_tasks(tmp_path, ["record"])
    create_runs(db)
    await utils.add_jobs([{"identifier": "record", "payload": {"n": n}} for n in range(5000)])
    procs = [start([cli_path(), "-c", db, "--once", "-j", "10"], folder) for _ in range(4)]
    results = [(p.wait(timeout=300), p.stderr.read() if p.stderr else "") for p in procs]
    assert [code for code, _ in results] == [0, 0, 0, 0], results
    assert value(db, "select count(*) from public.runs") == 5000
    assert value(db, "select count(distinct job_id) from public.runs") == 5000
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0


async def test_named_queues_stay_serial_across_processes(
    utils: WorkerUtils, db: str, tmp_path: Path
) -> None:
    folder = make_tasks(tmp_path, ["record"])
    create_runs(db)
    procs = [start([cli_path(), "-c", db, "-j", "10"], folder) for _ in range(3)]
    wait_until_listening(db, 3)
    await utils.add_jobs(
        [
            {"identifier": "record", "payload": {"sleep": 0.01, "n": n}, "queue_name": f"q{n % 5}"}
            for n in range(100)
        ]
        + [{"identifier": "record", "payload": {"sleep": 0.01}} for _ in range(100)]
    )
    wait_for(db, "select count(*) from public.runs", 200)
    assert [code for code, _ in stop(procs)] == [0, 0, 0]
    assert overlapping_runs(db) == [], "two jobs of one named queue ran at the same time"
    # Each queue ran its jobs (all 20 of them) in the order they were added.
    queues = [
        r["job_queue_id"]
        for r in rows(
            db,
            "select distinct job_queue_id from public.runs where job_queue_id is not null",
        )
    ]
    assert len(queues) == 5, queues
    for queue in queues:
        ns = [
            r["n"]
            for r in rows(
                db,
                "select (payload->>'n')::int as n from public.runs "
                "where job_queue_id = %s order by started",
                (queue,),
            )
        ]
        assert len(ns) == 20 and ns == sorted(ns), f"queue {queue} ran out of order: {ns}"
    # The queue-less jobs did run in parallel.
    assert (
        value(
            db,
            "select count(*) from public.runs a join public.runs b "
            "on a.job_queue_id is null and b.job_queue_id is null and a.seq < b.seq "
            "and a.started < b.finished and b.started < a.finished",
        )
        > 0
    )


@pytest.mark.node
@pytest.mark.slow
async def test_mixed_fleet_with_node(
    utils: WorkerUtils, db: str, tmp_path: Path, node: NodeWorker
) -> None:
    py_folder = make_tasks(tmp_path / "py", ["py_task", "shared_queue_py"])
    node_folder = make_tasks(tmp_path / "node", ["node_task", "shared_queue_node"], node=True)
    create_runs(db)
    jobs = [{"identifier": "py_task", "payload": {"n": n}} for n in range(20)]
    jobs += [{"identifier": "node_task", "payload": {"n": n}} for n in range(20)]
    jobs += [{"identifier": "py_task", "payload": {"spawn": "node_task"}}]
    jobs += [{"identifier": "node_task", "payload": {"spawn": "py_task"}}]
    jobs += [
        {
            "identifier": f"shared_queue_{'py' if n % 2 else 'node'}",
            "payload": {"sleep": 0.02, "n": n},
            "queue_name": "shared",
        }
        for n in range(30)
    ]
    procs = [
        start([cli_path(), "-c", db, "-j", "5"], py_folder),
        start(node.argv("-c", db, "-j", "5"), node_folder),
    ]
    wait_until_listening(db, 2)
    await utils.add_jobs(jobs)
    try:
        wait_for(db, "select count(*) from public.runs", len(jobs) + 2)
    finally:
        outcomes = stop(procs)
    assert outcomes[0][0] == 0, outcomes[0][1]
    runs = rows(db, "select task, runner, payload from public.runs")
    assert {(r["task"].removeprefix("shared_queue_"), r["runner"]) for r in runs} == {
        ("py_task", "python"),
        ("node_task", "node"),
        ("py", "python"),
        ("node", "node"),
    }
    assert {"task": "node_task", "runner": "node", "payload": {"from": "python"}} in runs
    assert {"task": "py_task", "runner": "python", "payload": {"from": "node"}} in runs
    assert overlapping_runs(db) == []
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0


def test_cli_runs_a_job_added_from_sql(db: str, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "hello.py").write_text(
        "async def task(payload, helpers):\n"
        "    helpers.logger.info(f\"Hello, {payload['name']}\")\n"
    )
    rows(db, "select graphile_worker.add_job('hello', '{\"name\": \"Bobby Tables\"}')")
    result = run_cli("-c", db, "--once", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Hello, Bobby Tables" in result.stderr
    assert "Completed task 1 (hello" in result.stderr
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0


@pytest.mark.parametrize(
    "files,args,message",
    [
        ({}, [], "tasks folder 'tasks' does not exist"),
        ({"tasks/broken.py": "def task(:\n"}, [], "task file 'broken.py' failed to import: line 1"),
        ({"tasks/empty.py": "x = 1\n"}, [], "task file 'empty.py' has no callable `task`"),
        (
            {"elsewhere/t.py": "async def task(p, h): pass\n"},
            ["--tasks", "missing"],
            "tasks folder 'missing' does not exist",
        ),
    ],
)
def test_cli_task_problems_are_one_line_exit_1(
    db: str, tmp_path: Path, files: dict[str, str], args: list[str], message: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    result = run_cli("-c", db, "--once", *args, cwd=tmp_path)
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["--once", "--schema-only"], "--once and --schema-only cannot be used together"),
        (["-j", "0"], "Invalid value for '-j' / '--jobs'"),
        (["--poll-interval", "soon"], "Invalid value for '--poll-interval'"),
        (["--cleanup", "GC_EVERYTHING"], "unknown cleanup task GC_EVERYTHING"),
    ],
)
def test_cli_bad_options(db: str, args: list[str], message: str) -> None:
    result = run_cli("-c", db, *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_cleanup(db: str) -> None:
    rows(db, "select graphile_worker.add_job('t', queue_name => 'q')")
    rows(db, "delete from graphile_worker._private_jobs")
    result = run_cli("-c", db, "--cleanup", "gc_job_queues,GC_TASK_IDENTIFIERS")
    assert result.returncode == 0, result.stderr
    assert value(db, "select count(*) from graphile_worker._private_job_queues") == 0
    assert value(db, "select count(*) from graphile_worker._private_tasks") == 0


def test_cli_warns_when_the_pool_is_smaller_than_the_concurrency(db: str, tmp_path: Path) -> None:
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "t.py").write_text("async def task(p, h): pass\n")
    result = run_cli("-c", db, "--once", "-j", "5", "-m", "3", cwd=tmp_path)
    assert result.returncode == 0
    assert "max_pool_size (3) is smaller than the concurrency (5)" in result.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_cli_signal_graceful_then_forced(db: str, tmp_path: Path, signum: signal.Signals) -> None:
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "slow.py").write_text(
        "import asyncio\nasync def task(p, h):\n    await asyncio.sleep(p['sleep'])\n"
    )
    rows(db, "select graphile_worker.add_job('slow', '{\"sleep\": 0.5}')")
    proc = start([cli_path(), "-c", db], tmp_path)
    wait_for(
        db, "select count(*) from graphile_worker._private_jobs where locked_by is not null", 1, 30
    )
    proc.send_signal(signum)
    assert proc.wait(timeout=30) == 0
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0  # it finished

    rows(db, "select graphile_worker.add_job('slow', '{\"sleep\": 60}')")
    proc = start([cli_path(), "-c", db], tmp_path)
    wait_for(
        db, "select count(*) from graphile_worker._private_jobs where locked_by is not null", 1, 30
    )
    proc.send_signal(signum)
    time.sleep(0.5)
    assert proc.poll() is None  # still waiting for the job
    proc.send_signal(signum)
    assert proc.wait(timeout=30) == 0
    [job] = rows(db, "select attempts, locked_by, last_error from graphile_worker._private_jobs")
    assert job["locked_by"] is None and job["attempts"] == 1
    assert "stopped while the job was running" in job["last_error"]
