"""Workflow benchmark (issue 45): what a workflow step costs beside a job.

Not part of the test run. One CLI worker (``-j 10``, history on, as users run
it) on a fresh database; every task sends ``CLOCK_MONOTONIC`` over UDP at the
moment that matters (a parent just before it returns, a child as it starts).

- latency: on an idle worker, ``add_job`` -> the job's start, against a
  parent's return -> its child's start (a workflow of two steps), samples
  interleaved; p50 and p95 of each and their ratio;
- fan-out 1 -> N: the parent's return -> every child a job (the steps'
  ``queued_at``, database clock, against the parent's ``finished_at``) and ->
  the last child started;
- fan-in N -> 1: the last parent's return -> the child's start;
- chain of C steps: steps per second, first start to last start.

    TEST_DATABASE_URL=postgres://postgres@127.0.0.1/postgres python bench/workflows.py
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from pg_server import PgServer, start_server

#: Each task sends "<tag> <id> <monotonic ns>" to the benchmark's port.
SEND = (
    "import socket, time\n"
    "_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\n"
    "def send(tag, payload):\n"
    "    _sock.sendto(f\"{tag} {payload['id']} {time.monotonic_ns()}\".encode(),"
    " ('127.0.0.1', payload['port']))\n"
)
TASKS = {
    # A job's or a child's start.
    "start.py": SEND + "\nasync def task(payload, helpers):\n    send('start', payload)\n",
    # A parent's return (its last statement).
    "parent.py": SEND
    + "\nasync def task(payload, helpers):\n    send('end', payload)\n    return payload['id']\n",
}


def cli() -> str:
    return str(Path(sys.executable).parent / "graphile-worker")


def fresh(pg: PgServer, name: str, workdir: Path) -> str:
    pg.drop_database(name)
    with psycopg.connect(pg.admin_url, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("create database {}").format(psycopg.sql.Identifier(name)))
    url = pg.url(name)
    subprocess.run(
        [cli(), "-c", url, "--schema-only"], cwd=workdir, check=True, capture_output=True
    )
    return url


class Receiver:
    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 24)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(60)
        self.port = self.sock.getsockname()[1]

    def take(self, count: int) -> list[tuple[str, int, int]]:
        got = []
        while len(got) < count:
            tag, ident, ns = self.sock.recv(200).decode().split()
            got.append((tag, int(ident), int(ns)))
        return got


def worker(url: str, workdir: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL" and not k.startswith("PG")}
    env["NO_LOG_SUCCESS"] = "1"
    with open(workdir / "worker.log", "ab") as log:
        return subprocess.Popen(
            [cli(), "-c", url, "-j", "10"], cwd=workdir, env=env, stdout=log, stderr=log
        )


def wait_listening(conn: psycopg.Connection[Any]) -> None:
    deadline = time.monotonic() + 30
    while not conn.execute(
        "select count(*) from pg_stat_activity "
        "where datname = current_database() and query ilike 'listen%'"
    ).fetchone()[0]:
        assert time.monotonic() < deadline, "the worker never listened"
        time.sleep(0.05)
    time.sleep(0.5)


def step(ref: str, task: str, payload: dict[str, Any], after: list[str] = ()) -> dict[str, Any]:
    return {"ref": ref, "spec": {"identifier": task, "payload": payload}, "after": list(after)}


def add_workflow(conn: psycopg.Connection[Any], steps: list[dict[str, Any]]) -> int:
    row = conn.execute(
        "select graphile_worker.py_add_workflow('bench', %s::jsonb)", (json.dumps(steps),)
    ).fetchone()
    return int(row[0])


def wait_finished(conn: psycopg.Connection[Any], workflow_id: int, within: float = 300) -> None:
    deadline = time.monotonic() + within
    while (
        conn.execute(
            "select state from graphile_worker._private_py_workflows where id = %s", (workflow_id,)
        ).fetchone()[0]
        == "running"
    ):
        assert time.monotonic() < deadline, f"workflow {workflow_id} did not finish"
        time.sleep(0.05)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


def measure_latency(
    conn: psycopg.Connection[Any], rx: Receiver, samples: int
) -> tuple[list[float], list[float]]:
    jobs: list[float] = []
    steps: list[float] = []
    port = rx.port
    for n in range(samples + 20):
        if n % 2 == 0:
            sent = time.monotonic_ns()
            conn.execute(
                "select graphile_worker.add_job('start', json_build_object('id', %s::int,"
                " 'port', %s::int))",
                (n, port),
            )
            [(_, _, started)] = rx.take(1)
            if n >= 20:
                jobs.append((started - sent) / 1e6)
        else:
            add_workflow(
                conn,
                [
                    step("p", "parent", {"id": n, "port": port}),
                    step("c", "start", {"id": n, "port": port}, ["p"]),
                ],
            )
            got = dict((tag, ns) for tag, _, ns in rx.take(2))
            if n >= 20:
                steps.append((got["start"] - got["end"]) / 1e6)
        time.sleep(random.uniform(0.02, 0.05))  # the worker is idle again
    return jobs, steps


def measure_fan_out(conn: psycopg.Connection[Any], rx: Receiver, width: int) -> dict[str, float]:
    port = rx.port
    steps = [step("root", "parent", {"id": 0, "port": port})]
    steps += [step(f"c{n}", "start", {"id": n, "port": port}, ["root"]) for n in range(width)]
    workflow_id = add_workflow(conn, steps)
    got = rx.take(width + 1)
    wait_finished(conn, workflow_id)
    end = next(ns for tag, _, ns in got if tag == "end")
    last_start = max(ns for tag, _, ns in got if tag == "start")
    queued = conn.execute(
        "select extract(epoch from max(c.queued_at) - p.finished_at) "
        "from graphile_worker._private_py_workflow_steps c, "
        "graphile_worker._private_py_workflow_steps p "
        "where c.workflow_id = %s and p.workflow_id = c.workflow_id and p.ref = 'root' "
        "and c.ref <> 'root' group by p.finished_at",
        (workflow_id,),
    ).fetchone()[0]
    return {"all_jobs_s": float(queued), "last_started_s": (last_start - end) / 1e9}


def measure_fan_in(conn: psycopg.Connection[Any], rx: Receiver, width: int) -> dict[str, float]:
    port = rx.port
    steps = [step(f"p{n}", "parent", {"id": n, "port": port}) for n in range(width)]
    steps.append(step("join", "start", {"id": -1, "port": port}, [f"p{n}" for n in range(width)]))
    workflow_id = add_workflow(conn, steps)
    got = rx.take(width + 1)
    wait_finished(conn, workflow_id)
    last_end = max(ns for tag, _, ns in got if tag == "end")
    start = next(ns for tag, _, ns in got if tag == "start")
    return {"child_started_s": (start - last_end) / 1e9}


def measure_chain(conn: psycopg.Connection[Any], rx: Receiver, length: int) -> float:
    port = rx.port
    steps = [step("s0", "start", {"id": 0, "port": port})]
    steps += [
        step(f"s{n}", "start", {"id": n, "port": port}, [f"s{n - 1}"]) for n in range(1, length)
    ]
    workflow_id = add_workflow(conn, steps)
    got = rx.take(length)
    wait_finished(conn, workflow_id)
    times = sorted(ns for _, _, ns in got)
    return (length - 1) / ((times[-1] - times[0]) / 1e9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300, help="latency samples of each kind")
    parser.add_argument("--width", type=int, default=10_000, help="fan-out and fan-in width")
    parser.add_argument("--chain", type=int, default=1000, help="chain length")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, start_server() as pg:
        workdir = Path(tmp) / "work"
        (workdir / "tasks").mkdir(parents=True)
        for name, text in TASKS.items():
            (workdir / "tasks" / name).write_text(text)
        rx = Receiver()
        results: dict[str, list[float]] = {}
        for round_ in range(args.rounds):
            url = fresh(pg, "gw_wf_bench", workdir)
            proc = worker(url, workdir)
            try:
                with psycopg.connect(url, autocommit=True) as conn:
                    wait_listening(conn)
                    jobs, steps = measure_latency(conn, rx, args.samples)
                    out = measure_fan_out(conn, rx, args.width)
                    fan_in = measure_fan_in(conn, rx, args.width)
                    chain = measure_chain(conn, rx, args.chain)
            finally:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=60)
            figures = {
                "job p50 ms": statistics.median(jobs),
                "job p95 ms": pct(jobs, 0.95),
                "step p50 ms": statistics.median(steps),
                "step p95 ms": pct(steps, 0.95),
                "step/job p50": statistics.median(steps) / statistics.median(jobs),
                f"fan-out 1->{args.width}: all jobs s": out["all_jobs_s"],
                f"fan-out 1->{args.width}: last started s": out["last_started_s"],
                f"fan-in {args.width}->1: child started s": fan_in["child_started_s"],
                f"chain {args.chain}: steps/s": chain,
            }
            print(f"round {round_ + 1}: " + ", ".join(f"{k} {v:.3g}" for k, v in figures.items()))
            for key, value in figures.items():
                results.setdefault(key, []).append(value)
        print("\nmedian [min-max] over rounds:")
        for key, values in results.items():
            print(f"  {key}: {statistics.median(values):.3g} [{min(values):.3g}-{max(values):.3g}]")


if __name__ == "__main__":
    main()
