"""Chaos: worker processes drain a queue while workers are killed, stopped and
the database restarts, at random moments; afterwards every run is checked.

Several CLI workers (``-j 4``, heartbeats every 0.5 s, declared dead after 2 s
of silence or 1 s after their session ended: the session sign) drain
queue-less jobs mixed with the jobs of four named queues. Meanwhile, in a
random order with random gaps (seeded): a worker running jobs is killed
(SIGKILL) and replaced, several times; one is stopped with SIGTERM (graceful)
and replaced; the database server is stopped and started again. Then the
survivors finish and every worker is stopped. The tasks record their runs in
files (see tests/support/chaos.py), and the test checks: every job ran to the end; no
job ran twice at the same time; no named queue ran two jobs at once, or
started its jobs out of order; nothing is left locked; the killed workers died
of SIGKILL and every other worker exited 0. ``pytest -s`` prints the figures,
among them each kill's time to recovery: from the kill to the last of the jobs
the killed worker was running starting again elsewhere.

The short version (plain ``pytest``) has one round of faults over about 12 s,
all its jobs added by one ``add_jobs`` call. The long version, run by hand,
keeps injecting rounds of faults for CHAOS_SECONDS and keeps adding jobs; its
database is a primary with a synchronous streaming standby, and each of its
rounds also fails over: the primary is killed, the standby promoted, and a new
standby made (tests/support/failover_helpers.py; the workers are given both servers
with ``target_session_attrs=read-write``)::

    CHAOS_SECONDS=600 CHAOS_SEED=12345 pytest -s -p no:cacheprovider tests/system/test_chaos.py

Environment: CHAOS_SECONDS (seconds of faults; setting it turns on the adding
of jobs), CHAOS_SEED (default: random, printed), CHAOS_WORKERS (live workers,
default 3), CHAOS_EVIDENCE (a folder to copy the run and worker logs to when
a check fails; they are otherwise left in pytest's tmp_path).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from chaos import Db, Fault, Run, RunLog, Violation, check_runs, write_task
from chaos_poison import (
    REFUSE_TRIGGER,
    Poison,
    add_innocent_early_job,
    add_poison,
    check_poison,
    poison_settled,
    write_poison_tasks,
)
from dbhelpers import run_cli
from failover_helpers import chaos_pair
from fault_helpers import (
    RestartablePg,
    Worker,
    restartable_pg,
    wait_until,
)

pytestmark = [pytest.mark.db, pytest.mark.slow]


SHORT_SECONDS = 12.0
LONG = "CHAOS_SECONDS" in os.environ
SECONDS = float(os.environ.get("CHAOS_SECONDS", SHORT_SECONDS))
SEED = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(1_000_000))
WORKERS = int(os.environ.get("CHAOS_WORKERS", "3"))

TASK = "chaos"
QUEUES = ("q0", "q1", "q2", "q3")
# The first batch: ~15 s of work for 3 workers on 2 cores (~360 queue-less jobs/s,
# ~15 jobs/s per named queue), longer than the round of faults.
FREE_JOBS = 5000  # queue-less jobs
QUEUE_JOBS = 220  # jobs of each named queue
SLEEP = (0.005, 0.06)  # seconds a task sleeps
# A few jobs sleep longer, to be running through a restart, a kill or a stop.
LONG_SHARE, LONG_SLEEP = 0.004, (0.5, 3.0)
HEARTBEAT_TIMEOUT = 2.0
# The poison phase's innocent jobs, mixed with 2 jobs of each poison kind.
POISON_PHASE_FREE_JOBS, POISON_PHASE_QUEUE_JOBS = 300, 20
WORKER_ARGS = (
    *("-j", "4", "--poll-interval", "200"),
    *("--heartbeat-interval", "0.5", "--heartbeat-timeout", str(HEARTBEAT_TIMEOUT)),
    *("--session-grace", "1"),
)
# One round: the faults of the short version, in a random order.
ROUND = ("SIGKILL", "SIGKILL", "SIGKILL", "SIGTERM", "restart", *(("failover",) if LONG else ()))
GAP = (1.0, 3.8)  # seconds between two faults (a round lasts ~12 s)
OUTAGE_PAUSE = (0.1, 3.0)  # seconds the server stays down (sometimes > the heartbeat timeout)


class Chaos:
    """The workers, the jobs added and the faults of one chaos run."""

    def __init__(self, pg: RestartablePg, db: Db, folder: Path, rng: random.Random) -> None:
        self.pg = pg
        self.db = db
        self.folder = folder
        self.rng = rng
        self.runs = RunLog(folder / "runs")
        self.workers: list[Worker] = []  # index: the worker's CHAOS_WORKER
        self.live: list[int] = []  # to be stopped at the end
        self.stopping: list[int] = []  # sent SIGTERM during the chaos
        self.killed_at: dict[int, float] = {}  # worker -> monotonic time it was seen dead
        self.faults: list[Fault] = []
        self.queues: dict[int, str | None] = {}  # job id -> its named queue
        self.batches = 0
        self.outages: list[float] = []
        self.t0 = time.monotonic()  # reset when the first worker starts

    # --- jobs ----------------------------------------------------------------

    def add_jobs(self, free: int, per_queue: dict[str, int]) -> None:
        """One add_jobs call: ``free`` queue-less jobs and ``per_queue`` jobs of
        each named queue, shuffled together."""
        queues: list[str | None] = [None] * free
        for name, count in per_queue.items():
            queues += [name] * count
        self.rng.shuffle(queues)
        specs = []
        for queue in queues:
            sleep = self.rng.uniform(*(LONG_SLEEP if self.rng.random() < LONG_SHARE else SLEEP))
            specs.append(
                {
                    "identifier": TASK,
                    "payload": {"sleep": round(sleep, 4), "queue": queue},
                    "queue_name": queue,
                }
            )
        added = self.db.rows(
            "select j.id, j.payload->>'queue' as queue from graphile_worker.add_jobs(array("
            "  select s from json_populate_recordset(null::graphile_worker.job_spec, %s::json) as s"
            ")) as j",
            (json.dumps(specs),),
        )
        assert len(added) == len(specs)
        self.queues.update({row["id"]: row["queue"] for row in added})
        self.batches += 1

    def top_up(self) -> None:
        """The long version: add jobs wherever fewer than half a batch is left."""
        left = {
            row["queue"]: row["count"]
            for row in self.db.rows(
                "select q.queue_name as queue, count(*) from graphile_worker._private_jobs as j "
                "left join graphile_worker._private_job_queues as q on q.id = j.job_queue_id "
                "group by 1"
            )
        }
        free = FREE_JOBS if left.get(None, 0) < FREE_JOBS // 2 else 0
        per_queue = {q: QUEUE_JOBS for q in QUEUES if left.get(q, 0) < QUEUE_JOBS // 2}
        if free or per_queue:
            self.add_jobs(free, per_queue)

    def jobs_left(self, but: list[int] | None = None) -> int:
        """Jobs in the table, but those of ``but``."""
        return int(
            self.db.value(
                "select count(*) from graphile_worker._private_jobs where id <> all(%s)",
                (but or [],),
            )
        )

    def poison_phase(self) -> tuple[dict[int, Poison], set[int]]:
        """Poison jobs of every kind mixed into innocent ones, run by the live
        workers (no fault meanwhile); returns the poison jobs and the innocent
        jobs of the phase, once all have reached their end."""
        self.db.rows(REFUSE_TRIGGER)
        before = set(self.queues)
        self.add_jobs(POISON_PHASE_FREE_JOBS, dict.fromkeys(QUEUES, POISON_PHASE_QUEUE_JOBS))
        poisons = add_poison(self.db, copies=2)
        self.queues[add_innocent_early_job(self.db)] = None
        innocent = set(self.queues) - before

        def settled() -> bool:
            self.check_alive()
            return self.jobs_left(but=list(poisons)) == 0 and poison_settled(self.db, poisons)

        wait_until(settled, 120, "the poison phase's jobs to reach their end", interval=0.05)
        return poisons, innocent

    # --- workers -------------------------------------------------------------

    def start_worker(self) -> None:
        index = len(self.workers)
        self.workers.append(
            Worker(self.db.url, self.folder, *WORKER_ARGS, env={"CHAOS_WORKER": str(index)})
        )
        self.live.append(index)

    def ready(self) -> bool:
        """Every live worker has started (its heartbeat row exists): a restart
        now tests a running worker, not one connecting for the first time."""
        pids = [self.workers[i].pid for i in self.live]
        beating = self.db.value(
            "select count(*) from graphile_worker._private_py_heartbeats where pid = any(%s)",
            (pids,),
        )
        return bool(beating == len(pids))

    def busy_worker(self) -> tuple[int, bool]:
        """A random live worker running a job (waits for one), and whether it was.
        Only if the queue has run dry first is any live worker chosen."""
        deadline = time.monotonic() + 30
        while True:
            self.runs.refresh()
            if busy := sorted(self.runs.busy_workers() & set(self.live)):
                return self.rng.choice(busy), True
            if self.jobs_left() == 0:
                return self.rng.choice(self.live), False
            assert time.monotonic() < deadline, "no live worker ran a job for 30 s"
            time.sleep(0.01)

    def check_alive(self) -> None:
        for index in self.live:
            worker = self.workers[index]
            assert worker.proc.poll() is None, f"worker {index} exited\n{worker.log()}"

    # --- faults --------------------------------------------------------------

    def fault(self, kind: str) -> None:
        self.check_alive()
        if kind == "SIGKILL":
            index, busy = self.busy_worker()
            worker = self.workers[index]
            worker.signal(signal.SIGKILL)
            worker.wait()
            self.killed_at[index] = time.monotonic()
            self.live.remove(index)
            self.faults.append(Fault(self.killed_at[index], kind, self._describe(index, busy)))
            self.start_worker()
        elif kind == "SIGTERM":
            index, busy = self.busy_worker()
            self.workers[index].signal(signal.SIGTERM)
            self.faults.append(Fault(time.monotonic(), kind, self._describe(index, busy)))
            self.live.remove(index)
            self.stopping.append(index)
            self.start_worker()
        elif kind == "failover":
            t = time.monotonic()
            self.faults.append(Fault(t, kind, self.pg.failover(self.rng)))
        else:
            wait_until(self.ready, 60, "every worker to have started")
            pause = self.rng.uniform(*OUTAGE_PAUSE)
            idle = "" if self.jobs_left() else " while no job was left"
            stopping = time.monotonic()
            self.pg.stop()
            time.sleep(pause)
            self.pg.start()
            back = time.monotonic()
            self.outages.append(back - stopping)
            self.faults.append(
                Fault(
                    stopping,
                    kind,
                    f"database down {back - stopping:.2f}s (paused {pause:.2f}s){idle}",
                )
            )

    def _describe(self, index: int, busy: bool) -> str:
        self.runs.refresh()
        logged = re.findall(r"Worker pool (\S+): heartbeat every", self.workers[index].log())
        pools = ",".join(sorted(self.runs.pools(index) | set(logged))) or "?"
        return f"worker {index} (pid {self.workers[index].pid}, pool {pools})" + (
            "" if busy else " while no job was left"
        )

    def run_faults(self) -> float:
        """One round of faults; in the long version, rounds until SECONDS have
        passed. Returns when the last fault was over."""
        end = self.t0 + SECONDS
        last = time.monotonic()
        while True:
            kinds = list(ROUND)
            self.rng.shuffle(kinds)
            for kind in kinds:
                gap_over = time.monotonic() + self.rng.uniform(*GAP)
                while (now := time.monotonic()) < gap_over:
                    if LONG:
                        self.top_up()
                    time.sleep(min(0.5, gap_over - now))
                self.fault(kind)
                last = time.monotonic()
            if not LONG or time.monotonic() >= end:
                return last


def relative(chaos: Chaos, t: float) -> str:
    return "inf" if t == float("inf") else f"{t - chaos.t0:.3f}"


def describe_run(chaos: Chaos, run: Run) -> str:
    end = run.until(chaos.killed_at)
    how = "ended" if run.end is not None else "killed" if end != float("inf") else "NEVER ended"
    return (
        f"run {run.run} of job {run.job} (queue {run.queue}, attempt {run.attempt}) in worker "
        f"{run.worker} (pid {run.pid}, pool {run.pool}): {relative(chaos, run.start)} .. "
        f"{relative(chaos, end)} ({how})"
    )


def pool_fate(chaos: Chaos, pool: str) -> str:
    """What the test did to the worker of a pool named in a job's last_error."""
    for fault in chaos.faults:
        if pool in fault.detail:
            return f"{fault.kind} at {relative(chaos, fault.t)} ({fault.detail})"
    return "its worker was neither killed nor stopped: a live pool was declared dead"


def evidence(chaos: Chaos, violations: list[Violation]) -> str:
    """The violations with the runs involved, the fault before each, the timeline
    of faults and what the workers logged about the jobs involved."""
    lines = [f"seed {SEED}: {len(violations)} violation(s); times in s since the start"]
    logs = {i: w.log().splitlines() for i, w in enumerate(chaos.workers)}
    for v in violations:
        before = [f for f in chaos.faults if f.t <= v.at]
        lines.append(f"- {v.kind}: {v.text} (at {relative(chaos, v.at)})")
        for run in v.runs:
            lines.append(f"    {describe_run(chaos, run)}")
            if run.last_error:
                lines.append(f"      its job's last_error then: {run.last_error}")
                if match := re.search(r"worker pool (\S+) ", run.last_error):
                    lines.append(f"      {match[1]}: {pool_fate(chaos, match[1])}")
        if before:
            f = before[-1]
            lines.append(f"    after fault {f.kind} at {relative(chaos, f.t)}: {f.detail}")
        for job in v.jobs:
            pattern = re.compile(rf"\b(Job|task) {job}\b")
            for index, log in logs.items():
                lines += [f"    worker {index}: {line}" for line in log if pattern.search(line)]
    lines.append("faults:")
    lines += [f"  {relative(chaos, f.t)} {f.kind} {f.detail}" for f in chaos.faults]
    lines.append("pools declared dead, jobs started before their lock was committed:")
    notable = re.compile(r"declared|before its lock")
    for index, log in logs.items():
        lines += [f"  worker {index}: {line}" for line in log if notable.search(line)]
    return "\n".join(lines)


def kill_recoveries(chaos: Chaos) -> list[float]:
    """Per SIGKILL of a worker that was running jobs: seconds from the kill
    until the last of those jobs started again elsewhere."""
    runs = sorted(chaos.runs.runs.values(), key=lambda r: r.start)
    recoveries = []
    for worker, killed_at in sorted(chaos.killed_at.items(), key=lambda item: item[1]):
        cut = [r for r in runs if r.worker == worker and r.end is None]
        again = [
            next((r.start for r in runs if r.job == c.job and r.start > c.start), None) for c in cut
        ]
        if cut and None not in again:
            recoveries.append(max(t for t in again if t is not None) - killed_at)
    return recoveries


def exit_code(worker: Worker) -> int | None:
    """The exit code of a worker sent SIGTERM; None if it has not exited in 60 s."""
    try:
        return worker.wait(60)
    except subprocess.TimeoutExpired:
        return None


@pytest.mark.timeout(SECONDS + 400)
def test_chaos(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    print(f"\nchaos seed {SEED} (CHAOS_SEED={SEED} reproduces the choices, not the timing)")
    folder = tmp_path / "chaos"
    (folder / "runs").mkdir(parents=True)
    write_task(folder, folder / "runs", TASK)
    write_poison_tasks(folder)
    with chaos_pair() if LONG else restartable_pg() as pg:
        db = Db(pg.server.url(pg.server.create_database()))
        chaos = Chaos(pg, db, folder, rng)
        stuck: list[Violation] = []
        try:
            result = run_cli("-c", db.url, "--schema-only")
            assert result.returncode == 0, result.stderr
            chaos.add_jobs(FREE_JOBS, dict.fromkeys(QUEUES, QUEUE_JOBS))
            chaos.t0 = time.monotonic()
            for _ in range(WORKERS):
                chaos.start_worker()
            last_fault = chaos.run_faults()

            def drained() -> bool:
                chaos.check_alive()
                return chaos.jobs_left() == 0

            try:
                wait_until(drained, 180, "every job to be done", interval=0.02)
            except AssertionError as exc:  # reported with the rest below
                stuck.append(Violation("not drained", time.monotonic(), str(exc)))
            recovered_in = time.monotonic() - last_fault
            duration = time.monotonic() - chaos.t0
            # A replacement started by the last fault may still be starting.
            wait_until(chaos.ready, 60, "every worker to have started")
            poisons, innocent = chaos.poison_phase()
            poisoned = check_poison(db, poisons)
            for index in chaos.live:
                chaos.workers[index].signal(signal.SIGTERM)
            exits = {i: exit_code(chaos.workers[i]) for i in chaos.live + chaos.stopping}
            # Only the poison jobs that failed may be left, and unlocked.
            left_locked = db.rows(
                "select 'job' as kind, id::text, locked_by from graphile_worker._private_jobs "
                "where id <> all(%s) or locked_by is not null "
                "union all select 'queue', queue_name, locked_by "
                "from graphile_worker._private_job_queues where locked_by is not null",
                (list(poisons),),
            )
        finally:
            db.close()

    chaos.runs.refresh()
    violations, figures = check_runs(chaos.runs.runs.values(), chaos.queues, chaos.killed_at)
    end = time.monotonic()
    violations += stuck
    violations += [Violation("poison", end, problem) for problem in poisoned]
    phase_runs = Counter(run.job for run in chaos.runs.runs.values() if run.job in innocent)
    violations += [
        Violation("poison phase", end, f"innocent job {job} ran {phase_runs[job]} times, not once")
        for job in sorted(innocent)
        if phase_runs[job] != 1
    ]
    violations += [
        Violation(
            "left locked", end, f"{row['kind']} {row['id']} left (locked by {row['locked_by']})"
        )
        for row in left_locked
    ]
    violations += [
        Violation(
            "exit code", end, f"worker {i} (SIGTERM) exited {code}, not 0 (None: not in 60 s)"
        )
        for i, code in exits.items()
        if code != 0
    ]
    violations += [
        Violation("exit code", end, f"worker {i} (SIGKILL) exited {code}")
        for i in chaos.killed_at
        if (code := chaos.workers[i].proc.returncode) != -signal.SIGKILL
    ]
    kinds = [f.kind for f in chaos.faults]
    logs = "\n".join(worker.log() for worker in chaos.workers)
    if "(poison_blocker, an async def task)" not in logs:
        violations.append(Violation("poison", end, "no warning named the job blocking the loop"))
    declared = logs.count(": declared worker pool ")
    by_session = logs.count("dead (its database session ended")
    wrongly = logs.count("was declared dead by another worker")
    recoveries = kill_recoveries(chaos)
    print(
        f"chaos: seed={SEED} duration={duration:.1f}s jobs={len(chaos.queues)} "
        f"batches={chaos.batches} workers_started={len(chaos.workers)} "
        f"sigkills={kinds.count('SIGKILL')} sigterms={kinds.count('SIGTERM')} "
        f"db_restarts={kinds.count('restart')} "
        f"(down {', '.join(f'{s:.2f}s' for s in chaos.outages)}) "
        f"failovers={kinds.count('failover')} runs={figures.runs} "
        f"rerun_jobs={figures.rerun_jobs} cut_short_runs={figures.cut_short_runs} "
        f"pools_declared_dead={declared} (by session: {by_session}, alive: {wrongly}) "
        f"kill_recovery=[{', '.join(f'{t:.2f}s' for t in recoveries)}] "
        f"idle_faults={sum('no job was left' in f.detail for f in chaos.faults)} "
        f"last_fault_to_done={recovered_in:.2f}s poison_jobs={len(poisons)} "
        f"poison_phase_innocent_jobs={len(innocent)} violations={len(violations)}"
    )
    if violations:
        report = evidence(chaos, violations)
        (folder / "violations.txt").write_text(report)
        if target := os.environ.get("CHAOS_EVIDENCE"):
            shutil.copytree(folder, Path(target) / f"seed-{SEED}-{int(time.time())}")
        print(report)
        shown = "\n".join(report.splitlines()[:60])
        pytest.fail(f"{shown}\n(all of it, with the run and worker logs: {folder})")
