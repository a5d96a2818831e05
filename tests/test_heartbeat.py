"""Opt-in heartbeats: a crashed pool's jobs come back within about the timeout."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dbhelpers import rows, run_cli, value
from fault_helpers import (
    Worker,
    create_runs,
    kill,
    kill_leftover_workers,
    listening,
    record_tasks,
    sigkill_drain,
    sigterm_all,
    wait_until,
)
from node_worker import NodeWorker

from worker_cli.options import WorkerOptions

INTERVAL, TIMEOUT = 0.5, 3.0
HEARTBEAT = ("--heartbeat-interval", str(INTERVAL), "--heartbeat-timeout", str(TIMEOUT))


@pytest.fixture(autouse=True)
def _no_worker_outlives_its_test() -> Iterator[None]:
    yield
    kill_leftover_workers()


# Sleeps for as long as the payload says on its first attempt only, then records the run.
FIRST_ATTEMPT_HANGS = """\
import asyncio, os


async def task(payload, helpers):
    if helpers.job.attempts == 1:
        await asyncio.sleep(payload["sleep"])
    await helpers.query(
        "insert into public.runs (job_id, pool, pid, attempt, finished) "
        "values (%s, %s, %s, %s, clock_timestamp())",
        (helpers.job.id, helpers.job.locked_by, os.getpid(), helpers.job.attempts),
    )
"""

HEARTBEATS = "select pool_id, pid, extract(epoch from timeout) as timeout, beat_at "
HEARTBEATS += "from graphile_worker._private_py_heartbeats"


def hanging_task(folder: Path) -> Path:
    (folder / "tasks").mkdir(parents=True, exist_ok=True)
    (folder / "tasks" / "hang.py").write_text(FIRST_ATTEMPT_HANGS)
    return folder


def locked_by(db: str, job_id: int) -> str | None:
    return value(db, "select locked_by from graphile_worker._private_jobs where id = %s", (job_id,))


def add_hanging_job(db: str, sleep: float, queue: str | None = None) -> int:
    return int(
        value(
            db,
            "select id from graphile_worker.add_job('hang', json_build_object('sleep', %s), %s)",
            (sleep, queue),
        )
    )


def test_sigkill_with_heartbeats_recovers_within_the_timeout(db: str, tmp_path: Path) -> None:
    report = sigkill_drain(
        db,
        record_tasks(tmp_path),
        jobs=2000,
        seed=9,  # two kills
        worker_args=("-j", "10", "--poll-interval", "200", *HEARTBEAT),
        recover=lambda pools, live: [],  # nobody intervenes: the heartbeats do it
        recovery_timeout=TIMEOUT + 15,
    )
    print("\n" + report.line(f"SIGKILL with heartbeats (interval {INTERVAL}s, timeout {TIMEOUT}s)"))
    for seconds in report.released_after_kill:
        # The last beat came at most one interval before the kill; a live pool
        # looks once per interval (plus slack for a loaded machine).
        assert TIMEOUT - INTERVAL - 0.2 <= seconds <= TIMEOUT + INTERVAL + 3, report
    assert value(db, "select count(*) from graphile_worker._private_py_heartbeats") == 0


def test_a_dead_pool_is_released_with_its_queue_and_the_attempt_counts(
    db: str, tmp_path: Path
) -> None:
    folder = hanging_task(tmp_path)
    create_runs(db)
    job_id = add_hanging_job(db, 60, queue="serial")
    doomed = Worker(db, folder, *HEARTBEAT)
    wait_until(lambda: locked_by(db, job_id) is not None, 30, "the job to be taken")
    [beat] = rows(db, HEARTBEATS)
    assert beat["pid"] == doomed.pid and float(beat["timeout"]) == TIMEOUT
    dead_pool = beat["pool_id"]
    assert locked_by(db, job_id) == dead_pool
    kill(db, doomed)
    killed_at = time.monotonic()

    survivor = Worker(db, folder, "--poll-interval", "60000", *HEARTBEAT)
    wait_until(lambda: locked_by(db, job_id) != dead_pool, TIMEOUT + 10, "the release")
    released_after = time.monotonic() - killed_at
    wait_until(lambda: value(db, "select count(*) from public.runs") == 1, 10, "the re-run")
    assert sigterm_all([survivor]) == [0]
    log = survivor.log()
    print(f"\nheartbeat: a killed pool's job released {released_after:.2f}s after the kill")
    assert TIMEOUT - INTERVAL - 0.2 <= released_after <= TIMEOUT + INTERVAL + 3
    assert f"declared worker pool {dead_pool} (host " in log
    assert "released 1 job(s) and 1 queue(s)" in log
    # The lost attempt counted: the re-run was the second attempt.
    assert rows(db, "select attempt from public.runs") == [{"attempt": 2}]
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0
    assert (
        value(
            db,
            "select count(*) from graphile_worker._private_job_queues where locked_by is not null",
        )
        == 0
    )
    assert rows(db, HEARTBEATS) == []  # the dead row is gone, the survivor removed its own


def test_released_job_keeps_its_attempt_and_says_why(db: str, tmp_path: Path) -> None:
    # Only the one attempt it had: once released it is failed for good, with the reason.
    folder = hanging_task(tmp_path)
    create_runs(db)
    job_id = int(
        value(
            db,
            "select id from graphile_worker.add_job('hang', '{\"sleep\": 60}', max_attempts => 1)",
        )
    )
    doomed = Worker(db, folder, *HEARTBEAT)
    wait_until(lambda: locked_by(db, job_id) is not None, 30, "the job to be taken")
    dead_pool = locked_by(db, job_id)
    kill(db, doomed)
    survivor = Worker(db, folder, *HEARTBEAT)
    wait_until(lambda: locked_by(db, job_id) is None, TIMEOUT + 10, "the release")
    time.sleep(0.5)  # the survivor must not run it: no attempt is left
    assert sigterm_all([survivor]) == [0]
    [job] = rows(db, "select attempts, max_attempts, last_error from graphile_worker.jobs")
    assert (job["attempts"], job["max_attempts"]) == (1, 1)
    assert job["last_error"].startswith(f"the worker pool {dead_pool} (host ")
    assert "was declared dead: no heartbeat since" in job["last_error"]
    assert value(db, "select count(*) from public.runs") == 0


def test_pools_without_heartbeat_are_never_released(
    db: str, tmp_path: Path, node: NodeWorker
) -> None:
    """Node workers and Python pools with heartbeats off keep their jobs, however
    long a pool with heartbeats watches them."""
    folder = hanging_task(tmp_path / "py")
    node_folder = tmp_path / "node"
    (node_folder / "tasks").mkdir(parents=True)
    (node_folder / "tasks" / "hang.cjs").write_text(
        "module.exports = async (payload, helpers) => {\n"
        "  // Runs until the test inserts into public.go.\n"
        "  while ((await helpers.query('select count(*)::int as n from public.go')).rows[0].n"
        " === 0) {\n"
        "    await new Promise((resolve) => setTimeout(resolve, 100));\n"
        "  }\n"
        "  await helpers.query('insert into public.runs (job_id, pool, attempt, finished) "
        "values ($1, $2, $3, clock_timestamp())', "
        "[helpers.job.id, helpers.job.locked_by, helpers.job.attempts]);\n"
        "};\n"
    )
    rows(db, "create table public.go (n int)")
    create_runs(db)
    node_job = add_hanging_job(db, 0)
    node_proc = Worker(db, node_folder, "-c", db, command=["node", str(node.cli)])
    try:
        wait_until(lambda: locked_by(db, node_job) is not None, 30, "Node to take its job")
        node_pool = locked_by(db, node_job)
        plain = Worker(db, folder)  # heartbeats off
        python_job = add_hanging_job(db, 60)
        wait_until(lambda: locked_by(db, python_job) is not None, 30, "the plain pool's job")
        plain_pool = locked_by(db, python_job)
        kill(db, plain)
        watcher = Worker(db, folder, *HEARTBEAT)
        wait_until(lambda: listening(db) == 1 + 1, 30, "the watcher")  # watcher + Node
        time.sleep(TIMEOUT + 2 * INTERVAL)
        assert locked_by(db, python_job) == plain_pool
        assert locked_by(db, node_job) == node_pool
        rows(db, "insert into public.go values (1)")
        wait_until(lambda: value(db, "select count(*) from public.runs") == 1, 30, "Node's run")
        assert sigterm_all([watcher]) == [0]
    finally:
        node_proc.signal(signal.SIGINT)
        node_proc.wait()
    assert rows(db, "select job_id, attempt from public.runs") == [
        {"job_id": node_job, "attempt": 1}
    ]
    assert "declared worker pool" not in watcher.log()


def test_a_frozen_pool_declared_dead_says_so_and_beats_again(db: str, tmp_path: Path) -> None:
    folder = hanging_task(tmp_path)
    create_runs(db)
    frozen = Worker(db, folder, *HEARTBEAT)
    job_id = add_hanging_job(db, 0.5)
    wait_until(lambda: locked_by(db, job_id) is not None, 30, "the job to be taken")
    frozen_pool = locked_by(db, job_id)
    frozen.signal(signal.SIGSTOP)  # a paused VM, a stuck process: alive but silent
    try:
        watcher = Worker(db, folder, "--poll-interval", "100", *HEARTBEAT)
        wait_until(lambda: locked_by(db, job_id) != frozen_pool, TIMEOUT + 10, "the release")
    finally:
        frozen.signal(signal.SIGCONT)
    wait_until(
        lambda: value(db, HEARTBEATS + " where pool_id = %s", (frozen_pool,)) is not None,
        10,
        "the frozen pool to beat again",
    )
    wait_until(lambda: value(db, "select count(*) from graphile_worker._private_jobs") == 0, 30, "")
    assert sigterm_all([frozen, watcher]) == [0, 0]
    assert f"Worker pool {frozen_pool} was declared dead by another worker" in frozen.log()
    assert f"declared worker pool {frozen_pool}" in watcher.log()
    assert rows(db, HEARTBEATS) == []


def test_a_long_graceful_shutdown_keeps_beating(db: str, tmp_path: Path) -> None:
    """A pool finishing a job for longer than the timeout after SIGTERM is not dead."""
    folder = hanging_task(tmp_path)
    create_runs(db)
    stopping = Worker(db, folder, *HEARTBEAT)
    job_id = add_hanging_job(db, TIMEOUT + 2 * INTERVAL + 1)
    wait_until(lambda: locked_by(db, job_id) is not None, 30, "the job to be taken")
    watcher = Worker(db, folder, "--poll-interval", "100", *HEARTBEAT)
    stopping.signal(signal.SIGTERM)  # the job ignores abort_signal: the stop waits for it
    assert stopping.wait(TIMEOUT + 15) == 0
    assert sigterm_all([watcher]) == [0]
    assert rows(db, "select attempt from public.runs") == [{"attempt": 1}]  # ran once
    assert "declared worker pool" not in watcher.log()
    assert rows(db, HEARTBEATS) == []


def test_heartbeat_options(db: str, tmp_path: Path) -> None:
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "t.py").write_text("async def task(p, h): pass\n")
    for args, message in [
        (["--heartbeat-timeout", "60"], "--heartbeat-timeout needs --heartbeat-interval"),
        (["--heartbeat-interval", "10", "--heartbeat-timeout", "15"], "at least twice"),
        (["--heartbeat-interval", "0"], "Invalid value for '--heartbeat-interval'"),
    ]:
        result = run_cli("-c", db, "--once", *args, cwd=tmp_path)
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    result = run_cli(
        "-c",
        db,
        "--once",
        cwd=tmp_path,
        env={"GRAPHILE_WORKER_HEARTBEAT_INTERVAL": "1", "GRAPHILE_WORKER_HEARTBEAT_TIMEOUT": "7"},
    )
    assert result.returncode == 0, result.stderr
    assert "heartbeat every 1s; declared dead after 7s without one" in result.stderr
    assert rows(db, HEARTBEATS) == []  # removed on a clean exit
    help_text = run_cli("--help").stdout
    assert "--heartbeat-interval" in help_text and "GRAPHILE_WORKER_HEARTBEAT_TIMEOUT" in help_text
    with pytest.raises(ValueError, match="at least twice"):
        WorkerOptions(heartbeat_interval=1, heartbeat_timeout=1.5)
