"""A killed worker's jobs run again within seconds, and no living one is
declared dead (issue 44: the session sign, worker_cli/worker/background/session_sign.py).

Real worker processes, as users run them, with the default heartbeat (every
30 s, declared dead after 300 s of silence): only the session sign can free a
killed worker's jobs within these tests' time. Each test records every run in
``public.runs`` (tests/support/fault_helpers.py) and checks that no job ran
twice at the same time and every job ran to the end.

- SIGKILL one of three workers mid-drain: the jobs it was running and those it
  had fetched ahead run again on the others within 15 s (``pytest -s`` prints
  the times).
- The database restarts, or fails over to its standby, while a worker is
  stopped (SIGSTOP, resumed seconds after the server is back): every sign is
  gone with the old server, the stopped worker takes none back before it
  resumes, and it is not declared dead (a sign counts only on the server run
  it was taken on).
- A worker stopped for 20 s (a long garbage collection, a frozen VM) keeps its
  session, so its sign: not declared dead.
- A worker's heartbeat connection is cut: it connects again and takes its sign
  back within the grace, and is not declared dead.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from chaos import RunLog, check_runs, write_task
from dbhelpers import rows, run_cli, value
from failover_helpers import failover_pair
from fault_helpers import (
    Worker,
    concurrent_duplicates,
    create_runs,
    record_tasks,
    restartable_pg,
    sigkill_drain,
    sigterm_all,
    started_worker,
    wait_until,
)

pytestmark = [pytest.mark.db, pytest.mark.slow]

#: What a worker logs when it declares another dead, and when it learns it was.
DECLARED = ": declared worker pool "
WAS_DECLARED = "was declared dead by another worker"
SESSION_ENDED = "its database session ended"

HEARTBEATS = "graphile_worker._private_py_heartbeats"
HELD = "select count(*) from graphile_worker._private_jobs where locked_by = %s"


def add_sleeping_jobs(db: str, count: int, low: float, high: float) -> None:
    rows(
        db,
        "select graphile_worker.add_jobs(array(select ('record', json_build_object("
        "'sleep', %s + random() * %s), null, null, null, null, null, null)"
        "::graphile_worker.job_spec from generate_series(1, %s)))",
        (low, high - low, count),
    )


def wait_drained(db: str) -> None:
    wait_until(
        lambda: value(db, "select count(*) from graphile_worker._private_jobs") == 0,
        60,
        "every job to be done",
    )


def busy_worker(db: str, workers: list[Worker]) -> Worker:
    """One of ``workers`` running a job now (waits for one)."""

    def running() -> list[Worker]:
        pids = {r["pid"] for r in rows(db, "select pid from public.runs where finished is null")}
        return [w for w in workers if w.pid in pids]

    wait_until(lambda: bool(running()), 30, "a worker to run a job", interval=0.01)
    return running()[0]


def check_every_job_ran_once_at_a_time(db: str, jobs: int, workers: list[Worker]) -> None:
    logs = "\n".join(w.log() for w in workers)
    assert DECLARED not in logs and WAS_DECLARED not in logs, logs
    assert concurrent_duplicates(db) == []
    finished = "select count(distinct job_id) from public.runs where finished is not null"
    assert value(db, finished) == jobs
    assert value(db, "select count(*) from public.runs where finished is null") == 0
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0


def test_a_killed_worker_s_jobs_run_again_within_seconds(db: str, tmp_path: Path) -> None:
    report = sigkill_drain(
        db,
        record_tasks(tmp_path),
        jobs=3000,
        seed=44,
        worker_args=("-j", "10", "--poll-interval", "200"),
        recover=lambda pools, live: [],  # nobody intervenes: the survivors' heartbeats do
        recovery_timeout=15,
        workers=3,
        replace=False,
        kills=1,
    )
    print("\n" + report.line("SIGKILL one of three workers (defaults: session grace 5 s)"))
    assert report.held_at_kill > 0
    assert max(report.released_after_kill) < 15, report.line("too slow")
    assert report.rerun_after_kill and max(report.rerun_after_kill) < 15, report.line("too slow")
    # Declared dead for its session, not its silence (300 s).
    assert any(SESSION_ENDED in log for log in report.logs)


@contextmanager
def restarting_server(tmp_path: Path) -> Iterator[tuple[str, Callable[[], None]]]:
    """A private server, and its outage: a fast shutdown, a second down, a start."""
    with restartable_pg() as pg:
        db = pg.server.url(pg.server.create_database())

        def outage() -> None:
            pg.stop()
            time.sleep(1.0)
            pg.start()

        yield db, outage


@contextmanager
def failing_over(tmp_path: Path) -> Iterator[tuple[str, Callable[[], None]]]:
    """A primary and its synchronous standby, and the outage: the primary
    killed, the standby promoted. Clients name both (libpq picks the writable one)."""
    with failover_pair(synchronous=True) as pair:
        db = pair.create_database("signs")

        def outage() -> None:
            pair.kill_primary()
            pair.promote()

        yield db, outage


@pytest.mark.parametrize("outage", ["restart", "failover"])
def test_no_stopped_worker_is_declared_dead_across_a_restart_or_failover(
    tmp_path: Path, outage: str
) -> None:
    # The runs are recorded in files (tests/support/chaos.py), which the outage
    # cannot lose or interrupt.
    folder, runs = tmp_path / "workers", tmp_path / "runs"
    runs.mkdir(parents=True)
    write_task(folder, runs, "record")
    log = RunLog(runs)
    server = restarting_server if outage == "restart" else failing_over
    with server(tmp_path) as (db, make_outage):
        assert run_cli("-c", db, "--schema-only").returncode == 0
        add_sleeping_jobs(db, 300, 0.05, 0.6)
        jobs = [r["id"] for r in rows(db, "select id from graphile_worker._private_jobs")]
        # A short grace: the stopped worker's sign is missing for seconds after
        # the outage, which would be a verdict if a sign of the old server counted.
        args = ("-j", "6", "--poll-interval", "200", "--session-grace", "1")
        workers = [
            started_worker(db, Worker(db, folder, *args, env={"CHAOS_WORKER": str(i)}))
            for i in range(3)
        ]
        try:

            def busy() -> set[int]:
                log.refresh()
                return log.busy_workers()

            wait_until(lambda: bool(busy()), 30, "a worker to run a job", interval=0.01)
            stopped = workers[min(busy())]
            stopped.signal(signal.SIGSTOP)
            try:
                make_outage()
                # The others are back and hold their signs on the new server run.
                others = [w.pid for w in workers if w is not stopped]
                wait_until(
                    lambda: (
                        value(
                            db,
                            f"select count(*) from {HEARTBEATS} h join pg_locks l "
                            "on l.locktype = 'advisory' and l.objid = h.sign_key::oid "
                            "where h.pid = any(%s) "
                            "and h.sign_server_start = pg_postmaster_start_time()",
                            (others,),
                        )
                        == 2
                    ),
                    30,
                    "the others to take their signs again",
                )
                time.sleep(3.0)  # three graces
            finally:
                stopped.signal(signal.SIGCONT)
            wait_drained(db)
        finally:
            codes = sigterm_all(workers)
    logs = "\n".join(w.log() for w in workers)
    assert codes == [0, 0, 0], logs
    assert DECLARED not in logs and WAS_DECLARED not in logs, logs
    log.refresh()
    violations, _ = check_runs(log.runs.values(), dict.fromkeys(jobs), killed_at={})
    assert violations == [], violations
    assert len(log.pools(workers.index(stopped))) == 1  # one pool all along


def test_a_worker_stopped_for_20_seconds_is_not_declared_dead(db: str, tmp_path: Path) -> None:
    create_runs(db)
    add_sleeping_jobs(db, 300, 0.05, 0.5)
    folder = record_tasks(tmp_path)
    args = ("-j", "6", "--poll-interval", "200")
    workers = [started_worker(db, Worker(db, folder, *args)) for _ in range(3)]
    try:
        stopped = busy_worker(db, workers)
        pool = value(db, f"select pool_id from {HEARTBEATS} where pid = %s", (stopped.pid,))
        stopped.signal(signal.SIGSTOP)
        try:
            # What it holds once the statements it had sent (a fetch, a batch
            # of results) are done: none of its sessions is active.
            wait_until(
                lambda: (
                    value(
                        db,
                        "select count(*) from pg_stat_activity where state = 'active' "
                        "and application_name like %s",
                        (f"graphile-worker {pool} %",),
                    )
                    == 0
                ),
                10,
                "the stopped worker's statements to end",
            )
            held = int(value(db, HELD, (pool,)))
            time.sleep(20)
            # Its jobs are still its own: nobody released them.
            assert value(db, HELD, (pool,)) == held
        finally:
            stopped.signal(signal.SIGCONT)
        wait_drained(db)
    finally:
        codes = sigterm_all(workers)
    assert codes == [0, 0, 0], "\n".join(w.log() for w in workers)
    assert held > 0
    check_every_job_ran_once_at_a_time(db, 300, workers)


def test_a_cut_heartbeat_connection_takes_its_sign_back(db: str, tmp_path: Path) -> None:
    create_runs(db)
    add_sleeping_jobs(db, 60, 0.5, 1.0)
    folder = record_tasks(tmp_path)
    args = ("-j", "4", "--poll-interval", "200")
    cut, watcher = (started_worker(db, Worker(db, folder, *args)) for _ in range(2))
    try:
        [before] = rows(
            db,
            f"select h.pool_id, h.sign_key, l.pid from {HEARTBEATS} h join pg_locks l "
            "on l.locktype = 'advisory' and l.objid = h.sign_key::oid where h.pid = %s",
            (cut.pid,),
        )
        assert value(db, "select pg_terminate_backend(%s)", (before["pid"],))

        def taken_back() -> bool:
            return bool(
                value(
                    db,
                    f"select count(*) from {HEARTBEATS} h join pg_locks l "
                    "on l.locktype = 'advisory' and l.objid = h.sign_key::oid "
                    "where h.pool_id = %s and l.pid <> %s and h.sign_missing_since is null",
                    (before["pool_id"], before["pid"]),
                )
            )

        wait_until(taken_back, 10, "the sign to be taken back")
        wait_drained(db)
    finally:
        codes = sigterm_all([cut, watcher])
    assert codes == [0, 0], cut.log() + watcher.log()
    assert "heartbeat failed" in cut.log()
    check_every_job_ran_once_at_a_time(db, 60, [cut, watcher])
