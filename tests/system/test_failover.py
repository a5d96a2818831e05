"""Failover: the primary dies mid-drain and its streaming standby is promoted.

A primary and a streaming standby (tests/support/failover_helpers.py: ``pg_basebackup
-R``), and one CLI worker (``-j 16``, a one-minute poll interval, heartbeats
every 0.5 s, a crontab) given both servers in one libpq multi-host string with
``target_session_attrs=read-write``, so that it finds whichever is the
primary. It drains 2,800 jobs, 400 of them in four named queues; a few sleep
0.2-1 s and a few 2-3 s, so that jobs are running when the primary dies and
some outlast the failover. Once 30% of the jobs have started, the primary is
killed (kill -9 of the postmaster and of every process of the server, as when
its machine dies); ``FAILOVER_OUTAGE`` seconds later (1 by default) the
standby is promoted (``pg_ctl promote``). The tasks record their runs in
files, outside the database (tests/support/chaos.py).

Checked, after the failover: a job added on the new primary runs; the pool's
heartbeat row there is refreshed; its LISTEN connection is there; a cron tick
due after the promotion adds its job there, which runs; every job ran to the
end and the jobs table is empty; once the worker is idle, a job added on the
new primary starts through its notification alone (the poll interval is a
minute); the worker exits 0 on SIGTERM. And chaos.py's checks on the runs: no
job ran twice at the same time, no named queue ran two jobs at once or
started its jobs out of order.

Two replications:

- ``synchronous`` (``synchronous_standby_names = '*'``): a commit returns once
  the standby has it, so the failover loses nothing the worker was told was
  committed. Every check holds strictly, and no job runs twice.
- ``asynchronous`` (PostgreSQL's default), with the standby ``FAILOVER_LAG``
  seconds behind (0.3 by default: the primary's WAL senders are stopped that
  long before the kill, as under load or across a network): what the primary
  committed in that time is lost with it. Jobs whose completion was lost run
  again (at least once); the test says how many and why. Locks granted in
  that time are lost too, and the worker does not notice: a job, or a named
  queue, may then run twice at once (a queue whose state was lost goes on
  overlapping its jobs until it drains). Such overlaps after the kill, of a
  job or in a queue whose lock or result was in the lost WAL, are counted and
  printed; any other violation fails the test.

``pytest -s`` prints the measures: kill to promotion, promotion to the first
job fetched from the new primary (a job added there at once, with a priority
ahead of the rest), to the heartbeat and to the LISTEN connection; the cron
job's and the notified job's latencies; the jobs that ran again, and why.

Cron goes by the worker's clock: the worker runs under libfaketime with its
clock set back by less than a minute, so that its next minute comes
``CRON_AT`` seconds after its start (well after the failover) instead of up
to a minute later.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from chaos import Run, RunLog, Violation, check_runs, write_task
from dbhelpers import rows, run_cli, value
from failover_helpers import FailoverPair, failover_pair
from fault_helpers import Worker, faketime_env, wait_until

pytestmark = [pytest.mark.db, pytest.mark.slow]

SEED = int(os.environ.get("FAILOVER_SEED") or random.SystemRandom().randrange(1_000_000))
#: Seconds between the primary's death and the standby's promotion.
OUTAGE = float(os.environ.get("FAILOVER_OUTAGE", "1.0"))
#: Seconds the asynchronous standby lags behind when the primary dies.
LAG = float(os.environ.get("FAILOVER_LAG", "0.3"))

TASK = "chaos"
CRON_TASK = "failover_cron"
QUEUES = ("q0", "q1", "q2", "q3")
FREE_JOBS, QUEUE_JOBS = 2400, 100
SLEEP = (0.002, 0.02)
#: (share, seconds): jobs running when the primary dies; jobs outlasting the failover.
LONG = (0.04, (0.2, 1.0))
OUTLAST = (0.005, (2.0, 3.0))
#: The primary dies once this share of the jobs has started (and a long one runs).
KILL_AT = 0.3
#: Seconds from the worker's start to its clock's next minute (a cron tick):
#: some 8 s after the promotion.
CRON_AT = 11.0 + OUTAGE
#: Runs this long before the WAL senders were stopped may still have been
#: in the lost WAL (the standby's own lag under load).
LAG_MARGIN = 0.5
WORKER_ARGS = (
    *("-j", "16", "--poll-interval", "60000"),
    *("--heartbeat-interval", "0.5", "--heartbeat-timeout", "5"),
)

# The cron job's task: one line per run in cron.jsonl (outside the database).
CRON_TASK_SOURCE = """\
import json, os, time

_PATH = {path!r}


async def task(payload, helpers):
    line = json.dumps(
        {{"job": helpers.job.id, "ts": payload["_cron"]["ts"], "t": time.monotonic()}}
    )
    fd = os.open(_PATH, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, (line + "\\n").encode())
    finally:
        os.close(fd)
"""

#: The worker's LISTEN connections to a server (a pool's connections are named
#: "graphile-worker <pool id> <role>").
LISTENING = (
    "select count(*) from pg_stat_activity where datname = current_database() "
    "and application_name like 'graphile-worker % listen'"
)
JOBS_LEFT = "select count(*) from graphile_worker._private_jobs"
RECOVERED = re.compile(
    r"the reply to a fetch was lost after it had locked \d+ job\(s\) \(ids: ([^)]*)\)"
)


def sleep_for(rng: random.Random) -> float:
    draw = rng.random()
    if draw < OUTLAST[0]:
        return round(rng.uniform(*OUTLAST[1]), 3)
    if draw < OUTLAST[0] + LONG[0]:
        return round(rng.uniform(*LONG[1]), 3)
    return round(rng.uniform(*SLEEP), 4)


def add_jobs(url: str, rng: random.Random, sleeps: dict[int, float]) -> dict[int, str | None]:
    """One add_jobs call of the queue-less and named-queue jobs, shuffled;
    returns each job's named queue (None: none) and notes its sleep."""
    queues: list[str | None] = [None] * FREE_JOBS + [q for q in QUEUES for _ in range(QUEUE_JOBS)]
    rng.shuffle(queues)
    specs = [
        {"identifier": TASK, "payload": {"sleep": sleep_for(rng), "queue": q}, "queue_name": q}
        for q in queues
    ]
    added = rows(
        url,
        "select j.id, j.payload->>'queue' as queue, (j.payload->>'sleep')::float8 as sleep "
        "from graphile_worker.add_jobs(array("
        "  select s from json_populate_recordset(null::graphile_worker.job_spec, %s::json) as s"
        ")) as j",
        (json.dumps(specs),),
    )
    assert len(added) == len(specs)
    sleeps.update({row["id"]: row["sleep"] for row in added})
    return {row["id"]: row["queue"] for row in added}


def add_one(url: str, priority: int = 0) -> int:
    return int(
        value(
            url,
            "select id from graphile_worker.add_job(%s, json_build_object('sleep', 0), "
            "priority => %s)",
            (TASK, priority),
        )
    )


def cron_clock(cron_at: float) -> tuple[dict[str, str], float, str]:
    """The environment setting a worker's clock back (by less than a minute)
    so that its next minute comes ``cron_at`` seconds from now; that moment
    (monotonic) and its ``_cron.ts``. Its cron jobs' ``run_at`` is then in the
    database's past: they are due at once."""
    now_wall, now = time.time(), time.monotonic()
    tick_wall = now_wall + cron_at
    offset = -(tick_wall % 60.0)
    minute = round((tick_wall + offset) / 60) * 60
    ts = datetime.fromtimestamp(minute, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    return faketime_env(f"{offset:+.3f}"), now + cron_at, ts


def cron_runs(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


@dataclass
class Measures:
    """What one failover measured (seconds)."""

    replication: str
    jobs: int = 0
    running_at_kill: int = 0
    kill_to_promote: float = 0.0
    #: From the promotion to: the first job fetched from the new primary
    #: starting, the heartbeat row refreshed there, the LISTEN connection there.
    promote_to_first_job: float = 0.0
    promote_to_heartbeat: float = 0.0
    promote_to_listening: float = 0.0
    #: From the cron tick (the worker's minute) to its job's start.
    cron_latency: float = 0.0
    #: From add_job on the new primary to the job's start, the worker idle.
    notified_latency: float = 0.0
    #: From the promotion to the end of the last run of the first batch.
    promote_to_drained: float = 0.0
    runs: int = 0
    #: Jobs run again: found locked by this pool, unknown to it (their
    #: completion was lost), or fetched again (their lock was lost too).
    rerun_recovered: list[str] = field(default_factory=list)
    rerun_fetched_again: list[str] = field(default_factory=list)
    #: Overlaps of jobs whose lock or result was in the lost WAL (asynchronous).
    lost_wal_overlaps: list[str] = field(default_factory=list)
    log_lines: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        lag = f", standby {LAG:g}s behind" if self.replication == "asynchronous" else ""
        return (
            f"failover ({self.replication}{lag}): seed={SEED} jobs={self.jobs} "
            f"running_at_kill={self.running_at_kill} "
            f"kill_to_promote={self.kill_to_promote:.2f}s (outage {OUTAGE:g}s + pg_ctl promote) "
            f"promote_to_first_job={self.promote_to_first_job:.2f}s "
            f"kill_to_first_job={self.kill_to_promote + self.promote_to_first_job:.2f}s "
            f"promote_to_heartbeat={self.promote_to_heartbeat:.2f}s "
            f"promote_to_listening={self.promote_to_listening:.2f}s "
            f"cron_tick_to_job={self.cron_latency:.2f}s "
            f"notified_job_latency={self.notified_latency * 1000:.0f}ms "
            f"promote_to_drained={self.promote_to_drained:.2f}s runs={self.runs} "
            f"rerun_jobs={len(self.rerun_recovered) + len(self.rerun_fetched_again)} "
            f"(completion lost: {len(self.rerun_recovered)}, lock lost too: "
            f"{len(self.rerun_fetched_again)}) lost_wal_overlaps={len(self.lost_wal_overlaps)} "
            f"log={self.log_lines}"
        )

    def details(self) -> list[str]:
        return [
            *(f"  ran again (completion lost): {r}" for r in self.rerun_recovered[:5]),
            *(f"  ran again (lock lost): {r}" for r in self.rerun_fetched_again[:5]),
            *(f"  overlap (lost WAL): {o}" for o in self.lost_wal_overlaps[:10]),
        ]


class Failover:
    """One worker draining jobs through one failover of ``pair``."""

    def __init__(self, pair: FailoverPair, folder: Path, rng: random.Random) -> None:
        self.pair = pair
        self.folder = folder
        self.rng = rng
        self.lag = 0.0 if pair.synchronous else LAG
        (folder / "runs").mkdir(parents=True)
        write_task(folder, folder / "runs", TASK)
        self.cron_path = folder / "cron.jsonl"
        (folder / "tasks" / f"{CRON_TASK}.py").write_text(
            CRON_TASK_SOURCE.format(path=str(self.cron_path))
        )
        (folder / "crontab").write_text(f"* * * * * {CRON_TASK}\n")
        self.db = pair.create_database("failover")
        result = run_cli("-c", self.db, "--schema-only")
        assert result.returncode == 0, result.stderr
        self.runs = RunLog(folder / "runs")
        self.sleeps: dict[int, float] = {}
        self.queues: dict[int, str | None] = {}
        self.measures = Measures("synchronous" if pair.synchronous else "asynchronous")
        self.worker: Worker | None = None

    def primary(self) -> str:
        """The URL of the primary alone."""
        return self.pair.primary.url("failover")

    def started(self, job: int) -> Run | None:
        self.runs.refresh()
        return next((r for r in self.runs.runs.values() if r.job == job), None)

    def log(self) -> str:
        return self.worker.log() if self.worker else ""

    def run(self) -> Measures:
        m = self.measures
        self.queues = add_jobs(self.db, self.rng, self.sleeps)
        first_batch = set(self.queues)
        m.jobs = len(self.queues)
        # Every job added is on the standby: what the failover loses is the worker's.
        self.pair.wait_replayed()
        env, tick, tick_ts = cron_clock(CRON_AT)
        worker = self.worker = Worker(
            self.db, self.folder, *WORKER_ARGS, env={"CHAOS_WORKER": "0", **env}
        )
        lost_from, killed = self.kill_mid_drain(worker)
        time.sleep(OUTAGE)
        assert worker.proc.poll() is None, worker.log()
        promoted = self.pair.promote()
        m.kill_to_promote = promoted - killed
        promoted_db = value(self.primary(), "select now()")
        marker = add_one(self.primary(), priority=-100)
        self.queues[marker] = None
        self.watch_resumption(promoted, promoted_db, marker)
        assert promoted < tick - 1, (
            f"the failover ended {promoted - tick:+.1f}s after the cron tick"
        )
        self.wait_cron(tick, tick_ts)
        self.wait_drained()
        self.notified_job()
        worker.signal(signal.SIGTERM)
        assert worker.wait(60) == 0, worker.log()
        self.check(killed, lost_from, promoted, first_batch)
        return m

    def kill_mid_drain(self, worker: Worker) -> tuple[float, float]:
        """Kill the primary once KILL_AT of the jobs have started, while a long
        job runs. Returns since when its WAL may be lost, and when it died."""
        deadline = time.monotonic() + 60
        while True:
            assert worker.proc.poll() is None, worker.log()
            self.runs.refresh()
            running = [r for r in self.runs.runs.values() if r.end is None]
            if len(self.runs.runs) >= KILL_AT * len(self.queues) and any(
                self.sleeps.get(r.job, 0) >= LONG[1][0] for r in running
            ):
                break
            assert time.monotonic() < deadline, "the drain did not reach the kill point"
            time.sleep(0.01)
        lost_from = time.monotonic()
        killed = self.pair.kill_primary(lag=self.lag)
        self.runs.refresh()
        self.measures.running_at_kill = sum(
            1 for r in self.runs.runs.values() if r.end is None and r.start < killed
        )
        return lost_from, killed

    def watch_resumption(self, promoted: float, promoted_db: datetime, marker: int) -> None:
        """Poll until the new primary has the worker's heartbeat and LISTEN
        connection, and the job added there has started; note when each came."""
        assert self.worker is not None
        pid = self.worker.pid
        seen: dict[str, float] = {}
        while len(seen) < 3:
            now = time.monotonic()
            if now > promoted + 60:
                pytest.fail(f"not resumed in 60 s: only {sorted(seen)}\n{self.log()}")
            if "heartbeat" not in seen and value(
                self.primary(),
                "select count(*) from graphile_worker._private_py_heartbeats "
                "where pid = %s and beat_at > %s",
                (pid, promoted_db),
            ):
                seen["heartbeat"] = now
            if "listening" not in seen and value(self.primary(), LISTENING):
                seen["listening"] = now
            if "job" not in seen and (run := self.started(marker)):
                seen["job"] = run.start
            time.sleep(0.01)
        m = self.measures
        m.promote_to_heartbeat = seen["heartbeat"] - promoted
        m.promote_to_listening = seen["listening"] - promoted
        m.promote_to_first_job = seen["job"] - promoted

    def wait_cron(self, tick: float, ts: str) -> None:
        """The tick due after the failover adds its job on the new primary, and it runs."""
        wait_until(
            lambda: any(r["ts"] == ts for r in cron_runs(self.cron_path)),
            tick - time.monotonic() + 30,
            f"the cron job of {ts} to run",
        )
        [run] = [r for r in cron_runs(self.cron_path) if r["ts"] == ts]
        self.measures.cron_latency = run["t"] - tick
        last = value(
            self.primary(),
            "select last_execution from graphile_worker._private_known_crontabs "
            "where identifier = %s",
            (CRON_TASK,),
        )
        assert last == datetime.fromisoformat(ts), (last, ts)

    def wait_drained(self) -> None:
        def drained() -> bool:
            assert self.worker is not None and self.worker.proc.poll() is None, self.log()
            return value(self.primary(), JOBS_LEFT) == 0

        try:
            wait_until(drained, 60, "every job to be done", interval=0.02)
        except AssertionError:
            left = rows(
                self.primary(),
                "select id, locked_by, attempts, left(last_error, 200) as last_error "
                "from graphile_worker._private_jobs order by id limit 30",
            )
            self.runs.refresh()
            ran = defaultdict(list)
            for r in self.runs.runs.values():
                ran[r.job].append((r.start, r.end))
            detail = "\n".join(f"{row} runs: {ran.get(row['id'])}" for row in left)
            pytest.fail(f"jobs left on the new primary:\n{detail}\n{self.log()[-5000:]}")

    def notified_job(self) -> None:
        """The worker idle, a job added on the new primary starts through its
        notification (the poll interval is a minute)."""
        assert value(self.primary(), LISTENING) == 1
        before = time.monotonic()
        job = add_one(self.primary())
        self.queues[job] = None
        wait_until(lambda: self.started(job) is not None, 10, "the notified job to start")
        run = self.started(job)
        assert run is not None
        self.measures.notified_latency = run.start - before

    def check(self, killed: float, lost_from: float, promoted: float, first: set[int]) -> None:
        """chaos.py's checks; the jobs that ran again and why."""
        m = self.measures
        self.runs.refresh()
        runs = list(self.runs.runs.values())
        violations, figures = check_runs(runs, self.queues, {})
        m.runs = figures.runs
        m.promote_to_drained = max(r.end or 0.0 for r in runs if r.job in first) - promoted
        log = self.log()
        for pattern in ("Failed to fetch", "Failed to record", "LISTEN connection lost"):
            m.log_lines[pattern] = log.count(pattern)
        recovered = {int(i) for ids in RECOVERED.findall(log) for i in ids.split(", ")}
        m.log_lines["recovered"] = len(recovered)
        by_job: dict[int, list[Run]] = defaultdict(list)
        for run in sorted(runs, key=lambda r: r.start):
            by_job[run.job].append(run)
        for job, job_runs in sorted(by_job.items()):
            if len(job_runs) > 1:
                (m.rerun_recovered if job in recovered else m.rerun_fetched_again).append(
                    describe(job, job_runs, killed)
                )
        if self.pair.synchronous:
            assert not violations, "\n".join(f"{v.kind}: {v.text}" for v in violations)
            reruns = m.rerun_recovered + m.rerun_fetched_again
            assert not reruns, f"jobs ran again after a synchronous failover: {reruns}"
            return
        # Lost WAL: a result or a lock the primary granted since lost_from
        # (less the standby's own lag) is unknown to the new primary; a run
        # that started before the promotion was fetched from the old primary.
        window = (lost_from - LAG_MARGIN, promoted)
        unexplained = []
        for violation in violations:
            if lost_wal(violation, by_job, self.queues, window, killed):
                m.lost_wal_overlaps.append(f"{violation.kind}: {violation.text}")
            else:
                unexplained.append(f"{violation.kind}: {violation.text}")
        assert not unexplained, "\n".join(unexplained)


def describe(job: int, job_runs: list[Run], killed: float) -> str:
    first = job_runs[0]
    end = f"{first.end - killed:+.3f}s" if first.end is not None else "never"
    again = ", ".join(f"{r.start - killed:+.3f}s" for r in job_runs[1:])
    start = f"{first.start - killed:+.3f}s"
    return f"job {job}: first run {start}..{end}, again at {again} (from the kill)"


def lost_wal(
    violation: Violation,
    by_job: dict[int, list[Run]],
    queues: dict[int, str | None],
    window: tuple[float, float],
    killed: float,
) -> bool:
    """Whether the lost WAL explains ``violation``: two runs at once, the later
    starting after the kill, of a job that had a run start or end in
    ``window`` (its lock or its result may have been lost), or in a named
    queue that had such a job (the queue's lock was lost, or is released by
    the result of a job the new primary had not locked: its jobs then overlap
    until it drains)."""
    low, high = window
    if not violation.runs or max(run.start for run in violation.runs) < killed:
        return False
    if violation.kind == "job ran twice at once":
        suspects = set(violation.jobs)
    elif violation.kind == "queue ran two jobs at once":
        suspects = {job for job, queue in queues.items() if queue == queues[violation.jobs[0]]}
    else:
        return False
    return any(
        low <= t <= high
        for job in suspects
        for run in by_job.get(job, [])
        for t in (run.start, run.end)
        if t is not None
    )


@pytest.mark.parametrize("replication", ["synchronous", "asynchronous"])
@pytest.mark.timeout(240)
def test_failover_mid_drain(tmp_path: Path, replication: str) -> None:
    print(f"\nfailover seed {SEED} (FAILOVER_SEED={SEED} reproduces the choices, not the timing)")
    with failover_pair(synchronous=replication == "synchronous") as pair:
        measures = Failover(pair, tmp_path / "failover", random.Random(SEED)).run()
    print(measures.line())
    print("\n".join(measures.details()))
