"""Cron in a time zone against PostgreSQL: the jobs, their ``_cron``, the known
crontabs, backfill across a change, start-up errors; and the README's examples."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from cron_helpers import FakeClock, cron_jobs, pool, settle, start, stop, wait_for_jobs
from dbhelpers import rows, run_cli, value
from psycopg_pool import AsyncConnectionPool
from readme_blocks import blocks, write_files

from worker_cli import parse_crontab
from worker_cli.jobs.cron_zones import fire_instants
from worker_cli.worker.background.cron_scheduler import CronScheduler

__all__ = ["pool"]  # the fixture

PARIS = ZoneInfo("Europe/Paris")
HEADING = "### Cron in a time zone"


@pytest.mark.db
async def test_a_zoned_job_has_utc_ts_and_local_and_known_crontabs_hold_utc(
    db: str, pool: AsyncConnectionPool[Any]
) -> None:
    items = parse_crontab("30 2 * * * t ?id=paris&tz=Europe/Paris\n30 1 * * * u")
    clock = FakeClock(datetime(2026, 3, 29, 0, 58, 30, tzinfo=UTC))
    task = start(CronScheduler(items, pool, "graphile_worker", clock=clock, default_zone="UTC"))
    try:
        await settle(clock, task)
        await clock.advance(timedelta(minutes=32))  # to 01:30:30 UTC
        await wait_for_jobs(db, 2)
        await settle(clock, task)
    finally:
        await stop(task)
    jobs = {j["task"]: j for j in cron_jobs(db)}
    assert set(jobs) == {"t", "u"}
    assert jobs["t"]["run_at"] == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)  # 02:30 skipped: 03:00
    assert jobs["t"]["payload"] == {
        "_cron": {
            "ts": "2026-03-29T01:00:00.000Z",
            "backfilled": False,
            "local": "2026-03-29T03:00:00+02:00",
        }
    }
    assert jobs["u"]["payload"] == {
        "_cron": {"ts": "2026-03-29T01:30:00.000Z", "backfilled": False}
    }
    last = value(
        db,
        "select last_execution from graphile_worker._private_known_crontabs "
        "where identifier = 'paris'",
    )
    assert last == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)


@pytest.mark.db
async def test_backfill_across_a_change_adds_the_live_schedules_jobs(
    db: str, pool: AsyncConnectionPool[Any]
) -> None:
    now = datetime(2026, 3, 29, 12, 0, 30, tzinfo=UTC)
    rows(
        db,
        "insert into graphile_worker._private_known_crontabs (identifier, known_since) "
        "values ('daily', %s), ('hourly', %s)",
        (now - timedelta(days=5), now - timedelta(days=5)),
    )
    crontab = "30 2 * * * d ?id=daily&fill=2d\n30 * * * * h ?id=hourly&fill=14h"
    items = parse_crontab(crontab)
    clock = FakeClock(now)
    task = start(
        CronScheduler(items, pool, "graphile_worker", clock=clock, default_zone="Europe/Paris")
    )
    try:
        await wait_for_jobs(db, 2 + 13)
        await settle(clock, task)
    finally:
        await stop(task)
    jobs = cron_jobs(db)
    for item in items:
        live = list(fire_instants(item, PARIS, now - item.backfill_period, now))
        assert [j["run_at"] for j in jobs if j["task"] == item.task] == live
    assert [j["payload"]["_cron"]["local"] for j in jobs if j["task"] == "d"] == [
        "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:00:00+02:00",
    ]
    hourly = [j["payload"]["_cron"]["local"][11:16] for j in jobs if j["task"] == "h"]
    assert hourly[:4] == ["23:30", "00:30", "01:30", "03:30"]  # no 02:30 that night
    assert all(j["payload"]["_cron"]["backfilled"] for j in jobs)


@pytest.mark.db
@pytest.mark.parametrize(
    "crontab,message",
    [
        (
            "* * * * * t\n30 2 * * * t ?id=x&tz=Europe/Pariss\n",
            "crontab line 2: unknown time zone 'Europe/Pariss'",
        ),
        ("30 2 * * * t ?tz=Europe/Paris\n", "crontab line 1: tz=Europe/Paris needs an explicit id"),
    ],
)
def test_cli_zone_errors_are_one_line(db: str, tmp_path: Path, crontab: str, message: str) -> None:
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "t.py").write_text("async def task(p, h): pass\n")
    (tmp_path / "crontab").write_text(crontab)
    result = run_cli("-c", db, cwd=tmp_path)
    assert result.returncode == 1
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    bad_default = run_cli("-c", db, "--cron-timezone", "Mars/Olympus", cwd=tmp_path)
    assert bad_default.returncode == 2 and "unknown time zone 'Mars/Olympus'" in bad_default.stderr
    assert "Traceback" not in bad_default.stderr


@pytest.mark.unit
def test_the_readmes_cron_zone_examples_run_as_written(tmp_path: Path) -> None:
    [crontab] = blocks(HEADING, "crontab")
    assert [item.tz and item.tz.key for item in parse_crontab(crontab)] == [
        "Europe/Paris",
        "America/New_York",
    ]
    files = write_files(HEADING, tmp_path)
    assert set(files) == {"cron_instants.py"}
    [transcript] = blocks(HEADING, "text")
    command, *expected = transcript.strip().splitlines()
    assert command == "$ python cron_instants.py"
    ran = subprocess.run(
        [sys.executable, "cron_instants.py"], cwd=tmp_path, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert ran.stdout.splitlines() == expected, ran.stderr
