"""Tools of the chaos test (tests/system/test_chaos.py): a task that records its runs in
files, the reader of those files, and the checks made on the runs afterwards.

A run is recorded by the task itself, outside the database, so the record
survives a database restart and a SIGKILL: one line when it starts and one when
it ends, each written with a single unbuffered ``write`` to a file of its worker
process. Times are ``time.monotonic()``, which is one clock for every process
of a Linux machine, so runs of different processes compare directly. A run with
a start and no end was cut short; if its worker was killed, it ended when the
test saw the worker die.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

# The task of every chaos job: sleeps as long as its payload says, and writes a
# line to runs/worker-<CHAOS_WORKER>.jsonl at its start and at its end. It does
# not use the database.
RUN_LOG_TASK = """\
import asyncio, itertools, json, os, time

_FOLDER = {folder!r}
_WORKER = int(os.environ["CHAOS_WORKER"])
_runs = itertools.count()
_fd = os.open(
    os.path.join(_FOLDER, f"worker-{{_WORKER}}.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND
)


def _write(record):
    os.write(_fd, (json.dumps(record) + "\\n").encode())  # one write, no buffer


async def task(payload, helpers):
    job = helpers.job
    run = f"{{_WORKER}}.{{next(_runs)}}"
    _write({{
        "run": run, "event": "start", "t": time.monotonic(), "job": job.id,
        "queue": job.queue_name, "attempt": job.attempts, "pool": job.locked_by,
        "worker": _WORKER, "pid": os.getpid(), "last_error": (job.last_error or "")[:300],
    }})
    await asyncio.sleep(payload["sleep"])
    _write({{"run": run, "event": "end", "t": time.monotonic(), "job": job.id}})
"""


def write_task(folder: Path, runs_folder: Path, identifier: str) -> None:
    (folder / "tasks").mkdir(parents=True, exist_ok=True)
    (folder / "tasks" / f"{identifier}.py").write_text(RUN_LOG_TASK.format(folder=str(runs_folder)))


@dataclass
class Run:
    """One run of a job, as its task recorded it."""

    run: str
    job: int
    queue: str | None
    attempt: int
    pool: str
    worker: int
    pid: int
    start: float
    last_error: str  # of the job when this run started: why the previous attempt ended
    end: float | None = None  # None: cut short (no end line)

    def until(self, killed_at: dict[int, float]) -> float:
        """When the run ended: its end line, else its worker's kill, else never."""
        if self.end is not None:
            return self.end
        return killed_at.get(self.worker, float("inf"))


class RunLog:
    """Reads the run files as they grow (only whole lines)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.runs: dict[str, Run] = {}
        self._open: dict[int, set[str]] = defaultdict(set)  # worker -> runs without end
        self._offsets: dict[Path, int] = {}

    def refresh(self) -> None:
        for path in sorted(self.folder.glob("worker-*.jsonl")):
            offset = self._offsets.get(path, 0)
            with path.open("rb") as file:
                file.seek(offset)
                data = file.read()
            complete = data[: data.rfind(b"\n") + 1]
            self._offsets[path] = offset + len(complete)
            for line in complete.splitlines():
                self._add(json.loads(line))

    def _add(self, record: dict[str, Any]) -> None:
        if record["event"] == "start":
            run = Run(
                run=record["run"],
                job=record["job"],
                queue=record["queue"],
                attempt=record["attempt"],
                pool=record["pool"],
                worker=record["worker"],
                pid=record["pid"],
                start=record["t"],
                last_error=record["last_error"],
            )
            assert run.run not in self.runs, record
            self.runs[run.run] = run
            self._open[run.worker].add(run.run)
        else:
            run = self.runs[record["run"]]
            assert run.end is None and run.job == record["job"], record
            run.end = record["t"]
            self._open[run.worker].discard(run.run)

    def busy_workers(self) -> set[int]:
        """Workers with a run that has started and not ended (as far as written)."""
        return {worker for worker, runs in self._open.items() if runs}

    def pools(self, worker: int) -> set[str]:
        return {run.pool for run in self.runs.values() if run.worker == worker}


@dataclass
class Fault:
    """One fault the test injected, at ``t`` (monotonic)."""

    t: float
    kind: str  # "SIGKILL", "SIGTERM", "restart"
    detail: str


@dataclass
class Violation:
    kind: str
    at: float  # when it began (monotonic)
    text: str
    jobs: list[int] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)


@dataclass
class Figures:
    runs: int = 0
    rerun_jobs: int = 0
    cut_short_runs: int = 0


def _overlap(a: Run, b: Run, killed_at: dict[int, float]) -> bool:
    return a.start < b.until(killed_at) and b.start < a.until(killed_at)


def check_runs(
    runs: Iterable[Run], queues: dict[int, str | None], killed_at: dict[int, float]
) -> tuple[list[Violation], Figures]:
    """Every check on the recorded runs: each job added (``queues``: job id ->
    its named queue or None) ran to the end; no job ran twice at once; no named
    queue ran two jobs at once or started its jobs out of id order; every run
    without an end was in a killed worker."""
    violations: list[Violation] = []
    by_job: dict[int, list[Run]] = defaultdict(list)
    for run in runs:
        by_job[run.job].append(run)
    figures = Figures(runs=sum(len(r) for r in by_job.values()))
    for job_runs in by_job.values():
        job_runs.sort(key=lambda r: r.start)
    figures.rerun_jobs = sum(1 for r in by_job.values() if len(r) > 1)

    for job, job_runs in sorted(by_job.items()):
        if job not in queues:
            violations.append(Violation("unknown job", job_runs[0].start, f"job {job}", [job]))
            continue
        for run in job_runs:
            if run.queue != queues[job]:
                violations.append(
                    Violation(
                        "wrong queue",
                        run.start,
                        f"job {job} ran in queue {run.queue!r}, added to {queues[job]!r}",
                        [job],
                        [run],
                    )
                )
            if run.end is None:
                figures.cut_short_runs += 1
                if run.worker not in killed_at:
                    violations.append(
                        Violation(
                            "unfinished run",
                            run.start,
                            f"job {job}: a run of worker {run.worker} (not killed) never ended",
                            [job],
                            [run],
                        )
                    )
        for i, a in enumerate(job_runs):
            for b in job_runs[i + 1 :]:
                if _overlap(a, b, killed_at):
                    violations.append(
                        Violation(
                            "job ran twice at once",
                            max(a.start, b.start),
                            f"job {job}: runs {a.run} and {b.run} overlap",
                            [job],
                            [a, b],
                        )
                    )
    finished = {j for j, r in by_job.items() if any(x.end is not None for x in r)}
    for job in sorted(set(queues) - finished):
        violations.append(
            Violation("never finished", 0.0, f"job {job} never ran to the end", [job])
        )

    by_queue: dict[str, list[int]] = defaultdict(list)
    for job, queue in queues.items():
        if queue is not None:
            by_queue[queue].append(job)
    for queue, jobs in sorted(by_queue.items()):
        queue_runs = sorted((r for j in jobs for r in by_job.get(j, [])), key=lambda r: r.start)
        for i, a in enumerate(queue_runs):
            for b in queue_runs[i + 1 :]:
                if b.start >= a.until(killed_at):
                    break  # sorted by start: no later run can overlap a either
                if a.job != b.job:
                    violations.append(
                        Violation(
                            "queue ran two jobs at once",
                            b.start,
                            f"queue {queue}: job {a.job} (run {a.run}) and job {b.job} "
                            f"(run {b.run}) overlap",
                            [a.job, b.job],
                            [a, b],
                        )
                    )
        first_starts = [(j, by_job[j][0]) for j in sorted(jobs) if j in by_job]
        for (job_a, a), (job_b, b) in itertools.pairwise(first_starts):
            if b.start < a.start:
                violations.append(
                    Violation(
                        "queue out of order",
                        b.start,
                        f"queue {queue}: job {job_b} first started before job {job_a}",
                        [job_a, job_b],
                        [a, b],
                    )
                )
    return violations, figures


class Db:
    """One autocommit connection of the test, opened again after a restart."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: psycopg.Connection[dict[str, Any]] | None = None

    def rows(self, query: str, params: Any = None) -> list[dict[str, Any]]:
        for attempt in (1, 2):
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = psycopg.connect(self.url, autocommit=True, row_factory=dict_row)
                cur = self._conn.execute(query, params)
                return cur.fetchall() if cur.description else []
            except psycopg.OperationalError:
                self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def value(self, query: str, params: Any = None) -> Any:
        result = self.rows(query, params)
        return next(iter(result[0].values())) if result else None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
