"""Reliability under faults: crashed workers, database restarts, bad input.

Each test is one scenario of "nothing is lost when things break", against real
PostgreSQL and real worker processes. Run with ``pytest -s`` to see the figures
each scenario measured (jobs, kills, restarts, duplicates).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dbhelpers import rows, run_cli, value
from fault_helpers import (
    RestartablePg,
    Worker,
    create_runs,
    faketime_env,
    listening,
    record_tasks,
    restartable_pg,
    sigkill_drain,
    sigterm_all,
    wait_until,
)
from pg_proxy import PgProxy
from pg_server import PgServer
from workers import Recorder

from worker_cli import Helpers, make_worker_utils, run, run_once
from worker_cli.observe.events import Events

pytestmark = pytest.mark.db


# A worker process whose stale-lock sweep runs every 0.2-0.3 s and frees locks
# older than 2 s (the real defaults: every 8-10 minutes, 4 hours).
SHORT_SWEEP_WORKER = """\
import asyncio, signal, sys
from datetime import timedelta
from pathlib import Path

from worker_cli.config.options import WorkerOptions
from worker_cli.tasks.loader import load_task_directory
from worker_cli.worker import WorkerPool


async def main():
    options = WorkerOptions(
        concurrency=10,
        stale_lock_timeout=timedelta(seconds=2),
        stale_sweep_interval=(0.2, 0.3),
    )
    pool = WorkerPool(sys.argv[1], load_task_directory(Path("tasks")), options)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, pool.stop)
    await pool.run()


asyncio.run(main())
"""


@pytest.mark.parametrize("recovery", ["force_unlock_workers", "stale_lock_sweep"])
def test_sigkill_loses_no_job_and_runs_none_twice_at_once(
    db: str, tmp_path: Path, recovery: str
) -> None:
    folder = record_tasks(tmp_path)

    def recover(killed_pools: list[str], live: list[Worker]) -> list[Worker]:
        if recovery == "force_unlock_workers":
            rows(db, "select graphile_worker.force_unlock_workers(%s)", (killed_pools,))
            return []  # the live workers poll, find the released jobs and run them
        # Only the sweeping worker is left, so no live lock can look stale to it.
        assert sigterm_all(live) == [0] * len(live)
        script = tmp_path / "short_sweep_worker.py"
        script.write_text(SHORT_SWEEP_WORKER)
        return [Worker(db, folder, db, command=[sys.executable, str(script)])]

    report = sigkill_drain(
        db,
        folder,
        jobs=2000,
        seed={"force_unlock_workers": 7, "stale_lock_sweep": 8}[recovery],  # 2 kills, 1 kill
        # The session sign off: the recovery is force_unlock_workers's or the sweep's.
        worker_args=("-j", "10", "--poll-interval", "200", "--session-grace", "0"),
        recover=recover,
        recovery_timeout=15,
    )
    print("\n" + report.line(f"SIGKILL, recovery by {recovery}"))


@pytest.fixture(scope="module")
def private_pg() -> Iterator[RestartablePg]:
    """A server of this module's own, which the tests may restart."""
    with restartable_pg() as server:
        yield server


PING_TASK = """\
async def task(payload, helpers):
    await helpers.query("insert into public.runs (job_id, pid) values (%s, 0)", (helpers.job.id,))
"""


@pytest.mark.parametrize("outage", ["restart", "terminate_backends"])
@pytest.mark.slow
def test_database_outage_loses_nothing_and_listen_resumes(
    db: str, private_pg: RestartablePg, tmp_path: Path, outage: str
) -> None:
    """The server restarts (or every session of the database is terminated) while
    one worker is busy and another idle: both log it, reconnect and carry on."""
    if outage == "restart":
        db = private_pg.server.url(private_pg.server.create_database())
    busy_folder = record_tasks(tmp_path / "busy")
    idle_folder = tmp_path / "idle"
    (idle_folder / "tasks").mkdir(parents=True)
    (idle_folder / "tasks" / "ping.py").write_text(PING_TASK)
    heartbeat = ("--heartbeat-interval", "0.5", "--heartbeat-timeout", "30")
    busy = Worker(db, busy_folder, "-j", "4", "--poll-interval", "500", *heartbeat)
    idle = Worker(db, idle_folder, "--poll-interval", "60000", *heartbeat)
    try:
        wait_until(lambda: listening(db) == 2, 30, "both workers to listen")
        create_runs(db)
        jobs = 300
        rows(
            db,
            "select graphile_worker.add_jobs(array(select ('record', json_build_object("
            "'sleep', 0.02 + random() * 0.03), null, null, null, null, null, null)"
            "::graphile_worker.job_spec from generate_series(1, %s)))",
            (jobs,),
        )
        wait_until(
            lambda: value(db, "select count(*) from public.runs") >= jobs // 4, 30, "a quarter"
        )
        if outage == "restart":
            private_pg.stop()
            time.sleep(1.0)
            private_pg.start()
        else:
            terminated = value(
                db,
                "select count(pg_terminate_backend(pid)) from pg_stat_activity "
                "where datname = current_database() and pid <> pg_backend_pid()",
            )
            assert terminated >= 4  # both pools, both LISTEN connections
        [ping] = rows(
            db, "select id, run_at from graphile_worker.add_job('ping') as j where j.id is not null"
        )
        wait_until(
            lambda: value(db, "select count(*) from public.runs where pid = 0") == 1,
            15,
            "the idle worker to run a job added after the outage",
        )
        ping_latency = value(
            db,
            "select extract(epoch from started - %s) from public.runs where pid = 0",
            (ping["run_at"],),
        )
        wait_until(
            lambda: value(db, "select count(*) from graphile_worker._private_jobs") == 0,
            60,
            "every job to be done",
        )
    finally:
        codes = sigterm_all([busy, idle])
    assert codes == [0, 0], busy.log() + idle.log()
    for worker in (busy, idle):
        log = worker.log()
        assert "LISTEN connection lost" in log and "listening again" in log, log
    finished = (
        "select count(distinct job_id) from public.runs where finished is not null and pid <> 0"
    )
    assert value(db, finished) == jobs
    # Runs the outage broke could not record their end; finished runs never overlap.
    overlapping = rows(
        db,
        "select a.job_id from public.runs a join public.runs b on a.job_id = b.job_id "
        "and a.id < b.id and a.started < b.finished and b.started < a.finished",
    )
    assert overlapping == []
    broken = value(db, "select count(*) from public.runs where finished is null and pid <> 0")
    reruns = value(
        db,
        "select count(*) from (select job_id from public.runs group by job_id "
        "having count(*) > 1) as r",
    )
    assert reruns <= broken  # only jobs whose run the outage broke ran again
    print(
        f"\ndatabase {outage}: jobs={jobs} outages=1 broken_runs={broken} rerun_jobs={reruns} "
        f"lost=0 stuck_locked=0 concurrent_duplicates=0 "
        f"job_added_after_outage_started_in={float(ping_latency):.2f}s (poll interval 60s)"
    )


LIBRARY_WORKER = """\
import asyncio, json, logging, os, signal, sys

from worker_cli import run

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
GO = asyncio.Event()  # set by SIGUSR1


async def slow(payload, helpers):
    started = "insert into public.started (job_id) values (%s)"
    if payload.get("hold_connection"):
        # Hold a pool connection until the worker asks the job to stop.
        async with helpers.with_pg_client() as conn:
            await conn.execute(started, (helpers.job.id,))
            await helpers.abort_signal.wait()
    else:
        # Run until the worker gets SIGUSR1.
        await helpers.query(started, (helpers.job.id,))
        await GO.wait()
    await helpers.query(
        "insert into public.runs (job_id, pool, pid, attempt, started, finished) "
        "values (%s, %s, %s, %s, %s, clock_timestamp())",
        (helpers.job.id, helpers.job.locked_by, os.getpid(), helpers.job.attempts,
         helpers.job.locked_at),
    )


async def main():
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, GO.set)
    runner = await run(sys.argv[1], task_list={"slow": slow}, **json.loads(sys.argv[2]))
    await runner
    sys.exit(runner.exit_code)


asyncio.run(main())
"""


def library_worker(db: str, tmp_path: Path, **options: object) -> Worker:
    """A worker process started through the library (options the CLI lacks)."""
    script = tmp_path / "library_worker.py"
    script.write_text(LIBRARY_WORKER)
    return Worker(db, tmp_path, db, json.dumps(options), command=[sys.executable, str(script)])


def add_slow_jobs(db: str, count: int, payload: str) -> None:
    rows(
        db,
        "select graphile_worker.add_jobs(array(select ('slow', %s::json, null, null, null, "
        "null, null, null)::graphile_worker.job_spec from generate_series(1, %s)))",
        (payload, count),
    )


LOCKED = "select count(*) from graphile_worker._private_jobs where locked_by is not null"
STARTED = "select count(*) from public.started"


def test_sigterm_under_load_finishes_running_and_returns_fetched_jobs(
    db: str, tmp_path: Path
) -> None:
    create_runs(db)
    add_slow_jobs(db, 600, "{}")
    worker = library_worker(
        db,
        tmp_path,
        concurrency=50,
        local_queue_size=500,
        local_queue_horizon=float("inf"),
        graceful_shutdown_timeout=5.0,
    )
    wait_until(lambda: value(db, LOCKED) == 550, 30, "50 running and 500 fetched ahead")
    wait_until(lambda: value(db, STARTED) == 50, 30, "every slot to start its job")
    assert value(db, "select count(*) from public.runs") == 0  # none has finished yet
    worker.signal(signal.SIGTERM)
    signalled = time.monotonic()
    # The jobs run until SIGUSR1: the unstarted ones come back meanwhile.
    returned_in = wait_until(lambda: value(db, LOCKED) <= 50, 5, "the unstarted jobs' return")
    assert value(db, LOCKED) == 50
    worker.signal(signal.SIGUSR1)
    code = worker.wait(10)
    exited_in = time.monotonic() - signalled
    assert code == 0, worker.log()
    assert "returned 500 unstarted job(s)" in worker.log()
    # The 50 running jobs finished (once each); the rest are as if never fetched.
    assert rows(
        db, "select count(*) as runs, count(distinct job_id) as jobs, max(attempt) from public.runs"
    ) == [{"runs": 50, "jobs": 50, "max": 1}]
    assert rows(
        db,
        "select count(*), max(attempts), count(locked_by) as locked "
        "from graphile_worker._private_jobs",
    ) == [{"count": 550, "max": 0, "locked": 0}]
    assert exited_in < 5.0  # within the graceful-shutdown timeout
    print(
        f"\ngraceful shutdown under load: running=50 fetched_ahead=500 "
        f"returned_in={returned_in:.2f}s exit=0 after {exited_in:.2f}s "
        "lost=0 attempts_restored=500"
    )


NESTED_TASK = """\
async def task(payload, helpers):
    async with helpers.with_pg_client() as conn:
        await conn.execute("select pg_sleep(0.01)")
        # Helpers called while holding a connection need one too.
        if "n" in payload:
            await helpers.add_job("nested", {"child_of": payload["n"]})
        await helpers.query("insert into public.runs (job_id) values (%s)", (helpers.job.id,))
"""


def test_tasks_holding_every_connection_do_not_deadlock_the_worker(db: str, tmp_path: Path) -> None:
    """-j 8 with a pool of 2: tasks hold connections through with_pg_client and
    call helpers meanwhile; the worker keeps fetching, running and completing."""
    create_runs(db)
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "nested.py").write_text(NESTED_TASK)
    rows(
        db,
        "select graphile_worker.add_jobs(array(select ('nested', json_build_object('n', n), "
        "null, null, null, null, null, null)::graphile_worker.job_spec "
        "from generate_series(1, 40) as n))",
    )
    started = time.monotonic()
    worker = Worker(db, tmp_path, "--once", "-j", "8", "-m", "2")
    code = worker.wait(60)
    took = time.monotonic() - started
    log = worker.log()
    assert code == 0, log
    assert "PoolTimeout" not in log and "Failed task" not in log, log
    assert value(db, "select count(*) from public.runs") == 80  # 40 jobs and their 40 children
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0
    assert took < 15, log
    print(f"\npool exhaustion: -j 8 -m 2, 80 jobs holding connections done in {took:.2f}s")


def test_shutdown_while_tasks_hold_every_connection(db: str, tmp_path: Path) -> None:
    """Giving back fetched jobs needs a connection the running tasks hold until
    their abort_signal: the signal must still come after the graceful timeout."""
    create_runs(db)
    add_slow_jobs(db, 12, '{"hold_connection": true}')
    worker = library_worker(
        db,
        tmp_path,
        concurrency=2,
        max_pool_size=2,
        local_queue_size=10,
        local_queue_horizon=float("inf"),
        graceful_shutdown_timeout=1.0,
    )
    wait_until(lambda: value(db, LOCKED) == 12, 30, "2 running and 10 fetched ahead")
    wait_until(lambda: value(db, STARTED) == 2, 30, "both slots to start their job")
    worker.signal(signal.SIGTERM)
    signalled = time.monotonic()
    code = worker.wait(20)
    exited_in = time.monotonic() - signalled
    assert code == 0, worker.log()
    assert value(db, "select count(*) from public.runs") == 2
    assert rows(
        db,
        "select count(*), max(attempts), count(locked_by) as locked "
        "from graphile_worker._private_jobs",
    ) == [{"count": 10, "max": 0, "locked": 0}]
    assert exited_in < 5, worker.log()
    print(f"\nshutdown with every connection held: exit 0 after {exited_in:.2f}s")


async def test_helpers_inside_with_pg_client_share_its_transaction(db: str) -> None:
    """The other side of reusing the held connection: a job added inside the
    task's own transaction commits or rolls back with it."""

    async def task(payload: dict[str, bool], helpers: Helpers) -> None:
        async with helpers.with_pg_client() as conn:
            try:
                async with conn.transaction():
                    await helpers.add_job("follow_up", {"kept": payload["commit"]})
                    if not payload["commit"]:
                        raise RuntimeError("roll back")
            except RuntimeError:
                pass

    async with make_worker_utils(connection_string=db) as utils:
        await utils.add_jobs([{"identifier": "task", "payload": {"commit": c}} for c in (1, 0)])
    await run_once(db, task_list={"task": task}, no_handle_signals=True)
    assert rows(db, "select task_identifier from graphile_worker.jobs") == [
        {"task_identifier": "follow_up"}
    ]
    assert value(db, "select payload from graphile_worker._private_jobs") == {"kept": 1}


# --- Bad input ------------------------------------------------------------------


def write_tasks(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / "tasks" / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / "tasks" / name).write_text(text)
    return folder


def test_nul_and_invalid_unicode_in_payloads_and_errors(db: str, tmp_path: Path) -> None:
    """A NUL or a lone surrogate (Python's stand-in for undecodable bytes) in a
    payload reaches the task intact; in an error message it is stored escaped.
    Neither may stop the results of other jobs from being written."""
    folder = write_tasks(
        tmp_path,
        {
            "echo.py": "async def task(payload, helpers):\n"
            "    if payload.get('fail'):\n"
            "        raise ValueError(payload['text'])\n"
            "    await helpers.query('insert into public.seen values (%s)', (repr(payload),))\n",
        },
    )
    rows(db, "create table public.seen (payload text)")
    for payload in (
        '{"text": "nul\\u0000here"}',
        '{"text": "lone \\ud800 surrogate"}',
        '{"fail": true, "text": "nul\\u0000here"}',
        '{"fail": true, "text": "lone \\ud800 surrogate"}',
        '{"text": "plain"}',
    ):
        rows(db, "select graphile_worker.add_job('echo', %s::json)", (payload,))
    result = Worker(db, folder, "--once", "-j", "3")
    assert result.wait(30) == 0, result.log()
    assert sorted(r["payload"] for r in rows(db, "select payload from public.seen")) == sorted(
        [
            "{'text': 'nul\\x00here'}",
            "{'text': 'lone \\ud800 surrogate'}",
            "{'text': 'plain'}",
        ]
    )
    assert sorted(
        r["last_error"]
        for r in rows(db, "select last_error, locked_by from graphile_worker._private_jobs")
    ) == ["ValueError: lone \\ud800 surrogate", "ValueError: nul\\x00here"]
    assert (
        value(db, "select count(*) from graphile_worker._private_jobs where locked_by is not null")
        == 0
    )


def test_tasks_that_never_return_are_failed_by_a_forced_shutdown(db: str, tmp_path: Path) -> None:
    """Neither an async task nor a plain (threaded) one that ignores abort_signal
    keeps the worker from exiting after a second SIGTERM; both jobs will retry."""
    folder = write_tasks(
        tmp_path,
        {
            "stuck_async.py": "import asyncio\n\nasync def task(payload, helpers):\n"
            "    await asyncio.sleep(3600)\n",
            "stuck_sync.py": "import time\n\ndef task(payload, helpers):\n    time.sleep(3600)\n",
        },
    )
    rows(db, "select graphile_worker.add_job('stuck_async'), graphile_worker.add_job('stuck_sync')")
    worker = Worker(db, folder, "-j", "2")
    wait_until(lambda: value(db, LOCKED) == 2, 30, "both jobs to start")
    worker.signal(signal.SIGTERM)
    time.sleep(0.5)
    assert worker.proc.poll() is None  # graceful: it waits for the running jobs
    worker.signal(signal.SIGTERM)
    forced = time.monotonic()
    assert worker.wait(10) == 0, worker.log()
    exited_in = time.monotonic() - forced
    assert "1 task thread(s) still running" in worker.log()
    jobs = rows(db, "select attempts, locked_by, last_error from graphile_worker._private_jobs")
    assert (
        jobs
        == [
            {
                "attempts": 1,
                "locked_by": None,
                "last_error": "RuntimeError: the worker was stopped while the job was running",
            }
        ]
        * 2
    )
    print(f"\nnever-returning tasks: forced shutdown exited 0 after {exited_in:.2f}s, 2 jobs kept")


@pytest.mark.slow
def test_a_forced_stop_ends_within_seconds_while_the_database_hangs(
    private_pg: RestartablePg, tmp_path: Path
) -> None:
    """A second SIGTERM while the database hangs (every server process stopped:
    connections open, nothing answers): the worker gives up writing results
    after 5 s, names the jobs it could not write back, keeps its heartbeat
    row so that others release them, and exits 1 well within 10 s."""
    db = private_pg.server.url(private_pg.server.create_database())
    folder = write_tasks(
        tmp_path,
        {"stuck.py": "import asyncio\n\nasync def task(payload, helpers):\n"
         "    await asyncio.sleep(3600)\n"},
    )  # fmt: skip
    assert run_cli("-c", db, "--schema-only").returncode == 0
    ids = sorted(
        int(r["id"])
        for r in rows(db, "select (graphile_worker.add_job('stuck')).id from generate_series(1, 2)")
    )
    worker = Worker(db, folder, "-j", "2")
    wait_until(lambda: value(db, LOCKED) == 2, 30, "both jobs to start")
    pool = value(db, "select min(locked_by) from graphile_worker._private_jobs")
    worker.signal(signal.SIGTERM)  # graceful: waits for the jobs, which never end
    wait_until(lambda: "stopping (SIGTERM received)" in worker.log(), 10, "the graceful stop")
    with private_pg.frozen():
        worker.signal(signal.SIGTERM)
        forced = time.monotonic()
        code = worker.wait(30)
        exited_in = time.monotonic() - forced
    log = worker.log()
    assert code == 1, log
    assert exited_in < 9, log  # 5 s for the results, then closing down
    assert (
        f"stopped without writing back 2 job(s) (ids: {ids[0]}, {ids[1]})" in log
        and "will run again once another worker declares this pool dead" in log
    ), log
    assert "Still running" not in log  # the pool gave up by itself, not the last resort
    # Each job is still locked by the stopped pool (its heartbeat row stays, so
    # other workers release them once its timeout has passed), or failed by the
    # write that was in flight when the pool gave up, which the server carried
    # out once it resumed.
    for job in rows(db, "select locked_by, last_error from graphile_worker._private_jobs"):
        assert job in (
            {"locked_by": pool, "last_error": None},
            {
                "locked_by": None,
                "last_error": "RuntimeError: the worker was stopped while the job was running",
            },
        ), job
    assert (
        value(
            db,
            "select count(*) from graphile_worker._private_py_heartbeats where pool_id = %s",
            (pool,),
        )
        == 1
    )
    print(f"\nforced stop with the database hanging: exit 1 after {exited_in:.2f}s, 2 ids logged")


GOOD_TASK = "async def task(payload, helpers):\n    pass\n"


@pytest.mark.parametrize(
    "files,message",
    [
        (
            {"tasks/broken.py": "def task(payload, helpers)\n"},
            "'broken.py' failed to import: line 1",
        ),
        ({"tasks/latin1.py": b'x = "caf\xe9"\n'}, "'latin1.py' failed to import: line 1"),
        ({"tasks/exits.py": "raise SystemExit(4)\n"}, "'exits.py' failed to import: SystemExit(4)"),
        ({"crontab": "* * * * * good\n0 25 * * * good\n"}, "crontab line 2: hour value 25"),
        ({"crontab": "* * * * good\n"}, "crontab line 1:"),
        ({"crontab": "* * * * * good ?fill=2x\n"}, "crontab line 1:"),
        ({"crontab": "* * * * * good ?nope=1\n"}, "crontab line 1:"),
        ({"crontab": '* * * * * good {"a": 1\n'}, "crontab line 1:"),
        ({"crontab": b"* * * * * good {a: '\xff'}\n"}, "line 1: not UTF-8 text (byte 0xff)"),
    ],
    ids=[
        "syntax-error",
        "invalid-utf8-task",
        "task-exits-on-import",
        "crontab-out-of-range",
        "crontab-too-few-fields",
        "crontab-bad-fill",
        "crontab-unknown-option",
        "crontab-bad-payload",
        "crontab-invalid-utf8",
    ],
)
def test_bad_task_files_and_crontabs_stop_start_up_in_one_line_and_lose_nothing(
    db: str, tmp_path: Path, files: dict[str, str | bytes], message: str
) -> None:
    files = {"tasks/good.py": GOOD_TASK, **files}
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    rows(db, "select graphile_worker.add_job('good', queue_name => 'q')")
    result = run_cli("-c", db, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert rows(
        db, "select attempts, locked_by, last_error from graphile_worker._private_jobs"
    ) == [{"attempts": 0, "locked_by": None, "last_error": None}]


RAISES = """\
def task(payload, helpers):
    raise {"SystemExit": SystemExit(3), "KeyboardInterrupt": KeyboardInterrupt(),
           "BaseException": BaseException("odd"),
           "GeneratorExit": GeneratorExit("closed")}[payload["raise"]]
"""


def test_tasks_raising_base_exceptions_fail_their_job_not_the_worker(
    db: str, tmp_path: Path
) -> None:
    folder = write_tasks(
        tmp_path,
        {
            "raise_sync.py": RAISES,
            "raise_async.py": RAISES.replace("def task", "async def task"),
            "good.py": "async def task(payload, helpers):\n"
            "    await helpers.query('insert into public.seen values (%s)', (payload['n'],))\n",
        },
    )
    rows(db, "create table public.seen (n int)")
    kinds = ["SystemExit", "KeyboardInterrupt", "BaseException", "GeneratorExit"]
    for style in ("sync", "async"):
        for kind in kinds:
            rows(
                db,
                "select graphile_worker.add_job(%s, json_build_object('raise', %s::text))",
                (f"raise_{style}", kind),
            )
    rows(
        db,
        "select graphile_worker.add_job('good', json_build_object('n', n)) "
        "from generate_series(1, 20) as n",
    )
    worker = Worker(db, folder, "--once", "-j", "4")
    assert worker.wait(30) == 0, worker.log()
    assert value(db, "select count(*) from public.seen") == 20
    errors = rows(
        db,
        "select task_identifier as task, last_error, locked_by from graphile_worker.jobs "
        "order by 1, 2",
    )
    expected = sorted(
        ["SystemExit: 3", "KeyboardInterrupt", "BaseException: odd", "GeneratorExit: closed"]
    )
    assert errors == [
        {"task": f"raise_{style}", "last_error": error, "locked_by": None}
        for style in ("async", "sync")
        for error in expected
    ]


def test_big_and_unusual_payloads(db: str, tmp_path: Path) -> None:
    """A 10 MB payload, and JSON payloads that are not objects, reach the task as
    they were added; a failed 10 MB job keeps its payload for the retry."""
    folder = write_tasks(
        tmp_path,
        {
            "echo.py": "import hashlib, json\n\n"
            "async def task(payload, helpers):\n"
            "    text = json.dumps(payload, sort_keys=True)\n"
            "    digest = hashlib.sha256(text.encode()).hexdigest()\n"
            "    await helpers.query('insert into public.seen values (%s, %s, %s)',\n"
            "        (type(payload).__name__, len(text), digest))\n"
            "    if isinstance(payload, dict) and payload.get('fail'):\n"
            "        raise ValueError('too big to succeed')\n",
        },
    )
    rows(db, "create table public.seen (kind text, length int, sha text)")
    blob = "0123456789abcdef" * (10 * 1024 * 1024 // 16)  # 10 MB
    payloads: list[object] = [
        {"blob": blob},
        {"blob": blob, "fail": True},
        "text",
        42,
        [1, "a", None],
        [],
        True,
        None,
    ]
    for payload in payloads:
        rows(db, "select graphile_worker.add_job('echo', %s::json)", (json.dumps(payload),))
    worker = Worker(db, folder, "--once", "-j", "2")
    assert worker.wait(60) == 0, worker.log()
    seen = rows(db, "select kind, length, sha from public.seen")
    expected = []
    for payload in payloads:
        text = json.dumps(payload, sort_keys=True)
        expected.append(
            {
                "kind": type(payload).__name__,
                "length": len(text),
                "sha": hashlib.sha256(text.encode()).hexdigest(),
            }
        )
    assert sorted(seen, key=repr) == sorted(expected, key=repr)
    [failed] = rows(
        db, "select length(payload::text) as length, last_error from graphile_worker._private_jobs"
    )
    assert failed["length"] > 10 * 1024 * 1024 and failed["last_error"] == (
        "ValueError: too big to succeed"
    )


def test_unknown_task_identifier_waits_for_a_worker_that_knows_it(db: str, tmp_path: Path) -> None:
    create_runs(db)
    rows(db, "select graphile_worker.add_job('mystery', priority => -5)")
    rows(db, "select graphile_worker.add_job('mystery', queue_name => 'shared')")
    rows(
        db,
        "select graphile_worker.add_job('record', queue_name => case when n <= 3 then 'shared' end)"
        " from generate_series(1, 23) as n",
    )
    knows_record = Worker(db, record_tasks(tmp_path / "a"), "--once", "-j", "4")
    assert knows_record.wait(30) == 0, knows_record.log()
    # Everything it knows ran, none blocked by the jobs it does not know.
    assert value(db, "select count(*) from public.runs") == 23
    assert (
        rows(
            db,
            "select task_identifier, attempts, locked_by, last_error from graphile_worker.jobs",
        )
        == [{"task_identifier": "mystery", "attempts": 0, "locked_by": None, "last_error": None}]
        * 2
    )
    assert value(db, "select count(locked_by) from graphile_worker._private_job_queues") == 0
    knows_mystery = Worker(db, record_tasks(tmp_path / "b", ("mystery",)), "--once")
    assert knows_mystery.wait(30) == 0, knows_mystery.log()
    assert value(db, "select count(*) from public.runs") == 25
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0


def test_schema_name_needing_quotes(db: str, tmp_path: Path) -> None:
    schema = 'my "odd" schema'
    create_runs(db)
    worker = Worker(
        db,
        record_tasks(tmp_path),
        "-s",
        schema,
        "--heartbeat-interval",
        "0.2",
        "--heartbeat-timeout",
        "2",
        "--poll-interval",
        "60000",
    )
    wait_until(lambda: listening(db) == 1, 30, "the worker to listen")
    quoted = '"my ""odd"" schema"'
    assert value(db, f"select count(*) from {quoted}._private_py_heartbeats") == 1
    rows(db, f"select {quoted}.add_job('record', queue_name => 'q') from generate_series(1, 5)")
    wait_until(lambda: value(db, "select count(*) from public.runs") == 5, 15, "the jobs to run")
    assert sigterm_all([worker]) == [0], worker.log()
    assert value(db, f"select count(*) from {quoted}._private_jobs") == 0
    assert value(db, f"select count(*) from {quoted}._private_py_heartbeats") == 0
    assert value(db, "select count(*) from pg_namespace where nspname = 'graphile_worker'") == 1


@pytest.mark.slow
def test_wrong_password_is_one_line_and_exit_1(private_pg: RestartablePg, tmp_path: Path) -> None:
    server = private_pg.server
    name = server.create_database()
    rows(server.admin_url, "create role gw_pw login password 'right'")
    rows(server.admin_url, f'alter database "{name}" owner to gw_pw')
    private_pg.require_password("gw_pw")
    right = server.url(name).replace("postgresql://postgres@", "postgresql://gw_pw:right@")
    wrong = right.replace(":right@", ":wrong@")
    assert run_cli("-c", right, "--schema-only").returncode == 0
    record_tasks(tmp_path)
    for result in (
        run_cli("-c", wrong, "--schema-only"),
        run_cli(env={"DATABASE_URL": wrong}, cwd=tmp_path),  # the worker itself
    ):
        assert result.returncode == 1
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert "could not connect to the database" in lines[0]
        assert 'password authentication failed for user "gw_pw"' in lines[0]
        assert "wrong" not in lines[0]  # the password is not echoed


CLOCK_TASK = """\
import datetime, os


async def task(payload, helpers):
    await helpers.query(
        "insert into public.runs (job_id, pool, pid, attempt, finished) "
        "values (%s, %s, %s, %s, %s)",
        (helpers.job.id, helpers.job.task_identifier, os.getpid(), helpers.job.attempts,
         datetime.datetime.now(datetime.timezone.utc)),
    )
"""


def test_clock_skew_does_not_run_future_jobs_early(db: str, tmp_path: Path) -> None:
    """Two workers, one clock an hour ahead of the database's and one an hour
    behind: jobs run when the database says they are due, no earlier, no later."""
    create_runs(db)
    jobs = {}
    due = {}

    def add(label: str, delay: str) -> None:
        for task in ("ahead", "behind"):
            [added] = rows(
                db,
                "select id, run_at from graphile_worker.add_job("
                "%s, run_at => now() + %s::interval)",
                (task, delay),
            )
            jobs[task, label] = added["id"]
            due[task, label] = added["run_at"]

    add("past", "-1 second")
    add("later", "30 minutes")
    beat = ("--heartbeat-interval", "0.3", "--heartbeat-timeout", "1.5")
    workers = []
    for task, offset in (("ahead", "+1h"), ("behind", "-1h")):
        folder = tmp_path / task
        (folder / "tasks").mkdir(parents=True)
        (folder / "tasks" / f"{task}.py").write_text(CLOCK_TASK)
        workers.append(
            Worker(db, folder, "--poll-interval", "200", *beat, env=faketime_env(offset))
        )
    # Both workers are up (each ran its past job): a job due in 3 seconds is
    # then measured against their polling, not against their start-up.
    wait_until(lambda: value(db, "select count(*) from public.runs") == 2, 20, "2 past jobs")
    add("soon", "3 seconds")
    wait_until(lambda: value(db, "select count(*) from public.runs") == 4, 20, "4 due jobs")
    # A job due now, behind the 'later' ones (a lower priority), for each
    # worker: a 'later' job that a worker trusting its clock took for due would
    # be fetched before it and run first on the worker's single slot. Once both
    # have run, the fetches that took them had their chance to take it.
    for task in ("ahead", "behind"):
        jobs[task, "marker"] = value(
            db, "select id from graphile_worker.add_job(%s, priority => 1)", (task,)
        )
    markers = [jobs["ahead", "marker"], jobs["behind", "marker"]]
    wait_until(
        lambda: (
            value(db, "select count(*) from public.runs where job_id = any(%s)", (markers,)) == 2
        ),
        20,
        "the 2 markers to run",
    )
    assert sigterm_all(workers) == [0, 0]
    runs = rows(
        db,
        "select r.job_id, r.pool as task, r.started, r.finished as worker_clock, j.run_at "
        "from public.runs as r left join graphile_worker._private_jobs as j on j.id = r.job_id",
    )
    assert sorted(r["job_id"] for r in runs) == sorted(
        jobs[task, label] for task in ("ahead", "behind") for label in ("past", "soon", "marker")
    )
    for one in runs:
        offset = (one["worker_clock"] - one["started"]).total_seconds()
        assert abs(offset - (3600 if one["task"] == "ahead" else -3600)) < 60  # really skewed
    later = rows(db, "select attempts, locked_by from graphile_worker._private_jobs order by id")
    assert later == [{"attempts": 0, "locked_by": None}] * 2  # the two 'later' jobs wait
    soon_started = {
        r["task"]: r["started"]
        for r in runs
        if r["job_id"] in (jobs["ahead", "soon"], jobs["behind", "soon"])
    }
    for task, started in soon_started.items():
        late = (started - due[task, "soon"]).total_seconds()
        assert 0 <= late < 3, (task, late)  # not before its run_at; polled every 0.2 s
    for worker in workers:
        assert "declared worker pool" not in worker.log()  # heartbeats use the database clock
    print(
        "\nclock skew +1h/-1h: 4 due jobs ran on time (soon jobs after "
        + ", ".join(
            f"{t} {(s - due[t, 'soon']).total_seconds() + 3:.2f}s" for t, s in soon_started.items()
        )
        + "), 2 future jobs not run early, 0 pools wrongly declared dead"
    )


async def test_a_fetch_whose_reply_is_lost_after_it_committed_runs_its_jobs(
    pg: PgServer, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The connection drops after a fetch committed its locks, before its reply
    arrives (a proxy cuts it there): the worker cannot know it holds those
    jobs. It ends the lost session, finds the jobs locked by its pool that it
    does not know of, and runs them, once each; nothing stays locked."""
    ran: list[int] = []
    unblock = asyncio.Event()

    async def t(payload: dict[str, Any], helpers: Helpers) -> None:
        if payload.get("block"):
            await unblock.wait()
        ran.append(helpers.job.id)

    events = Events()
    recorder = Recorder(events, "job:start", "job:success", "worker:getJob:error")
    with PgProxy(pg.admin_url) as proxy:
        # One slot, busy with a blocker: the next jobs are fetched ahead.
        runner = await run(
            proxy.url(db),
            task_list={"t": t},
            events=events,
            no_handle_signals=True,
            local_queue_size=10,
            local_queue_horizon=math.inf,
            poll_interval=0.2,
        )
        try:
            blocker = await runner.add_job("t", {"block": True})
            await recorder.wait_for("job:start")
            cut = proxy.cut_reply("is_available", "queue_name")  # the fetch's columns
            added = rows(
                db,
                "select (graphile_worker.add_job('t', json_build_object('n', n), "
                "queue_name => case when n = 1 then 'serial' end)).id "
                "from generate_series(1, 3) as n",
            )
            assert await asyncio.to_thread(cut.wait, 10), "no fetch reply was cut"
            await recorder.wait_for("worker:getJob:error")
            unblock.set()
            await recorder.wait_for("job:success", 4, within=15)
        finally:
            await runner.stop()
    assert sorted(ran) == sorted([blocker.id, *(r["id"] for r in added)])  # once each
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0
    assert value(db, "select count(locked_by) from graphile_worker._private_job_queues") == 0
    [found] = [
        r.getMessage() for r in caplog.records if "reply to a fetch was lost" in r.getMessage()
    ]
    assert "locked 3 job(s)" in found
