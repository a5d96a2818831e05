"""Worker processes a test starts (the CLI, Python or Node), each recording
its runs in ``public.runs`` (database time) so that a test can check that no
job ran twice and no two runs of one named queue overlapped."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from dbhelpers import rows, value

RECORD_PY = '''\
import asyncio


async def task(payload, helpers):
    """Record the run (in database time) in public.runs."""
    async with helpers.with_pg_client() as conn:
        cur = await conn.execute("select clock_timestamp()")
        started = (await cur.fetchone())[0]
        await asyncio.sleep(payload.get("sleep", 0))
        if payload.get("spawn"):
            await helpers.add_job(payload["spawn"], {"from": "python"})
        await conn.execute(
            "insert into public.runs"
            " (job_id, job_queue_id, task, runner, payload, started, finished)"
            " values (%s, %s, %s, 'python', %s, %s, clock_timestamp())",
            (helpers.job.id, helpers.job.job_queue_id, helpers.job.task_identifier,
             __import__("json").dumps(payload), started),
        )
'''

RECORD_NODE = """\
module.exports = async (payload, helpers) => {
  const { rows: [r] } = await helpers.query("select clock_timestamp() as t");
  await new Promise((resolve) => setTimeout(resolve, payload.sleep ? payload.sleep * 1000 : 0));
  if (payload.spawn) await helpers.addJob(payload.spawn, { from: "node" });
  await helpers.query(
    "insert into public.runs (job_id, job_queue_id, task, runner, payload, started, finished)" +
      " values ($1, $2, $3, 'node', $4, $5, clock_timestamp())",
    [helpers.job.id, helpers.job.job_queue_id, helpers.job.task_identifier,
     JSON.stringify(payload), r.t],
  );
};
"""


def make_tasks(folder: Path, names: list[str], node: bool = False) -> Path:
    tasks = folder / "tasks"
    tasks.mkdir(parents=True)
    for name in names:
        if node:
            (tasks / f"{name}.cjs").write_text(RECORD_NODE)
        else:
            (tasks / f"{name}.py").write_text(RECORD_PY)
    return folder


def create_runs(db: str) -> None:
    rows(
        db,
        "create table public.runs (seq bigserial primary key, job_id bigint, job_queue_id int, "
        "task text, runner text, payload json, started timestamptz, finished timestamptz)",
    )


def start(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL" and not k.startswith("PG")}
    env["NO_LOG_SUCCESS"] = "1"
    return subprocess.Popen(
        args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_for(db: str, query: str, expected: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value(db, query) >= expected:
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {query!r} to reach {expected}: {value(db, query)}")


def wait_until_listening(db: str, count: int) -> None:
    """Until ``count`` workers hold a LISTEN connection: they are all running."""
    wait_for(
        db,
        "select count(*) from pg_stat_activity "
        "where datname = current_database() and query ilike 'listen%%worker:migrate%%'",
        count,
    )


def stop(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str]]:
    for proc in procs:
        proc.send_signal(signal.SIGINT)
    return [(proc.wait(timeout=30), proc.stderr.read() if proc.stderr else "") for proc in procs]


def overlapping_runs(db: str) -> list[dict[str, object]]:
    """Pairs of runs of one named queue whose time spans overlap."""
    return rows(
        db,
        "select a.job_id as a, b.job_id as b, a.job_queue_id from public.runs a join public.runs b "
        "on a.job_queue_id = b.job_queue_id and a.seq < b.seq "
        "and a.started < b.finished and b.started < a.finished",
    )
