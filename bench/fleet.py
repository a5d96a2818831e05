"""A fleet: 1, 2, 4, 8 and 16 worker processes draining one queue, this
worker beside graphile-worker (Node) with the same process counts.

Not part of the test run. Each round, for each process count and each
system (alternating their order): P long-running workers (``-j C``, not
``--once``: a fleet runs for days) are started and wait, idle, for jobs;
then N trivial jobs are added in one ``add_jobs`` call, and the drain is
timed from its commit to the empty queue. Measured over the drain (the
start-ups, which a ``--once`` fleet of 16 would spend most of its time on
here, are not):

- jobs/s;
- the workers' CPU (user + system, from ``/proc``) per 1,000 jobs;
- PostgreSQL's CPU per 1,000 jobs: the server's processes (the postmaster,
  its live children, and what its exited children used, which the kernel
  adds to the postmaster's children's times), read from ``/proc``; so the
  server must run on this machine (the throwaway one, or
  ``TEST_DATABASE_URL`` naming a local one);
- write transactions per 1,000 jobs (transaction ids the server handed
  out) and WAL bytes per job (its insert position moved): what commits and
  writes each job costs the server, whoever sent them;
- lock waits: ``pg_stat_activity`` sampled every 20 ms; of the active
  backends of the benchmark's database, the share waiting on a heavyweight
  lock (``Lock``) or a lightweight one (``LWLock``), and the most frequent
  wait events.

Node runs with batching (local queue 500, batched completion: its fastest
settings, as ``bench/benchmark.py --batching``); ``--node-defaults`` adds
it with its defaults too.

    python bench/fleet.py --rounds 2                     # 200,000 jobs, 1..16 processes
    python bench/fleet.py --processes 1,4 --jobs 20000   # a quick look
    python bench/fleet.py --idle 15 --processes 1,16     # what a waiting fleet costs
    python bench/fleet.py --processes 4,16 --compare-with ../before   # before/after

``--idle SECONDS`` measures, instead of drains, the workers' and
PostgreSQL's CPU while the processes wait SECONDS for jobs (milliseconds of
CPU per second).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from benchmark import (
    NODE_BATCH_CONFIG,
    NODE_TASKS,
    PY_TASKS,
    REPO,
    System,
    _fmt,
    _ratio,
    _system,
    fresh_database,
    precompile,
)
from node_worker import install, node_runtime
from pg_server import PgServer, start_server

#: Clock ticks per second, for /proc/<pid>/stat's times.
TICKS = 100


def _proc_times(pid: int) -> tuple[int, int, int]:
    """(ppid, utime + stime, cutime + cstime) of ``pid``, in ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


def server_cpu(postmaster: int) -> float:
    """Seconds of CPU the server has used: the postmaster with its reaped
    children, and its live children."""
    total = sum(_proc_times(postmaster)[1:])
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == postmaster:
            continue
        try:
            ppid, own, _ = _proc_times(int(entry.name))
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if ppid == postmaster:
            total += own
    return total / TICKS


def postmaster_of(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("select pg_backend_pid()").fetchone()
        assert row is not None
        return _proc_times(int(row[0]))[0]  # (while the backend is there)


class WaitSampler(threading.Thread):
    """Samples the active backends of one database and their wait events."""

    def __init__(self, url: str, database: str, every: float = 0.02) -> None:
        super().__init__(daemon=True)
        self._url, self._database, self._every = url, database, every
        self.stop = threading.Event()
        self.active = 0
        self.waits: collections.Counter[str] = collections.Counter()

    def run(self) -> None:
        with psycopg.connect(self._url, autocommit=True) as conn:
            while not self.stop.is_set():
                rows = conn.execute(
                    "select wait_event_type, wait_event from pg_stat_activity "
                    "where datname = %s and state = 'active' and pid <> pg_backend_pid()",
                    (self._database,),
                ).fetchall()
                self.active += len(rows)
                for kind, event in rows:
                    if kind is not None:
                        self.waits[f"{kind}:{event}"] += 1
                self.stop.wait(self._every)

    def share(self, *kinds: str) -> float:
        """The share of active samples waiting on one of ``kinds``."""
        waiting = sum(n for key, n in self.waits.items() if key.partition(":")[0] in kinds)
        return waiting / self.active if self.active else 0.0


@dataclass
class Figures:
    rate: dict[int, list[float]] = field(default_factory=dict)
    cpu: dict[int, list[float]] = field(default_factory=dict)
    pg_cpu: dict[int, list[float]] = field(default_factory=dict)
    lock: dict[int, list[float]] = field(default_factory=dict)
    lwlock: dict[int, list[float]] = field(default_factory=dict)
    events: dict[int, collections.Counter[str]] = field(default_factory=dict)
    xacts: dict[int, list[float]] = field(default_factory=dict)
    wal: dict[int, list[float]] = field(default_factory=dict)


def _server_counters(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """The next transaction id and the WAL insert position (bytes): both move
    at once, unlike the cumulative statistics, which backends send lazily."""
    row = conn.execute(
        "select pg_snapshot_xmax(pg_current_snapshot())::text::bigint, "
        "pg_current_wal_insert_lsn() - '0/0'::pg_lsn"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _worker_cpu(pids: list[int]) -> float:
    """Seconds of CPU the worker processes have used (their own threads)."""
    return sum(_proc_times(pid)[1] for pid in pids) / TICKS


def _listening(conn: psycopg.Connection[Any], processes: int, within: float = 120) -> None:
    """Wait until ``processes`` sessions of the database have run LISTEN
    (each worker's listener: it is started and waiting for jobs)."""
    deadline = time.monotonic() + within
    while True:
        row = conn.execute(
            "select count(*) from pg_stat_activity "
            "where datname = 'gw_bench' and query ilike 'listen%%'"
        ).fetchone()
        if row is not None and row[0] >= processes:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{processes} workers did not start within {within}s")
        time.sleep(0.05)


@contextlib.contextmanager
def _fleet(
    pg: PgServer,
    system: System,
    processes: int,
    concurrency: int,
    pool_size: int,
    extra: Sequence[str],
) -> Iterator[tuple[str, list[subprocess.Popen[bytes]]]]:
    """``processes`` long-running workers of ``system`` on a fresh database,
    listening (its URL and the processes); stopped with SIGTERM after the
    block (this worker's must exit with 0)."""
    url = fresh_database(pg, system, "gw_bench")
    args = ("-j", str(concurrency), "--max-pool-size", str(pool_size), *extra)
    procs = [system.start(url, *args) for _ in range(processes)]
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            _listening(conn, processes)
        yield url, procs
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(timeout=60) for p in procs]
    assert codes == [0] * processes or not system.name.startswith("python"), codes


def drain(
    pg: PgServer,
    system: System,
    jobs: int,
    processes: int,
    concurrency: int,
    pool_size: int,
    extra: Sequence[str] = (),
) -> tuple[float, float, float, float, float, WaitSampler]:
    """One drain by long-running workers, started and idle first (their
    start-up is not measured): jobs/s from the commit of the jobs to the
    empty queue, the workers' CPU and PostgreSQL's CPU over that time (s per
    1,000 jobs), write transactions per 1,000 jobs, WAL bytes per job, and the
    wait samples."""
    fleet = _fleet(pg, system, processes, concurrency, pool_size, extra)
    with fleet as (url, procs), psycopg.connect(url, autocommit=True) as conn:
        time.sleep(1)  # their first fetches and heartbeats done
        postmaster = postmaster_of(url)
        sampler = WaitSampler(pg.admin_url, "gw_bench")
        pids = [p.pid for p in procs]
        conn.execute(
            "select count(*) from graphile_worker.add_jobs(array(select ('noop', null, "
            "null, null, null, null, null, null)::graphile_worker.job_spec "
            "from generate_series(1, %s)))",
            (jobs,),
        )
        # Committed: the workers are told. (The add's own work is not counted.)
        start = time.perf_counter()
        cpu_before, pg_before = _worker_cpu(pids), server_cpu(postmaster)
        xid_before, wal_before = _server_counters(conn)
        sampler.start()
        while conn.execute(
            "select exists (select from graphile_worker._private_jobs)"
        ).fetchone() != (False,):
            time.sleep(0.01)
        wall = time.perf_counter() - start
        cpu_after, pg_after = _worker_cpu(pids), server_cpu(postmaster)
        xid_after, wal_after = _server_counters(conn)
        sampler.stop.set()
        sampler.join()
    return (
        jobs / wall,
        (cpu_after - cpu_before) / jobs * 1000,
        (pg_after - pg_before) / jobs * 1000,
        (xid_after - xid_before) / jobs * 1000,
        (wal_after - wal_before) / jobs,
        sampler,
    )


def idle(
    pg: PgServer,
    system: System,
    processes: int,
    concurrency: int,
    pool_size: int,
    seconds: float,
    extra: Sequence[str] = (),
) -> tuple[float, float]:
    """What a fleet costs while it waits for jobs: the workers' CPU and
    PostgreSQL's CPU over ``seconds`` with no job (milliseconds per second),
    after their start-up."""
    with _fleet(pg, system, processes, concurrency, pool_size, extra) as (url, procs):
        time.sleep(2)  # their first fetches and heartbeats done
        postmaster = postmaster_of(url)
        pids = [p.pid for p in procs]
        start = time.perf_counter()
        cpu_before, pg_before = _worker_cpu(pids), server_cpu(postmaster)
        time.sleep(seconds)
        wall = time.perf_counter() - start
        cpu_after, pg_after = _worker_cpu(pids), server_cpu(postmaster)
    return 1000 * (cpu_after - cpu_before) / wall, 1000 * (pg_after - pg_before) / wall


def idle_table(
    systems: list[System], counts: list[int], args: argparse.Namespace, pg: PgServer
) -> None:
    """``--idle``: each count's idle cost, rounds alternating the systems."""
    worker: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    server: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    for round_ in range(args.rounds):
        for count in counts:
            order = systems if (round_ + count) % 2 == 0 else systems[::-1]
            for system in order:
                extra = args.py_args.split() if system.name.startswith("python") else []
                ms, pg_ms = idle(
                    pg, system, count, args.concurrency, args.max_pool_size, args.idle, extra
                )
                worker[system.name, count].append(ms)
                server[system.name, count].append(pg_ms)
                print(
                    f"round {round_ + 1}, {count} idle process(es), {system.name}: workers "
                    f"{ms:.1f} ms/s, PostgreSQL {pg_ms:.1f} ms/s",
                    file=sys.stderr,
                    flush=True,
                )
    pg.drop_database("gw_bench")
    print(
        f"\nIdle: -j {args.concurrency} --max-pool-size {args.max_pool_size} per process, "
        f"CPU over {args.idle:g} s without jobs, {args.rounds} rounds (median [min-max]), "
        "in ms of CPU per second (1,000 is one core)\n"
    )
    print("| processes | system | workers' CPU | PostgreSQL's CPU | workers' CPU / process |")
    print("|---" * 5 + "|")
    for count in counts:
        for s in systems:
            ms = worker[s.name, count]
            print(
                f"| {count} | {s.name} | {_fmt(ms, 1)} | {_fmt(server[s.name, count], 1)} | "
                f"{_fmt([m / count for m in ms], 1)} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--processes", default="1,2,4,8,16")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--max-pool-size",
        type=int,
        default=2,
        help="each process's pool (both systems): 16 processes must fit in the server's "
        "max_connections (100 by default); this worker also has a fetch, a LISTEN and a "
        "heartbeat connection, Node a LISTEN one",
    )
    parser.add_argument(
        "--node-defaults",
        action="store_true",
        help="also Node with its default settings (about 2,000 jobs/s here: 200,000 jobs take "
        "minutes a run); Node with batching always runs",
    )
    parser.add_argument(
        "--py-args",
        default="",
        help="more options for this worker's processes (e.g. "
        "'--complete-job-batch-delay 0.01'), to try a setting",
    )
    parser.add_argument("--no-node", action="store_true", help="this worker only")
    parser.add_argument(
        "--idle",
        type=float,
        metavar="SECONDS",
        help="measure what the processes cost while they wait for jobs (CPU over SECONDS "
        "without a job) instead of drains",
    )
    parser.add_argument(
        "--compare-with",
        metavar="DIR",
        help="also this worker from another checkout (its worker_cli package), e.g. a "
        "`git worktree` of the previous commit: before/after in the same run",
    )
    args = parser.parse_args()
    counts = [int(n) for n in args.processes.split(",")]

    scratch = Path(tempfile.mkdtemp(prefix="gw-fleet-"))
    py_cli = str(Path(sys.executable).parent / "graphile-worker")
    precompile(REPO, *([Path(args.compare_with).resolve()] if args.compare_with else []))
    node = install("0.18.0")
    node_bin = node_runtime()
    node_cmd = [node_bin, str(node.cli.resolve())]
    batch = _system("node, batching", node_cmd, scratch / "node-b", NODE_TASKS, latency=False)
    (batch.workdir / "graphile.config.cjs").write_text(NODE_BATCH_CONFIG)
    systems = [_system("python", [py_cli], scratch / "python", PY_TASKS)]
    if args.compare_with:
        other = str(Path(args.compare_with).resolve())
        before = scratch / "python-before"
        systems.append(
            _system("python, before", [py_cli], before, PY_TASKS, env={"PYTHONPATH": other})
        )
    if not args.no_node:
        systems.append(batch)
    if args.node_defaults:
        systems.append(_system("node", node_cmd, scratch / "node", NODE_TASKS, latency=False))
    figures = {s.name: Figures() for s in systems}
    with start_server() as pg:
        if args.idle:
            idle_table(systems, counts, args, pg)
            return
        for round_ in range(args.rounds):
            for count in counts:
                order = systems if (round_ + count) % 2 == 0 else systems[::-1]
                for system in order:
                    extra = args.py_args.split() if system.name.startswith("python") else []
                    rate, cpu, pg_cpu, xacts, wal, sampler = drain(
                        pg, system, args.jobs, count, args.concurrency, args.max_pool_size, extra
                    )
                    f = figures[system.name]
                    f.rate.setdefault(count, []).append(rate)
                    f.cpu.setdefault(count, []).append(cpu)
                    f.pg_cpu.setdefault(count, []).append(pg_cpu)
                    f.xacts.setdefault(count, []).append(xacts)
                    f.wal.setdefault(count, []).append(wal)
                    f.lock.setdefault(count, []).append(100 * sampler.share("Lock"))
                    f.lwlock.setdefault(count, []).append(100 * sampler.share("LWLock"))
                    f.events.setdefault(count, collections.Counter()).update(sampler.waits)
                    print(
                        f"round {round_ + 1}, {count} process(es), {system.name}: "
                        f"{rate:,.0f} jobs/s, worker CPU {cpu:.3f} s/1k, PostgreSQL CPU "
                        f"{pg_cpu:.3f} s/1k, {xacts:.1f} transactions/1k, "
                        f"WAL {wal:,.0f} B/job, waits Lock {sampler.share('Lock'):.1%} "
                        f"LWLock {sampler.share('LWLock'):.1%}",
                        file=sys.stderr,
                        flush=True,
                    )
        pg.drop_database("gw_bench")

    print(
        f"\n{args.jobs:,} jobs, -j {args.concurrency} --max-pool-size {args.max_pool_size} per "
        f"process, {args.rounds} rounds "
        "(median [min-max]); worker and PostgreSQL CPU in s per 1,000 jobs; waits: share of "
        "the active backends' samples waiting on a Lock / LWLock; write transactions per "
        "1,000 jobs; WAL bytes per job\n"
    )
    print(
        "| processes | system | jobs/s | / node | / node, batching | worker CPU | "
        "PostgreSQL CPU | transactions / 1k | WAL B / job | Lock waits % | LWLock waits % | "
        "most frequent waits |"
    )
    print("|---" * 12 + "|")
    for count in counts:
        for s in systems:
            f = figures[s.name]
            vs = [
                _ratio(f.rate[count], figures[other].rate[count]) if other in figures else ""
                for other in ("node", "node, batching")
            ]
            top = ", ".join(f"{k} {n}" for k, n in f.events[count].most_common(3))
            print(
                f"| {count} | {s.name} | {_fmt(f.rate[count])} | {vs[0]} | {vs[1]} | "
                f"{_fmt(f.cpu[count], 3)} | {_fmt(f.pg_cpu[count], 3)} | "
                f"{_fmt(f.xacts[count], 1)} | {_fmt(f.wal[count])} | "
                f"{_fmt(f.lock[count], 1)} | {_fmt(f.lwlock[count], 1)} | {top} |"
            )
    best = max(statistics.median(v) for v in figures["python"].rate.values())
    last = statistics.median(figures["python"].rate[counts[-1]])
    print(f"\npython: {counts[-1]} processes at {last / best:.2f}x its best count's rate")


if __name__ == "__main__":
    main()
