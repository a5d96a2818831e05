"""A schedule added to the database while three worker processes run: they
see it within seconds (the notification), without a restart, and add its job
once for its instant across them (the real clock: one minute boundary; the
minutes after it, with three schedulers on a clock the test moves, are
tests/db/test_schedules.py's)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from dbhelpers import cli_path, rows, value
from worker_fleet import create_runs, make_tasks, start, stop, wait_until_listening

from worker_cli import make_sync_worker_utils

pytestmark = [pytest.mark.db, pytest.mark.slow]


def test_a_schedule_added_while_three_workers_run_fires_once_for_its_instant(
    db: str, tmp_path: Path
) -> None:
    create_runs(db)
    folder = make_tasks(tmp_path, ["tick"])
    workers = [start([cli_path(), "-c", db, "-j", "2"], folder) for _ in range(3)]
    try:
        wait_until_listening(db, 3)
        with make_sync_worker_utils(connection_string=db) as utils:
            added = utils.add_schedule("every-minute", "* * * * *", "tick", {"n": 1})
        # The next minute, unless it starts within 3 seconds of the add (the
        # workers may not have read it by then): then the one after.
        instant = (added.created_at + timedelta(seconds=63)).replace(second=0, microsecond=0)
        deadline = time.monotonic() + 150
        while value(db, "select count(*) from public.runs") < 1:
            assert time.monotonic() < deadline, "no job within 150 s"
            time.sleep(0.2)
        # A second job for that instant would come within moments of the first.
        fired = datetime.fromisoformat(
            value(db, "select payload -> '_cron' ->> 'ts' from public.runs")
        )
        while datetime.now(UTC) < fired + timedelta(seconds=3):
            time.sleep(0.2)
    finally:
        outcomes = stop(workers)
    assert [code for code, _ in outcomes] == [0, 0, 0], outcomes
    runs = rows(db, "select job_id, payload from public.runs order by job_id")
    # Once, at the minute after the add (or the next: see above), never twice.
    assert len(runs) == 1, runs
    assert fired <= instant, (fired, instant)
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0
