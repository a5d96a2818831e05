"""What a limit costs: one worker draining trivial jobs of one task, with no
limit and under each kind of limit, rounds alternating the cases.

Not part of the test run. Each run: a long-running worker (``-j C``, the
default settings: heartbeats on) is started and idle, the limit is set, then
N trivial jobs are added in one ``add_jobs`` call and the drain is timed from
its commit to the empty queue (jobs/s), with the worker's CPU (from
``/proc``) per 1,000 jobs. Cases:

- ``unlimited``;
- ``max_running``: ``max_running=C`` (never binds: the worker runs C at once
  anyway): leased slots, jobs fetched ahead;
- ``partitioned``: the same with ``partition_by`` over 100 values of a field;
- ``rate``: ``max_starts=R`` per second (binds: its ceiling is R jobs/s).

``--compare-with DIR`` runs each case with the ``worker_cli`` of another
checkout too (a ``git worktree`` of the code before a change).

    python bench/limits.py --jobs 20000 --rounds 3
    python bench/limits.py --jobs 200000 --rounds 2 --cases unlimited,max_running
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from benchmark import REPO, System, _fmt, _system, fresh_database, precompile
from fleet import _listening, _worker_cpu
from pg_server import PgServer, start_server

TASK = "async def task(payload, helpers):\n    return None\n"

CASES = ("unlimited", "max_running", "partitioned", "rate")


def _limit(case: str, concurrency: int, rate: int) -> str | None:
    """The SQL that sets the case's limit on the task ``noop``."""
    if case == "max_running":
        return f"select graphile_worker.py_set_limit('task', 'noop', {concurrency})"
    if case == "partitioned":
        return (
            f"select graphile_worker.py_set_limit('task', 'noop', {concurrency}, null, null, 'k')"
        )
    if case == "rate":
        return f"select graphile_worker.py_set_limit('task', 'noop', null, {rate}, '1 second')"
    return None


def drain(
    system: System, pg: PgServer, case: str, jobs: int, concurrency: int, rate: int
) -> tuple[float, float]:
    """One drain: jobs/s and the worker's CPU seconds per 1,000 jobs."""
    url = fresh_database(pg, system, "gw_bench")
    proc = system.start(url, "-j", str(concurrency))
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            _listening(conn, 1)
            statement = _limit(case, concurrency, rate)
            if statement is not None:
                conn.execute(statement)
            time.sleep(0.5)
            conn.execute(
                "select count(*) from graphile_worker.add_jobs(array(select ('noop', "
                "json_build_object('k', n %% 100), null, null, null, null, null, null)"
                "::graphile_worker.job_spec from generate_series(1, %s) as n))",
                (jobs,),
            )
            start = time.perf_counter()
            cpu_before = _worker_cpu([proc.pid])
            while conn.execute(
                "select exists (select from graphile_worker._private_jobs)"
            ).fetchone() != (False,):
                time.sleep(0.01)
            wall = time.perf_counter() - start
            cpu = _worker_cpu([proc.pid]) - cpu_before
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    assert code == 0, (case, code)
    return jobs / wall, cpu / jobs * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rate-jobs", type=int, default=5_000, help="jobs of the rate case")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--rate", type=int, default=1_000, help="max_starts a second")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--compare-with", type=Path, help="another checkout's worker_cli too")
    args = parser.parse_args()
    cases = args.cases.split(",")

    scratch = Path(tempfile.mkdtemp(prefix="gw-limits-"))
    command = [sys.executable, "-m", "worker_cli"]
    builds = {"this": _system("this", command, scratch / "this", {"noop.py": TASK}, latency=False)}
    builds["this"].env["PYTHONPATH"] = str(REPO)
    if args.compare_with is not None:
        other = args.compare_with.resolve()
        builds["other"] = _system("other", command, scratch / "other", {"noop.py": TASK})
        builds["other"].env["PYTHONPATH"] = str(other)
        precompile(other)
    precompile(REPO)
    rates: dict[tuple[str, str], list[float]] = {}
    cpus: dict[tuple[str, str], list[float]] = {}
    with start_server() as pg:
        for round_ in range(args.rounds):
            for case in cases:
                order = list(builds) if round_ % 2 == 0 else list(builds)[::-1]
                for build in order:
                    jobs = args.rate_jobs if case == "rate" else args.jobs
                    rate, cpu = drain(builds[build], pg, case, jobs, args.concurrency, args.rate)
                    rates.setdefault((build, case), []).append(rate)
                    cpus.setdefault((build, case), []).append(cpu)
                    print(
                        f"round {round_ + 1}, {case}, {build}: {rate:,.0f} jobs/s, "
                        f"worker CPU {cpu:.3f} s/1k",
                        file=sys.stderr,
                        flush=True,
                    )
        pg.drop_database("gw_bench")

    print(
        f"\n{args.jobs:,} jobs ({args.rate_jobs:,} in the rate case), -j {args.concurrency}, "
        f"{args.rounds} rounds (median [min-max]); worker CPU in s per 1,000 jobs\n"
    )
    print("| case | build | jobs/s | / unlimited | worker CPU |")
    print("|---|---|---|---|---|")
    for case in cases:
        for build in builds:
            r = rates[(build, case)]
            base = rates.get((build, "unlimited"))
            vs = ""
            if base and case != "unlimited":
                vs = f"{statistics.median(r) / statistics.median(base):.2f}x"
            if case == "rate":
                vs = f"{statistics.median(r) / args.rate:.2f}x of its ceiling"
            print(f"| {case} | {build} | {_fmt(r)} | {vs} | {_fmt(cpus[(build, case)], 3)} |")


if __name__ == "__main__":
    main()
