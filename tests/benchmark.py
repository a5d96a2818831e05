"""Side-by-side benchmark: this worker against graphile-worker (Node) 0.18.

Not part of the test run. Reproduces the method of graphile-worker's perfTest
on one PostgreSQL server, alternating the two systems each round:

- start-up: ``--once -j C`` on an empty, migrated queue, process start to exit;
- throughput: N trivial jobs added in one ``add_jobs`` call, then P worker
  processes with ``--once -j C``; jobs/s net of the start-up time;
- latency: one idle worker (``-j C``); a job is added, the task's first
  statement sends CLOCK_MONOTONIC over UDP; add_job call to task start.

    python tests/benchmark.py                      # embedded PostgreSQL, 3 rounds
    TEST_DATABASE_URL=postgres://postgres@127.0.0.1/postgres python tests/benchmark.py --rounds 5

Node runs from the npm package (installed into the test cache, as the
compatibility tests do) with the ``node`` on PATH, or ``--node BIN``.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from node_worker import install
from pg_server import PgServer, start_server

PY_TASKS = {
    "noop.py": "async def task(payload, helpers):\n    return None\n",
    "latency.py": (
        "import socket, time\n"
        "_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\n"
        "async def task(payload, helpers):\n"
        "    _sock.sendto(f\"{payload['id']} {time.monotonic_ns()}\".encode(),"
        " ('127.0.0.1', payload['port']))\n"
    ),
}
NODE_TASKS = {
    "noop.cjs": "module.exports = async () => {};\n",
    "latency.cjs": (
        'const dgram = require("dgram");\n'
        'const sock = dgram.createSocket("udp4");\n'
        "module.exports = async (payload) => {\n"
        "  sock.send(`${payload.id} ${process.hrtime.bigint()}`, payload.port, '127.0.0.1');\n"
        "};\n"
    ),
}


@dataclass
class System:
    name: str
    command: list[str]
    workdir: Path
    startup_ms: list[float] = field(default_factory=list)
    throughput: list[float] = field(default_factory=list)
    latency_p50: list[float] = field(default_factory=list)
    latency_p95: list[float] = field(default_factory=list)

    def run(self, url: str, *args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [*self.command, "-c", url, *args],
            cwd=self.workdir,
            env=_env(),
            capture_output=True,
            timeout=600,
            check=False,
        )

    def start(self, url: str, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [*self.command, "-c", url, *args],
            cwd=self.workdir,
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL" and not k.startswith("PG")}
    env["NO_LOG_SUCCESS"] = "1"
    return env


def fresh_database(pg: PgServer, system: System, name: str) -> str:
    pg.drop_database(name)
    with psycopg.connect(pg.admin_url, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("create database {}").format(psycopg.sql.Identifier(name)))
    url = pg.url(name)
    result = system.run(url, "--schema-only")
    if result.returncode != 0:
        raise RuntimeError(f"{system.name} --schema-only failed: {result.stderr.decode()}")
    return url


def measure_startup(pg: PgServer, system: System, concurrency: int, runs: int = 5) -> float:
    url = fresh_database(pg, system, "gw_bench")
    times = []
    for _ in range(runs + 1):
        start = time.perf_counter()
        result = system.run(url, "--once", "-j", str(concurrency))
        times.append((time.perf_counter() - start) * 1000)
        assert result.returncode == 0, result.stderr.decode()
    return statistics.median(times[1:])  # the first run warms caches


def measure_throughput(
    pg: PgServer, system: System, jobs: int, processes: int, concurrency: int, startup_ms: float
) -> float:
    url = fresh_database(pg, system, "gw_bench")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "select count(*) from graphile_worker.add_jobs(array("
            "select ('noop', null, null, null, null, null, null, null)::graphile_worker.job_spec"
            " from generate_series(1, %s)))",
            (jobs,),
        )
        conn.execute("vacuum analyze graphile_worker._private_jobs")
        conn.execute("checkpoint")
    time.sleep(1)
    start = time.perf_counter()
    procs = [system.start(url, "--once", "-j", str(concurrency)) for _ in range(processes)]
    codes = [p.wait(timeout=600) for p in procs]
    wall = time.perf_counter() - start
    with psycopg.connect(url) as conn:
        left = conn.execute("select count(*) from graphile_worker._private_jobs").fetchone()
    assert codes == [0] * processes and left == (0,), (codes, left)
    return jobs / max(wall - startup_ms / 1000, 1e-6)


def measure_latency(
    pg: PgServer, system: System, samples: int, concurrency: int
) -> tuple[float, float]:
    url = fresh_database(pg, system, "gw_bench")
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(5)
    port = receiver.getsockname()[1]
    worker = system.start(url, "-j", str(concurrency))
    latencies = []
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            _wait(
                lambda: (
                    conn.execute(
                        "select count(*) from pg_stat_activity where query ilike 'listen%%'"
                    ).fetchone()
                    >= (1,)
                )
            )
            time.sleep(0.5)
            for n in range(samples + 20):
                sent = time.monotonic_ns()
                conn.execute(
                    "select graphile_worker.add_job("
                    "'latency', json_build_object('id', %s::int, 'port', %s::int))",
                    (n, port),
                )
                job_id, started = receiver.recv(100).decode().split()
                assert int(job_id) == n
                if n >= 20:  # warm-up discarded
                    latencies.append((int(started) - sent) / 1e6)
                time.sleep(random.uniform(0.02, 0.05))  # the worker is idle again
    finally:
        worker.send_signal(signal.SIGINT)
        worker.wait(timeout=30)
        receiver.close()
    latencies.sort()
    return statistics.median(latencies), latencies[int(len(latencies) * 0.95) - 1]


def _wait(check: Callable[[], bool], within: float = 30) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("the worker did not start listening")
        time.sleep(0.05)


def _fmt(values: list[float], digits: int = 0) -> str:
    if not values:
        return "-"
    median, low, high = statistics.median(values), min(values), max(values)
    return f"{median:,.{digits}f} [{low:,.{digits}f}-{high:,.{digits}f}]"


def _ratio(ours: list[float], theirs: list[float], lower_is_better: bool = False) -> str:
    if not ours or not theirs:
        return "-"
    pairs = [(a / b if not lower_is_better else b / a) for a, b in zip(ours, theirs, strict=False)]
    value = statistics.median(ours) / statistics.median(theirs)
    return f"{value:.2f}x (rounds {min(pairs):.2f}-{max(pairs):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=20000, help="jobs per throughput run")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    parser.add_argument("--latency-samples", type=int, default=1000)
    parser.add_argument("--node", default="node", help="the node binary")
    parser.add_argument("--no-node", action="store_true", help="measure this worker only")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="gw-bench-"))
    systems = []
    py_dir = scratch / "python"
    (py_dir / "tasks").mkdir(parents=True)
    for name, text in PY_TASKS.items():
        (py_dir / "tasks" / name).write_text(text)
    systems.append(System("python", [str(Path(sys.executable).parent / "graphile-worker")], py_dir))
    if not args.no_node:
        node = install("0.18.0")
        node_dir = scratch / "node"
        (node_dir / "tasks").mkdir(parents=True)
        for name, text in NODE_TASKS.items():
            (node_dir / "tasks" / name).write_text(text)
        systems.append(System("node", [args.node, str(node.cli)], node_dir))

    with start_server() as pg:
        for round_ in range(args.rounds):
            order = systems if round_ % 2 == 0 else systems[::-1]
            for system in order:
                startup = measure_startup(pg, system, args.concurrency)
                system.startup_ms.append(startup)
                system.throughput.append(
                    measure_throughput(
                        pg, system, args.jobs, args.processes, args.concurrency, startup
                    )
                )
                p50, p95 = measure_latency(pg, system, args.latency_samples, args.concurrency)
                system.latency_p50.append(p50)
                system.latency_p95.append(p95)
                print(
                    f"round {round_ + 1} {system.name}: start-up {startup:.0f} ms, "
                    f"{system.throughput[-1]:,.0f} jobs/s, latency p50 {p50:.2f} p95 {p95:.2f} ms",
                    file=sys.stderr,
                )
        pg.drop_database("gw_bench")

    print(
        f"\n{args.jobs:,} jobs, {args.processes} process(es) x concurrency {args.concurrency}, "
        f"{args.latency_samples} latency samples, {args.rounds} alternating rounds "
        "(median [min-max])\n"
    )
    print("| system | jobs/s (net) | latency p50 ms | latency p95 ms | start+stop `--once` ms |")
    print("|---|---|---|---|---|")
    for s in systems:
        print(
            f"| {s.name} | {_fmt(s.throughput)} | {_fmt(s.latency_p50, 2)} | "
            f"{_fmt(s.latency_p95, 2)} | {_fmt(s.startup_ms)} |"
        )
    if len(systems) == 2:
        py, node_s = systems
        print(
            f"| python / node | {_ratio(py.throughput, node_s.throughput)} | "
            f"{_ratio(py.latency_p50, node_s.latency_p50)} | "
            f"{_ratio(py.latency_p95, node_s.latency_p95)} | "
            f"{_ratio(py.startup_ms, node_s.startup_ms)} |"
        )
    print()


if __name__ == "__main__":
    main()
