"""A schedule added to the database while three worker processes run: they
see it within seconds (the notification), without a restart, and add its job
once per minute across them (the real clock: two minute boundaries)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from dbhelpers import cli_path, rows, value
from worker_fleet import create_runs, make_tasks, start, stop, wait_until_listening

from worker_cli import make_sync_worker_utils

pytestmark = [pytest.mark.db, pytest.mark.slow]


def test_a_schedule_added_while_three_workers_run_fires_once_per_minute(
    db: str, tmp_path: Path
) -> None:
    create_runs(db)
    folder = make_tasks(tmp_path, ["tick"])
    workers = [start([cli_path(), "-c", db, "-j", "2"], folder) for _ in range(3)]
    try:
        wait_until_listening(db, 3)
        # Added 5 to 10 seconds before a minute starts: within the poll's
        # period (10 s), so the workers must have been told.
        now = datetime.now(UTC)
        if not 48 <= now.second <= 52:
            time.sleep((48 - now.second) % 60 + 1 - now.microsecond / 1e6)
        with make_sync_worker_utils(connection_string=db) as utils:
            added = utils.add_schedule("every-minute", "* * * * *", "tick", {"n": 1})
        first = (added.created_at + timedelta(minutes=1)).replace(second=0, microsecond=0)
        second = first + timedelta(minutes=1)
        deadline = time.monotonic() + 150
        while value(db, "select count(*) from public.runs") < 2:
            assert time.monotonic() < deadline, rows(db, "select * from public.runs")
            time.sleep(0.2)
        # A second job for an instant would come within moments of the first.
        while datetime.now(UTC) < second + timedelta(seconds=3):
            time.sleep(0.2)
    finally:
        outcomes = stop(workers)
    assert [code for code, _ in outcomes] == [0, 0, 0], outcomes
    runs = rows(db, "select job_id, payload from public.runs order by job_id")
    assert [r["payload"]["_cron"]["ts"] for r in runs] == [
        f"{first:%Y-%m-%dT%H:%M}:00.000Z",
        f"{second:%Y-%m-%dT%H:%M}:00.000Z",
    ]
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0
