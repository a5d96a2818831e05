"""Through PgBouncer in transaction mode, as most production deployments run.

Debian's ``pgbouncer`` (1.18: no prepared statements, no LISTEN) in front of
the test server, in **transaction** pooling mode with fewer server
connections than the worker has clients, so that every client's statements
land on server connections other clients use too. The worker runs as a user
runs it (``--no-prepared-statements``), with and without ``--listen-url``;
jobs are added with ``add_jobs`` from SQL and with the Python utilities
(a job key, a unique job), cron backfills, and the dashboard serves pages and
an action, all through PgBouncer.

A worker without ``--listen-url`` cannot hear ``add_job``'s notifications
(PgBouncer lends the LISTEN's server connection to other clients at once):
it must say so at start-up, once, and find jobs by polling. With it, a new
job starts at once, and a killed worker's jobs run again within seconds (its
heartbeat holds the session sign on that direct session); without it, the
worker says it has no sign.

Skipped when ``pgbouncer`` is not installed, unless
``GRAPHILE_WORKER_REQUIRE_PGBOUNCER=1`` (as CI sets): then it fails.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import psycopg
import pytest
from dashboard_helpers import WAIT, Reply, follow, free_port, http, serve_cli
from dbhelpers import cli_path, value
from pg_server import PgServer
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from worker_cli import make_worker_utils

pytestmark = [pytest.mark.db, pytest.mark.slow]

#: The warning of a worker whose notifications cannot arrive.
NO_NOTIFICATIONS = "notifications do not reach this worker"
#: The task: one line per run, "<job id> <task> <monotonic time>", appended
#: with a single write (lines of concurrent runs never mix).
RECORD_TASK = """\
import os, time

def task(payload, helpers):
    line = f"{helpers.job.id} {helpers.job.task_identifier} {time.monotonic()}\\n"
    with open(os.environ["RUNS_FILE"], "a") as runs:
        runs.write(line)
"""


#: Records its run as RECORD_TASK does, then sleeps a minute.
SLOW_TASK = (
    RECORD_TASK
    + """
    time.sleep(60)
"""
)
#: The warning of a worker without a session sign.
NO_SIGN = "--no-prepared-statements without --listen-url"


@dataclass(frozen=True)
class Bouncer:
    """A running PgBouncer in front of the test server."""

    port: int
    log: Path

    def url(self, direct: str) -> str:
        """``direct`` (a database URL on the test server), through PgBouncer."""
        params = conninfo_to_dict(direct)
        params.update(host="127.0.0.1", port=str(self.port))
        return make_conninfo(**params)


def pgbouncer_binary() -> str:
    found = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/sbin")
    if found is None:
        reason = "pgbouncer is not installed (Debian: apt-get install pgbouncer)"
        if os.environ.get("GRAPHILE_WORKER_REQUIRE_PGBOUNCER"):
            pytest.fail(f"the PgBouncer tests must run here: {reason}")
        pytest.skip(reason)
    return found


@pytest.fixture
def bouncer(pg: PgServer) -> Iterator[Bouncer]:
    """PgBouncer in transaction mode, 3 server connections per database."""
    binary = pgbouncer_binary()
    server = conninfo_to_dict(pg.admin_url)
    host = str(server.get("host") or "127.0.0.1")
    port = free_port()
    # Not under tmp_path: its parents are closed to the user PgBouncer runs as.
    folder = Path(tempfile.mkdtemp(prefix="gw-pgbouncer-"))
    user = str(server.get("user") or "postgres")
    (folder / "userlist.txt").write_text(f'"{user}" ""\n')
    log = folder / "pgbouncer.log"
    target = f"host={host} port={server.get('port') or 5432}"
    if server.get("password"):
        target += f" password={server['password']}"
    (folder / "pgbouncer.ini").write_text(
        f"[databases]\n* = {target}\n\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {folder / 'userlist.txt'}\n"
        "pool_mode = transaction\ndefault_pool_size = 3\nmax_client_conn = 200\n"
        f"logfile = {log}\npidfile = {folder / 'pgbouncer.pid'}\n"
    )
    command = [binary, str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root: as the server's user
        owner = pwd.getpwuid(os.stat(host).st_uid).pw_name if host.startswith("/") else "nobody"
        shutil.chown(folder, owner)
        for file in folder.iterdir():
            shutil.chown(file, owner)
        command[1:1] = ["-u", owner]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    running = Bouncer(port, log)
    try:
        deadline = time.monotonic() + WAIT
        while True:
            assert process.poll() is None, f"pgbouncer exited: {process.communicate()[1]!r}"
            try:
                with psycopg.connect(
                    running.url(pg.admin_url),
                    prepare_threshold=None,
                    connect_timeout=2,
                ) as conn:
                    conn.execute("select 1")
                break
            except psycopg.OperationalError:
                assert time.monotonic() < deadline, f"pgbouncer did not start: {log_tail(log)}"
                time.sleep(0.05)
        yield running
    finally:
        process.terminate()
        process.wait(timeout=WAIT)
        shutil.rmtree(folder, ignore_errors=True)


def log_tail(log: Path) -> str:
    return log.read_text()[-2000:] if log.exists() else "(no log)"


class Worker:
    """``graphile-worker`` as a process, in a folder of its own."""

    def __init__(self, folder: Path, url: str, *args: str) -> None:
        (folder / "tasks").mkdir(parents=True)
        (folder / "tasks" / "record.py").write_text(RECORD_TASK)
        (folder / "tasks" / "cron_task.py").write_text(RECORD_TASK)
        (folder / "tasks" / "slow.py").write_text(SLOW_TASK)
        self.runs = folder / "runs.txt"
        self.runs.touch()
        self.stderr = folder / "stderr.txt"
        env = {**os.environ, "RUNS_FILE": str(self.runs), "NO_LOG_SUCCESS": "1"}
        env.pop("DATABASE_URL", None)
        with open(self.stderr, "w") as stderr:
            self.process = subprocess.Popen(
                [cli_path(), "-c", url, "--no-prepared-statements", *args],
                cwd=folder,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )

    def lines(self) -> list[tuple[int, str, float]]:
        """Each run: (job id, task, when it started)."""
        runs = []
        for line in self.runs.read_text().splitlines():
            job_id, task, at = line.split()
            runs.append((int(job_id), task, float(at)))
        return runs

    def log(self) -> str:
        return self.stderr.read_text()

    def wait_for(self, what: str, condition: object, within: float) -> None:
        deadline = time.monotonic() + within
        while not condition():  # type: ignore[operator]
            assert self.process.poll() is None, f"the worker exited: {self.log()}"
            assert time.monotonic() < deadline, f"{what}: not within {within}s\n{self.log()}"
            time.sleep(0.01)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGINT)
        return self.process.wait(timeout=WAIT)


def jobs_left(url: str) -> int:
    return int(value(url, "select count(*) from graphile_worker._private_jobs"))


@pytest.mark.parametrize("listen", ["--listen-url", "without --listen-url"])
def test_a_drain_and_a_new_job_through_pgbouncer(
    db: str, bouncer: Bouncer, tmp_path: Path, listen: str
) -> None:
    through = bouncer.url(db)
    with psycopg.connect(through, autocommit=True, prepare_threshold=None) as conn:
        conn.execute(
            "select count(*) from graphile_worker.add_jobs(array("
            "select ('record', json_build_object('n', n), case when n % 4 = 0 then"
            " 'queue-' || n % 7 end, null, null, null, null, null)::graphile_worker.job_spec"
            " from generate_series(1, 2000) as n))"
        )
    # Polls far apart with --listen-url: a new job must be heard of, not polled for.
    poll = ["--poll-interval", "30000", "--listen-url", db] if listen == "--listen-url" else []
    poll = poll or ["--poll-interval", "1000"]
    started = time.monotonic()
    worker = Worker(tmp_path / "worker", through, "-j", "10", *poll)
    try:
        worker.wait_for("the drain", lambda: jobs_left(db) == 0, within=120)
        drained = time.monotonic() - started
        counts = Counter(job_id for job_id, _, _ in worker.lines())
        assert len(counts) == 2000 and set(counts.values()) == {1}, "a job ran twice or never"

        latencies = []
        with psycopg.connect(through, autocommit=True, prepare_threshold=None) as conn:
            for _ in range(3):
                before = len(worker.lines())
                added = time.monotonic()
                conn.execute("select graphile_worker.add_job('record')")
                worker.wait_for("the new job", lambda n=before: len(worker.lines()) > n, within=10)
                latencies.append(worker.lines()[-1][2] - added)
        print(
            f"\nPgBouncer 1.18, transaction mode, {listen}: 2,000 jobs drained in "
            f"{drained:.1f} s (start-up included); a new job started after "
            + ", ".join(f"{latency * 1000:.0f}" for latency in latencies)
            + " ms"
        )
        if listen == "--listen-url":
            assert NO_NOTIFICATIONS not in worker.log()
            assert max(latencies) < 2.0, latencies  # heard of, not polled for (30 s)
        else:
            worker.wait_for("the warning", lambda: NO_NOTIFICATIONS in worker.log(), within=10)
            assert worker.log().count(NO_NOTIFICATIONS) == 1, worker.log()
            assert "polling every 1000 ms" in worker.log()
            assert "--listen-url" in worker.log()
    finally:
        code = worker.stop()
    assert code == 0, worker.log()
    assert "Traceback" not in worker.log()


@pytest.mark.parametrize("listen", ["--listen-url", "without --listen-url"])
def test_a_killed_worker_through_pgbouncer(
    db: str, bouncer: Bouncer, tmp_path: Path, listen: str
) -> None:
    """With --listen-url the heartbeat holds its session sign on a direct
    session, so a killed worker's job runs again on the other within seconds;
    without it, the worker says at start that it has no sign (the heartbeat
    timeout applies), and its row names none."""
    through = bouncer.url(db)
    args = ["--listen-url", db] if listen == "--listen-url" else []
    first, second = (Worker(tmp_path / name, through, *args) for name in ("first", "second"))
    beating = "select count(*) from graphile_worker._private_py_heartbeats"
    try:
        first.wait_for("both to start", lambda: value(db, beating) == 2, within=WAIT)
        with psycopg.connect(through, autocommit=True, prepare_threshold=None) as conn:
            [(job_id,)] = conn.execute("select id from graphile_worker.add_job('slow')")
        both = [first, second]
        first.wait_for("the job to start", lambda: any(w.lines() for w in both), within=WAIT)
        runner = first if first.lines() else second
        other = second if runner is first else first
        signs = value(db, "select count(sign_key) from graphile_worker._private_py_heartbeats")
        if listen == "without --listen-url":
            assert signs == 0
            assert NO_SIGN in first.log() and NO_SIGN in second.log()
            return
        assert signs == 2 and NO_SIGN not in first.log()
        runner.process.kill()
        runner.process.wait(timeout=WAIT)
        killed = time.monotonic()
        other.wait_for("the job to run again", lambda: bool(other.lines()), within=15)
        [(again, _, started)] = other.lines()
        assert again == job_id
        print(f"\nPgBouncer with --listen-url: the killed worker's job ran again "
              f"{started - killed:.2f}s after the kill")  # fmt: skip
    finally:
        for worker in (first, second):
            if worker.process.poll() is None:
                worker.process.kill()
                worker.process.wait(timeout=WAIT)


async def test_keys_unique_jobs_and_cron_through_pgbouncer(
    db: str, bouncer: Bouncer, tmp_path: Path
) -> None:
    through = bouncer.url(db)
    async with make_worker_utils(through, no_prepared_statements=True) as utils:
        for n in range(6):  # past psycopg's prepare threshold (5) on one connection
            keyed = await utils.add_job("record", {"n": n}, job_key="the-key")
            first = await utils.add_job("record", {"once": True}, unique={"period": 60})
        assert keyed.payload == {"n": 5}
        assert first.conflict is True
    assert jobs_left(db) == 2
    # A cron item known to have last run 3 minutes ago: backfilled at start-up.
    value(
        db,
        "insert into graphile_worker._private_known_crontabs"
        " (identifier, known_since, last_execution)"
        " values ('pgbouncer_cron', now() - interval '1 hour',"
        " date_trunc('minute', now()) - interval '3 minutes') returning 1",
    )
    folder = tmp_path / "worker"
    folder.mkdir()
    (folder / "crontab").write_text("* * * * * cron_task ?id=pgbouncer_cron&fill=10m\n")
    worker = Worker(folder, through, "--listen-url", db)
    try:
        worker.wait_for(
            "the two jobs and three backfilled cron ticks",
            lambda: len(worker.lines()) >= 5,
            within=30,
        )
        tasks = Counter(task for _, task, _ in worker.lines())
        assert tasks["record"] == 2 and tasks["cron_task"] >= 3, tasks
        # wait_for_job's LISTEN does not hear through PgBouncer: its safety poll finds it.
        async with make_worker_utils(through, no_prepared_statements=True) as utils:
            job = await utils.add_job("record", {"waited": True})
            assert (await utils.wait_for_job(job.id, timeout=20)).state == "succeeded"
    finally:
        code = worker.stop()
    assert code == 0, worker.log()


def test_the_dashboard_through_pgbouncer(db: str, bouncer: Bouncer, tmp_path: Path) -> None:
    """Pages and an action; and a read-only dashboard leaves no read-only
    setting on a server connection that a worker is lent next."""
    through = bouncer.url(db)
    job_id = int(value(db, "select id from graphile_worker.add_job('record')"))
    with serve_cli(through, "--no-prepared-statements") as url:
        for _ in range(6):  # past psycopg's prepare threshold
            assert http(url + "/").status == 200
            assert http(url + "/jobs").status == 200
        page = http(f"{url}/jobs/{job_id}/delete")
        cookie = page.headers["set-cookie"].split(";")[0]
        token = page.body.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
        done = http(
            f"{url}/jobs/{job_id}/delete",
            data=urlencode({"csrf_token": token}).encode(),
            headers={"Cookie": cookie},
        )
        assert f"Job {job_id} was deleted" in follow(url, done, cookie).body
    assert jobs_left(db) == 0

    with serve_cli(through, "--no-prepared-statements", "--read-only") as url:
        for _ in range(6):
            reply: Reply = http(url + "/jobs")
            assert reply.status == 200
        value(
            db,
            "select count(*) from graphile_worker.add_jobs(array(select"
            " ('record', null, null, null, null, null, null, null)::graphile_worker.job_spec"
            " from generate_series(1, 50)))",
        )
        worker = Worker(tmp_path / "worker", through, "--once", "-j", "4")
        assert worker.process.wait(timeout=60) == 0, worker.log()
    assert "read-only transaction" not in worker.log()
    assert jobs_left(db) == 0
