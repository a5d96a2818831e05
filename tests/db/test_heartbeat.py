"""Heartbeats: a silent pool's jobs come back within about the timeout."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dbhelpers import rows, run_cli, value
from fault_helpers import (
    Worker,
    create_runs,
    kill,
    listening,
    record_tasks,
    sigkill_drain,
    sigterm_all,
    started_worker,
    wait_until,
)
from node_worker import NodeWorker

import worker_cli
from worker_cli import Helpers, run
from worker_cli.config.options import WorkerOptions
from worker_cli.tasks.loader import make_task_list
from worker_cli.worker import WorkerPool

pytestmark = pytest.mark.db


INTERVAL, TIMEOUT = 0.5, 3.0
# The session sign off: these tests are about the timeout (a killed pool's
# session ending is tests/system/test_killed_workers.py's).
HEARTBEAT = (
    *("--heartbeat-interval", str(INTERVAL), "--heartbeat-timeout", str(TIMEOUT)),
    *("--session-grace", "0"),
)


# Sleeps for as long as the payload says on its first attempt only, then records the
# run; as its start, the job's updated_at: when it was last released or failed.
FIRST_ATTEMPT_HANGS = """\
import asyncio, os


async def task(payload, helpers):
    if helpers.job.attempts == 1:
        await asyncio.sleep(payload["sleep"])
    await helpers.query(
        "insert into public.runs (job_id, pool, pid, attempt, started, finished) "
        "values (%s, %s, %s, %s, %s, clock_timestamp())",
        (helpers.job.id, helpers.job.locked_by, os.getpid(), helpers.job.attempts,
         helpers.job.updated_at),
    )
"""

HEARTBEATS = "select pool_id, pid, extract(epoch from timeout) as timeout, beat_at "
HEARTBEATS += "from graphile_worker._private_py_heartbeats"


DECLARED_DEAD = re.compile(r"declared worker pool (\S+) .*watched silent for ([\d.]+)s\)")


def declared_dead(logs: list[str]) -> dict[str, float]:
    """Pools the workers declared dead, with how long each was watched silent
    (the database's time, as the reaper's log line says)."""
    return {match[1]: float(match[2]) for log in logs for match in DECLARED_DEAD.finditer(log)}


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
    # Released in time (sigkill_drain waits at most TIMEOUT + 15 s), and never
    # before a survivor had watched the pool stay silent for its whole timeout
    # (the database's clock).
    silences = declared_dead(report.logs)
    assert set(silences) == set(report.killed_pools), silences
    assert all(seconds >= TIMEOUT for seconds in silences.values()), silences
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
    [last_beat] = [r["beat_at"] for r in rows(db, HEARTBEATS + " where pool_id = %s", (dead_pool,))]

    survivor = Worker(db, folder, "--poll-interval", "60000", *HEARTBEAT)
    wait_until(lambda: locked_by(db, job_id) != dead_pool, TIMEOUT + 10, "the release")
    released_after = time.monotonic() - killed_at
    wait_until(lambda: value(db, "select count(*) from public.runs") == 1, 10, "the re-run")
    assert sigterm_all([survivor]) == [0]
    log = survivor.log()
    print(f"\nheartbeat: a killed pool's job released {released_after:.2f}s after the kill")
    # Released no sooner than the timeout after the dead pool's last beat, in
    # the database's time (the release set the job's updated_at).
    [released_at] = [r["started"] for r in rows(db, "select started from public.runs")]
    assert (released_at - last_beat).total_seconds() >= TIMEOUT
    assert declared_dead([log])[dead_pool] >= TIMEOUT  # as the log line says
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
    [added] = rows(
        db,
        "select id, run_at from graphile_worker.add_job('hang', '{\"sleep\": 60}', "
        "max_attempts => 1)",
    )
    job_id = added["id"]
    doomed = Worker(db, folder, *HEARTBEAT)
    wait_until(lambda: locked_by(db, job_id) is not None, 30, "the job to be taken")
    dead_pool = locked_by(db, job_id)
    kill(db, doomed)
    survivor = Worker(db, folder, *HEARTBEAT)
    wait_until(lambda: locked_by(db, job_id) is None, TIMEOUT + 10, "the release")
    # The survivor must not run it: no attempt is left (and its run_at is kept,
    # checked below: were it runnable, it would be at once). A job added now,
    # behind it (a lower priority), runs on the survivor's single slot only
    # after the released one would have: once that one has run, the released
    # one had its chance.
    marker = int(
        value(db, "select id from graphile_worker.add_job('hang', '{\"sleep\": 0}', priority => 1)")
    )
    wait_until(
        lambda: value(db, "select count(*) from public.runs where job_id = %s", (marker,)) == 1,
        15,
        "the job added after the release to run",
    )
    assert sigterm_all([survivor]) == [0]
    assert rows(db, "select job_id from public.runs") == [{"job_id": marker}]
    [job] = rows(
        db, "select id, attempts, max_attempts, run_at, last_error from graphile_worker.jobs"
    )
    assert (job["id"], job["attempts"], job["max_attempts"]) == (job_id, 1, 1)
    assert job["run_at"] == added["run_at"]
    assert job["last_error"].startswith(f"the worker pool {dead_pool} (host ")
    assert "was declared dead: no heartbeat since" in job["last_error"]
    # The attempt's error is kept with the others (its last: no attempt left).
    [error] = rows(
        db,
        "select attempt, error, retried, pool_id, task_identifier "
        "from graphile_worker._private_py_job_errors where job_id = %s",
        (job_id,),
    )
    assert error == {
        "attempt": 1,
        "error": job["last_error"],
        "retried": False,
        "pool_id": dead_pool,
        "task_identifier": "hang",
    }


@pytest.mark.node
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
    node_proc = Worker(db, node_folder, "-c", db, command=node.argv())
    try:
        wait_until(lambda: locked_by(db, node_job) is not None, 30, "Node to take its job")
        node_pool = locked_by(db, node_job)
        plain = Worker(db, folder, "--heartbeat-interval", "0")  # heartbeats off
        python_job = add_hanging_job(db, 60)
        wait_until(lambda: locked_by(db, python_job) is not None, 30, "the plain pool's job")
        plain_pool = locked_by(db, python_job)
        kill(db, plain)
        watcher = Worker(db, folder, *HEARTBEAT)
        wait_until(lambda: listening(db) == 1 + 1, 30, "the watcher")  # watcher + Node
        # Until the watcher has been beating (and looking for dead pools) for
        # longer than a timeout plus two intervals, by the database's clock.
        wait_until(
            lambda: (
                value(
                    db,
                    "select coalesce(max(extract(epoch from beat_at - started_at)), 0) "
                    "from graphile_worker._private_py_heartbeats where pid = %s",
                    (watcher.pid,),
                )
                > TIMEOUT + 2 * INTERVAL
            ),
            TIMEOUT + 30,
            "the watcher to watch for longer than a timeout",
        )
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


# Runs until the test inserts into public.go (it ignores abort_signal), then
# records its run.
RUNS_UNTIL_GO = """\
import asyncio, os


async def task(payload, helpers):
    while not (await helpers.query("select count(*) as n from public.go"))[0]["n"]:
        await asyncio.sleep(0.05)
    await helpers.query(
        "insert into public.runs (job_id, pool, pid, attempt, finished) "
        "values (%s, %s, %s, %s, clock_timestamp())",
        (helpers.job.id, helpers.job.locked_by, os.getpid(), helpers.job.attempts),
    )
"""


def test_a_long_graceful_shutdown_keeps_beating(db: str, tmp_path: Path) -> None:
    """A pool finishing a job for longer than the timeout after SIGTERM is not dead."""
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "until_go.py").write_text(RUNS_UNTIL_GO)
    rows(db, "create table public.go (n int)")
    create_runs(db)
    stopping = Worker(db, tmp_path, *HEARTBEAT)
    job_id = int(value(db, "select id from graphile_worker.add_job('until_go')"))
    wait_until(lambda: locked_by(db, job_id) is not None, 30, "the job to be taken")
    watcher = started_worker(db, Worker(db, tmp_path, "--poll-interval", "100", *HEARTBEAT))
    stopping.signal(signal.SIGTERM)  # the job ignores abort_signal: the stop waits for it
    wait_until(lambda: "stopping (SIGTERM received)" in stopping.log(), 10, "the graceful stop")
    stop_began_by = value(db, "select now()")
    # Until the watcher has been beating (and looking for dead pools) for longer
    # than a timeout plus two intervals since the stop began, by the database's
    # clock: a pool that stopped beating then would have been declared dead.
    wait_until(
        lambda: (
            value(
                db,
                "select coalesce(max(extract(epoch from beat_at - greatest(started_at, %s))), 0) "
                "from graphile_worker._private_py_heartbeats where pid = %s",
                (stop_began_by, watcher.pid),
            )
            > TIMEOUT + 2 * INTERVAL
        ),
        TIMEOUT + 30,
        "the watcher to watch the stopping pool for longer than a timeout",
    )
    assert stopping.proc.poll() is None  # still waiting for its job
    rows(db, "insert into public.go values (1)")
    assert stopping.wait(30) == 0
    assert sigterm_all([watcher]) == [0]
    assert rows(db, "select attempt from public.runs") == [{"attempt": 1}]  # ran once
    assert "declared worker pool" not in watcher.log()
    assert rows(db, HEARTBEATS) == []


def test_heartbeat_options(db: str, tmp_path: Path) -> None:
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "t.py").write_text("async def task(p, h): pass\n")
    for args, message in [
        (["--heartbeat-interval", "10", "--heartbeat-timeout", "15"], "at least twice"),
        (["--heartbeat-timeout", "45"], "at least twice"),  # the default interval is 30 s
        (["--heartbeat-interval", "-1"], "Invalid value for '--heartbeat-interval'"),
        (["--heartbeat-timeout", "0"], "Invalid value for '--heartbeat-timeout'"),
    ]:
        result = run_cli("-c", db, "--once", *args, cwd=tmp_path)
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    # On by default: every 30 s, dead after 300 s.
    result = run_cli("-c", db, "--once", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "heartbeat every 30s; declared dead after 300s without one" in result.stderr
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
    # Off: 0, from the flag or the environment.
    for off in (["--heartbeat-interval", "0"], []):
        env = {} if off else {"GRAPHILE_WORKER_HEARTBEAT_INTERVAL": "0"}
        result = run_cli("-c", db, "--once", *off, cwd=tmp_path, env=env)
        assert result.returncode == 0, result.stderr
        assert "heartbeat" not in result.stderr
    help_text = run_cli("--help").stdout
    assert "--heartbeat-interval" in help_text and "GRAPHILE_WORKER_HEARTBEAT_TIMEOUT" in help_text
    with pytest.raises(ValueError, match="at least twice"):
        WorkerOptions(heartbeat_interval=1, heartbeat_timeout=1.5)
    assert WorkerOptions().heartbeat_interval == 30 and WorkerOptions().heartbeat_timeout == 300


# --- In the library -------------------------------------------------------------


async def test_a_heartbeat_that_cannot_start_closes_its_connection(db: str) -> None:
    rows(db, "drop table graphile_worker._private_py_heartbeats cascade")

    async def t(payload: Any, helpers: Any) -> None:
        pass

    with pytest.raises(psycopg.errors.UndefinedTable) as failure:
        await run(db, task_list={"t": t}, no_handle_signals=True, heartbeat_interval=0.5)
    # The heartbeat's own error (its table is missing), raised by its first
    # beat: its traceback, kept alive here, still refers to the heartbeat.
    assert '"graphile_worker._private_py_heartbeats" does not exist' in str(failure.value)
    assert any(Path(entry.path).name == "heartbeat.py" for entry in failure.traceback)
    # Every connection of the worker is closed all the same.
    wait_until(
        lambda: (
            value(
                db,
                "select count(*) from pg_stat_activity "
                "where datname = current_database() and pid <> pg_backend_pid()",
            )
            == 0
        ),
        5,
        "the worker's connections to close",
    )


async def test_after_an_outage_for_everyone_each_pool_gets_its_whole_timeout(db: str) -> None:
    """A pool whose last beat is older than its timeout only because the
    database was unreachable (here: a row aged by hand, as after a long
    restart) is declared dead only once a live pool has watched it stay
    silent for its whole timeout, counted from the live pool's first beat."""
    rows(
        db,
        "insert into graphile_worker._private_py_heartbeats (pool_id, timeout, beat_at) "
        "values ('pool-quiet', interval '2 seconds', now() - interval '10 minutes')",
    )
    job_id = value(db, "select id from graphile_worker.add_job('t')")
    rows(
        db,
        "update graphile_worker._private_jobs set locked_by = 'pool-quiet', locked_at = now(), "
        "attempts = 1 where id = %s",
        (job_id,),
    )
    released_at: list[datetime] = []
    ran = asyncio.Event()

    async def t(payload: Any, helpers: Helpers) -> None:
        assert helpers.job.updated_at is not None
        released_at.append(helpers.job.updated_at)  # set by the release
        ran.set()

    runner = await run(
        db, task_list={"t": t}, no_handle_signals=True, heartbeat_interval=0.2, heartbeat_timeout=1
    )
    try:
        [started] = rows(
            db,
            "select started_at from graphile_worker._private_py_heartbeats where pool_id = %s",
            (runner.pool.id,),
        )
        await asyncio.wait_for(ran.wait(), 15)
    finally:
        await runner.stop()
    # Released 2 s (pool-quiet's own timeout) or more after the watcher's first
    # beat, not at its first look.
    assert (released_at[0] - started["started_at"]).total_seconds() >= 2
    assert rows(db, HEARTBEATS + " where pool_id = 'pool-quiet'") == []
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0


@pytest.mark.parametrize("release", ["heartbeat", "stale lock sweep"])
async def test_a_released_job_keeps_its_place_in_its_named_queue(db: str, release: str) -> None:
    """A crashed pool had locked the first job of a named queue (and the queue)
    without starting it. Once released it is still the first of its queue: it
    runs before the job added after it."""
    ids = [
        r["id"]
        for r in rows(
            db,
            "select id from graphile_worker.add_jobs(array(select ('t', json_build_object("
            "'n', n), 'serial', null, null, null, null, null)::graphile_worker.job_spec "
            "from generate_series(1, 2) as n)) order by id",
        )
    ]
    rows(
        db,
        "insert into graphile_worker._private_py_heartbeats (pool_id, timeout, beat_at) "
        "values ('pool-gone', interval '1 second', now() - interval '5 hours')",
    )
    rows(
        db,
        "update graphile_worker._private_jobs set locked_by = 'pool-gone', "
        "locked_at = now() - interval '5 hours', attempts = 1 where id = %s",
        (ids[0],),
    )
    rows(
        db,
        "update graphile_worker._private_job_queues set locked_by = 'pool-gone', "
        "locked_at = now() - interval '5 hours'",
    )
    order: list[int] = []
    done = asyncio.Event()

    async def t(payload: Any, helpers: Helpers) -> None:
        order.append(helpers.job.id)
        if len(order) == 2:
            done.set()

    if release == "heartbeat":
        pool = WorkerPool(
            db,
            make_task_list({"t": t}),
            WorkerOptions(heartbeat_interval=0.2, heartbeat_timeout=1),
        )
    else:
        pool = WorkerPool(
            db,
            make_task_list({"t": t}),
            WorkerOptions(heartbeat_interval=0, stale_sweep_interval=(0.05, 0.1)),
        )
    running = asyncio.ensure_future(pool.run())
    try:
        await asyncio.wait_for(done.wait(), 15)
    finally:
        pool.stop()
        await running
    assert order == ids


async def test_each_beat_reports_the_pools_counters(db: str) -> None:
    """A pool's row carries its concurrency, tasks, version and jobs done, and
    the previous beat's counter and time (the dashboard's rate)."""
    done = asyncio.Event()
    ran: list[int] = []

    async def t(payload: Any, helpers: Helpers) -> None:
        ran.append(helpers.job.id)
        if len(ran) == 5:
            done.set()

    async def other(payload: Any, helpers: Helpers) -> None:
        pass

    runner = await run(
        db,
        task_list={"t": t, "other": other},
        concurrency=2,
        no_handle_signals=True,
        heartbeat_interval=0.1,
        heartbeat_timeout=10,
    )
    try:
        for _ in range(5):
            await runner.add_job("t")
        await asyncio.wait_for(done.wait(), 15)
        query = (
            "select concurrency, task_identifiers, version, jobs_done, jobs_done_before, "
            "beat_before < beat_at as ordered from graphile_worker._private_py_heartbeats "
            "where pool_id = %s"
        )

        def reported() -> bool:
            [row] = rows(db, query, (runner.pool.id,))
            return bool(row["jobs_done"] == 5 and row["jobs_done_before"] == 5)

        await asyncio.to_thread(wait_until, reported, 15, "two beats reporting 5 jobs done")
        [row] = rows(db, query, (runner.pool.id,))
    finally:
        await runner.stop()
    assert row["concurrency"] == 2
    assert row["task_identifiers"] == ["other", "t"]
    assert row["version"] == worker_cli.__version__
    assert row["ordered"] is True
