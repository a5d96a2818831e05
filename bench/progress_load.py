"""Progress benchmark (issue 46): does ``helpers.progress`` called in a loop by
50 running tasks slow a drain of other jobs?

Not part of the test run. One CLI worker (``-j 60``, history on) on a fresh
database per round: 50 long jobs take 50 slots first (priority -1) and loop
until the drain is over, each turn sleeping ``--turn-ms`` (1 ms: about 900
turns a second each, 45,000 in all); in the *progress* rounds each turn also
calls ``helpers.progress`` with a message, in the *baseline* rounds it does
not. The other 10 slots drain N no-op jobs.
Rounds alternate (baseline, progress, progress, baseline, ...); each reports
the drain's jobs/s (first no-op start to the last one's end, from the
history) and the worker's CPU seconds per 1,000 jobs (``/proc``).

    TEST_DATABASE_URL=postgres://postgres@127.0.0.1/postgres \\
        python bench/progress_load.py --jobs 200000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

TASKS = {
    "noop.py": "async def task(payload, helpers):\n    return None\n",
    "reporter.py": (
        "import asyncio\n\n"
        "async def task(payload, helpers):\n"
        "    turn = 0\n"
        "    every = max(1, int(0.5 / payload['turn']))  # look for the stop every ~0.5 s\n"
        "    while not helpers.abort_signal.is_set():\n"
        "        turn += 1\n"
        "        if payload['progress']:\n"
        "            helpers.progress(turn % 1000, 1000, f'turn {turn}')\n"
        "        await asyncio.sleep(payload['turn'])\n"
        "        if turn % every == 0:\n"
        '            rows = await helpers.query("select exists (select 1 from public.stop)")\n'
        "            if rows[0]['exists']:\n"
        "                return turn\n"
    ),
}


def cli() -> str:
    return str(Path(sys.executable).parent / "graphile-worker")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_round(
    admin: str, workdir: Path, jobs: int, progress: bool, turn: float
) -> tuple[float, float]:
    name = "gw_bench_progress"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"drop database if exists {name}")
        conn.execute(f"create database {name}")
    url = admin.rsplit("/", 1)[0] + "/" + name
    subprocess.run([cli(), "-c", url, "--schema-only"], cwd=workdir, check=True)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("create table public.stop (at timestamptz)")
        conn.execute(
            "select graphile_worker.add_job('reporter', "
            "json_build_object('progress', %s, 'turn', %s), priority => -1) "
            "from generate_series(1, 50)",
            (progress, turn),
        )
        conn.execute(
            "select graphile_worker.add_jobs(array_agg(row('noop', '{}'::json, null, null, "
            "null, null, null, null)::graphile_worker.job_spec)) "
            "from generate_series(1, %s)",
            (jobs,),
        )
    env = {**os.environ, "NO_LOG_SUCCESS": "1"}
    worker = subprocess.Popen(
        [cli(), "-c", url, "-j", "60"], cwd=workdir, env=env, stderr=subprocess.DEVNULL
    )
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            left = (
                "select exists (select 1 from graphile_worker._private_jobs where task_id = "
                "(select id from graphile_worker._private_tasks where identifier = 'noop'))"
            )
            while conn.execute(left).fetchone()[0]:  # type: ignore[index]
                time.sleep(0.2)
            cpu = cpu_seconds(worker.pid)
            conn.execute("insert into public.stop values (now())")
            span = conn.execute(
                "select extract(epoch from max(h.finished_at) - min(h.started_at)) "
                "from graphile_worker._private_py_job_history as h where h.task_identifier = 'noop'"
            ).fetchone()[0]  # type: ignore[index]
            writes = conn.execute(
                "select count(*) from graphile_worker._private_py_job_progress"
            ).fetchone()[0]  # type: ignore[index]
    finally:
        worker.send_signal(signal.SIGINT)
        worker.wait(timeout=60)
    print(
        f"  {'progress' if progress else 'baseline'}: {jobs / float(span):,.0f} jobs/s, "
        f"{cpu * 1000 / jobs:.3f} CPU s per 1,000 (worker, whole run); "
        f"progress rows {writes}",
        flush=True,
    )
    return jobs / float(span), cpu * 1000 / jobs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3, help="pairs of rounds")
    parser.add_argument(
        "--turn-ms", type=float, default=1.0, help="each long job's sleep between two reports"
    )
    args = parser.parse_args()
    admin = os.environ.get("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "tasks").mkdir()
        for file, text in TASKS.items():
            (workdir / "tasks" / file).write_text(text)
        ratios_rate: list[float] = []
        ratios_cpu: list[float] = []
        for index in range(args.rounds):
            order = [False, True] if index % 2 == 0 else [True, False]
            results = {
                p: one_round(admin, workdir, args.jobs, p, args.turn_ms / 1000) for p in order
            }
            ratios_rate.append(results[True][0] / results[False][0])
            ratios_cpu.append(results[True][1] / results[False][1])
    print(
        f"progress / baseline: jobs/s {statistics.median(ratios_rate):.3f}x "
        f"[{min(ratios_rate):.3f}-{max(ratios_rate):.3f}], worker CPU per job "
        f"{statistics.median(ratios_cpu):.3f}x [{min(ratios_cpu):.3f}-{max(ratios_cpu):.3f}] "
        f"over {args.rounds} pairs of {args.jobs:,} jobs, reports every {args.turn_ms:g} ms"
    )


if __name__ == "__main__":
    main()
