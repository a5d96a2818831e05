"""use_local_time: the application's clock in place of the database's now().

Each test runs a process whose clock libfaketime shifts by an hour, with the
option and without it, and looks at what the database then holds: which jobs
ran, when they were locked, the run_at of jobs added without one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from dbhelpers import rows, run_cli, value
from fault_helpers import faketime_env

pytestmark = pytest.mark.db

HOUR = 3600.0

CLOCK_TASK = """\
async def task(payload, helpers):
    [queue] = await helpers.query(
        "select locked_at from graphile_worker._private_job_queues where queue_name = %s",
        (helpers.job.queue_name,),
    )
    await helpers.query(
        "insert into public.clock_runs (job_id, job_locked_at, queue_locked_at) "
        "values (%s, %s, %s)",
        (helpers.job.id, helpers.job.locked_at, queue["locked_at"]),
    )
    await helpers.add_job("follow_up")
"""


def _hours_after(moment: datetime, reference: datetime) -> float:
    return (moment - reference).total_seconds() / HOUR


def _jobs(db: str) -> list[dict[str, Any]]:
    return rows(
        db,
        "select t.identifier, j.run_at, j.attempts from graphile_worker._private_jobs as j "
        "join graphile_worker._private_tasks as t on t.id = j.task_id order by j.id",
    )


@pytest.mark.parametrize("how", ["flag", "envvar", "off"])
def test_a_worker_whose_clock_is_ahead_runs_a_job_due_by_its_clock_only_with_the_option(
    db: str, tmp_path: Path, how: str
) -> None:
    """The job is due 30 minutes from the database's now, and already due on
    the worker's clock (an hour ahead): the worker runs it only with
    --use-local-time, locks it and its queue at its own time, and a job its
    task adds gets its own time as run_at."""
    rows(
        db,
        "create table public.clock_runs (job_id bigint, job_locked_at timestamptz, "
        "queue_locked_at timestamptz)",
    )
    [job] = rows(
        db,
        "select id from graphile_worker.add_job('clock', queue_name => 'q', "
        "run_at => now() + interval '30 minutes')",
    )
    db_now = value(db, "select now()")
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "clock.py").write_text(CLOCK_TASK)
    env = faketime_env("+1h")
    flags = []
    if how == "flag":
        flags.append("--use-local-time")
    elif how == "envvar":
        env["GRAPHILE_WORKER_USE_LOCAL_TIME"] = "1"
    result = run_cli("-c", db, "--once", *flags, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    runs = rows(db, "select * from public.clock_runs")
    if how == "off":
        assert runs == []
        assert [(j["identifier"], j["attempts"]) for j in _jobs(db)] == [("clock", 0)]
        return
    [run] = runs
    assert run["job_id"] == job["id"]
    assert _hours_after(run["job_locked_at"], db_now) == pytest.approx(1, abs=0.02)
    assert _hours_after(run["queue_locked_at"], db_now) == pytest.approx(1, abs=0.02)
    [follow_up] = _jobs(db)  # the clock job succeeded and is gone
    assert follow_up["identifier"] == "follow_up"
    assert _hours_after(follow_up["run_at"], db_now) == pytest.approx(1, abs=0.02)


ADD_JOBS_SCRIPT = """\
import asyncio, sys
from datetime import datetime, timezone
from worker_cli import JobSpec, make_worker_utils, quick_add_job, quick_add_job_sync


async def main():
    local = sys.argv[2] == "on"
    await quick_add_job("quick", connection_string=sys.argv[1], use_local_time=local)
    quick_add_job_sync("quick", connection_string=sys.argv[1], use_local_time=local)
    async with make_worker_utils(sys.argv[1], use_local_time=local) as utils:
        await utils.add_job("one")
        await utils.add_job("one_unique", unique={"period": 60})
        await utils.add_jobs([JobSpec(identifier="many"), {"identifier": "many", "run_at": None}])
        await utils.add_jobs([{"identifier": "many_unique"}], unique={"period": 60})
        await utils.add_job("explicit", run_at=datetime(2030, 1, 1, tzinfo=timezone.utc))
        await utils.add_jobs(
            [{"identifier": "explicit", "run_at": datetime(2030, 1, 1, tzinfo=timezone.utc)}]
        )


asyncio.run(main())
"""


@pytest.mark.parametrize("option", ["on", "off"])
def test_worker_utils_give_jobs_without_run_at_the_application_time_with_the_option(
    db: str, option: str
) -> None:
    """In a process whose clock is an hour behind, quick_add_job(_sync),
    add_job and add_jobs (with and without unique) give a job added without run_at that clock's time
    with use_local_time, and the database's now() without; an explicit
    run_at is kept either way."""
    db_now = value(db, "select now()")
    result = run_cli_python(ADD_JOBS_SCRIPT, db, option, env=faketime_env("-1h"))
    assert result.returncode == 0, result.stderr
    jobs = _jobs(db)
    assert [j["identifier"] for j in jobs] == [
        "quick",
        "quick",
        "one",
        "one_unique",
        "many",
        "many",
        "many_unique",
        "explicit",
        "explicit",
    ]
    expected = -1 if option == "on" else 0
    for one in jobs:
        if one["identifier"] == "explicit":
            assert one["run_at"] == datetime.fromisoformat("2030-01-01T00:00:00+00:00")
        else:
            assert _hours_after(one["run_at"], db_now) == pytest.approx(expected, abs=0.02), one


SWEEP_SCRIPT = """\
import asyncio, sys
from datetime import timedelta
from worker_cli import make_worker_utils
from worker_cli.worker.background.maintenance import Sweeper


async def main():
    async with make_worker_utils(sys.argv[1], use_local_time=sys.argv[2] == "on") as utils:
        sweeper = Sweeper(
            utils,
            schema=utils.schema,
            stale_lock_timeout=timedelta(hours=2),
            interval=(60, 60),
            on_released=lambda: print("released"),
        )
        await sweeper.release_stale_locks()


asyncio.run(main())
"""


@pytest.mark.parametrize("option", ["on", "off"])
def test_the_stale_lock_sweep_of_a_worker_ahead_uses_its_clock_with_the_option(
    db: str, option: str
) -> None:
    """A job and its queue locked 90 minutes ago (database time) by a pool that
    is gone: with a 2-hour stale-lock timeout, a worker an hour ahead finds
    them stale only on its own clock."""
    rows(
        db,
        "select graphile_worker.add_job('stuck', queue_name => 'q');"
        "update graphile_worker._private_jobs set locked_at = now() - interval '90 minutes', "
        "locked_by = 'pool-gone', attempts = 1;"
        "update graphile_worker._private_job_queues "
        "set locked_at = now() - interval '90 minutes', locked_by = 'pool-gone';",
    )
    result = run_cli_python(SWEEP_SCRIPT, db, option, env=faketime_env("+1h"))
    assert result.returncode == 0, result.stderr
    locks = rows(
        db,
        "select (select locked_by from graphile_worker._private_jobs) as job, "
        "(select locked_by from graphile_worker._private_job_queues) as queue",
    )
    if option == "on":
        assert result.stdout.split() == ["released"]
        assert locks == [{"job": None, "queue": None}]
    else:
        assert result.stdout.split() == []
        assert locks == [{"job": "pool-gone", "queue": "pool-gone"}]


def test_the_fetch_on_the_local_clock_is_the_fetch_with_now_replaced(db: str) -> None:
    """The two py_get_jobs overloads cannot drift apart: the five-argument one
    (use_local_time) is the four-argument one with now() read from now_at."""
    functions = {
        row["arity"]: row
        for row in rows(
            db,
            "select p.pronargs as arity, p.prosrc as source, p.proconfig as settings "
            "from pg_proc as p join pg_namespace as n on n.oid = p.pronamespace "
            "where n.nspname = 'graphile_worker' and p.proname = 'py_get_jobs'",
        )
    }
    assert sorted(functions) == [4, 5]
    four, five = functions[4], functions[5]
    assert four["source"].count("now()") == 3
    assert "now()" not in five["source"]
    assert five["source"] == four["source"].replace("now()", "now_at")
    assert five["settings"] == four["settings"]


def run_cli_python(
    script: str, *args: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a Python process of this environment (argv: ``args``)."""
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
