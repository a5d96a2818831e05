"""CPU-bound plain ``def`` tasks: the worker's threads against its processes
(``@task_options(process=True)``).

Not part of the test run. The task is a pure-Python loop of about
``--task-ms`` milliseconds (calibrated on this machine before the first
round): in threads, the GIL lets one of them run at a time whatever ``-j``
says; in processes, each has its own interpreter. Each round, for each mode
(alternating their order): one long-running worker (``-j C``, and
``--processes C`` for processes) is started and waits, idle, for jobs (its
start-up, its processes' included, is not measured); then N jobs are added
in one ``add_jobs`` call, and the drain is timed from their commit to the
empty queue. Reported: jobs/s, median [min-max] over the rounds, and the
processes' rate over the threads' (the median ratio, and its range over the
rounds); and the cores the worker used over the drain (its CPU, its
processes' included, from ``/proc``, over the wall time): on a machine
others share, that says how much of the machine the run had.

    python bench/cpu_bound.py                              # 400 jobs, -j 2, 3 rounds
    TEST_DATABASE_URL=postgres://postgres@127.0.0.1/postgres python bench/cpu_bound.py -j 4
    python bench/cpu_bound.py --rounds 2 --jobs 200        # a quick look

The processes cannot beat the threads by more than the cores free: on a
2-core machine the ceiling is 2x, less what PostgreSQL and the worker's own
loop take.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from benchmark import REPO, System, _fmt, _ratio, _system, fresh_database, precompile
from pg_server import PgServer, start_server

#: The task: ``payload["n"]`` rounds of a pure-Python loop; {options} for
#: ``@task_options``.
TASK = """\
from worker_cli import task_options


@task_options({options})
def task(payload, helpers):
    total = 0
    for i in range(payload["n"]):
        total += i * i % 7
    return None
"""

MODES = {"threads": "", "processes": "process=True"}

#: Clock ticks per second, for /proc/<pid>/stat's times.
TICKS = 100


def spin(n: int) -> int:
    """The task's loop, here: to calibrate it."""
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def calibrate(task_ms: float) -> int:
    """Rounds of the loop that take about ``task_ms`` of CPU here (the best of
    5; CPU time, not wall time: others' load on the machine does not count)."""
    n = 100_000
    best = min(_timed(n) for _ in range(5))
    return max(1, round(n * task_ms / 1000 / best))


def _timed(n: int) -> float:
    start = time.process_time()
    spin(n)
    return time.process_time() - start


def _wait_listening(conn: psycopg.Connection[Any], database: str, within: float = 60) -> None:
    """Wait until the worker's listener has run LISTEN (it is up and idle)."""
    deadline = time.monotonic() + within
    while True:
        row = conn.execute(
            "select count(*) from pg_stat_activity where datname = %s and query ilike 'listen%%'",
            (database,),
        ).fetchone()
        if row is not None and row[0] >= 1:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the worker did not start within {within}s")
        time.sleep(0.05)


def _logged(log: Path, text: str) -> int:
    """How many times the worker's log holds ``text``."""
    return log.read_text().count(text) if log.exists() else 0


def _wait_logged(log: Path, text: str, seen: int, within: float = 60) -> None:
    """Wait until the worker's log holds ``text`` more than ``seen`` times."""
    deadline = time.monotonic() + within
    while _logged(log, text) <= seen:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the worker did not log {text!r} within {within}s")
        time.sleep(0.05)


def _cpu(pid: int) -> float:
    """Seconds of CPU ``pid`` has used (user + system), its threads included."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _children(pid: int) -> list[int]:
    return [
        int(child)
        for task in Path(f"/proc/{pid}/task").iterdir()
        for child in (task / "children").read_text().split()
    ]


def _worker_cpu(pid: int) -> float:
    """Seconds of CPU of the worker and its live child processes."""
    return _cpu(pid) + sum(_cpu(child) for child in _children(pid))


def drain(pg: PgServer, system: System, jobs: int, n: int, concurrency: int) -> tuple[float, float]:
    """One drain by a long-running worker, started and idle first: jobs/s from
    the commit of the jobs to the empty queue, and the cores the worker (its
    processes included) used meanwhile."""
    url = fresh_database(pg, system, "gw_bench_cpu")
    args = ["-j", str(concurrency)]
    if system.name == "processes":
        args += ["--processes", str(concurrency)]
    log, ready = system.workdir / "worker.log", "ready for process=True tasks"
    seen = _logged(log, ready)
    worker = system.start(url, *args)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            _wait_listening(conn, "gw_bench_cpu")
            if system.name == "processes":  # its processes started (not measured)
                _wait_logged(log, ready, seen)
            conn.execute(
                "select count(*) from graphile_worker.add_jobs(array(select ('cpu', "
                "json_build_object('n', %s::int), null, null, null, null, null, null)"
                "::graphile_worker.job_spec from generate_series(1, %s)))",
                (n, jobs),
            )
            start = time.perf_counter()
            cpu_before = _worker_cpu(worker.pid)
            while conn.execute(
                "select exists (select from graphile_worker._private_jobs)"
            ).fetchone() != (False,):
                time.sleep(0.01)
            wall = time.perf_counter() - start
            cpu = _worker_cpu(worker.pid) - cpu_before
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=60)
    assert code == 0, (system.name, code, (system.workdir / "worker.log").read_text()[-2000:])
    return jobs / wall, cpu / wall


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=400, help="jobs per drain")
    parser.add_argument("-j", "--concurrency", type=int, default=2, help="-j (and --processes)")
    parser.add_argument("--task-ms", type=float, default=20.0, help="CPU time of one task")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    args = parser.parse_args()

    precompile(REPO)
    n = calibrate(args.task_ms)
    print(f"task: {n:,} rounds of the loop, about {args.task_ms:g} ms here", flush=True)
    command = [str(Path(sys.executable).parent / "graphile-worker")]
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    cores: dict[str, list[float]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="gw_cpu_") as tmp, start_server() as pg:
        systems = [
            _system(
                mode,
                command,
                Path(tmp) / mode,
                {"cpu.py": TASK.format(options=options)},
                latency=False,
            )
            for mode, options in MODES.items()
        ]
        for round_ in range(args.rounds):
            for system in systems if round_ % 2 == 0 else systems[::-1]:
                rate, used = drain(pg, system, args.jobs, n, args.concurrency)
                rates[system.name].append(rate)
                cores[system.name].append(used)
                print(
                    f"round {round_ + 1}: {system.name:9} {rate:8.1f} jobs/s, {used:.2f} cores",
                    flush=True,
                )
    print()
    print(f"{args.jobs} jobs of ~{args.task_ms:g} ms, -j {args.concurrency}:")
    for mode in MODES:
        print(f"  {mode:9} {_fmt(rates[mode], 1)} jobs/s, {_fmt(cores[mode], 2)} cores")
    print(f"  processes / threads: {_ratio(rates['processes'], rates['threads'])}")


if __name__ == "__main__":
    main()
