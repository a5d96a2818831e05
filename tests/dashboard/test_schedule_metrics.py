"""graphile_worker_schedule_last_run_timestamp_seconds{schedule} and
graphile_worker_schedule_lag_seconds{schedule}, scraped over HTTP: one
sample per schedule in the database that has fired (when its job was added,
and how long after its instant), none for one that never fired; read with
the queue depth, and a failed read of the schedules leaves the depth whole.
(Beside the dashboard's tests: the Crontab page shows the same figures.)"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from dbhelpers import rows
from metrics_scrape import Samples, scrape_async, served
from workers import worker

from worker_cli import Helpers, WorkerUtils
from worker_cli.sql import schedule_metrics as schedule_metrics_sql

pytestmark = pytest.mark.db

SCHEDULES = "graphile_worker._private_py_schedules"
LAST_RUN = "graphile_worker_schedule_last_run_timestamp_seconds"
LAG = "graphile_worker_schedule_lag_seconds"


async def ok(payload: Any, helpers: Helpers) -> None:
    pass


def by_schedule(samples: Samples, name: str) -> dict[str, float]:
    return {
        dict(labels)["schedule"]: figure
        for (metric, labels), figure in samples.items()
        if metric == name
    }


async def scrape(db: str) -> Samples:
    async with served() as server, worker(db, {"other": ok}, metrics_registry=server.registry):
        return await scrape_async(server.url)


async def test_each_schedule_that_fired_has_its_last_run_and_lag(
    db: str, utils: WorkerUtils
) -> None:
    # On 1 January only: no worker of the test fires them.
    await utils.add_schedule("new_year", "0 0 1 1 *", "celebrate")
    await utils.add_schedule("late_one", "5 0 1 1 *", "celebrate", paused=True)
    await utils.add_schedule("never_ran", "10 0 1 1 *", "celebrate")
    rows(
        db,
        f"update {SCHEDULES} set last_execution = timestamptz '2026-01-01 00:00:00+00', "
        "last_run_at = timestamptz '2026-01-01 00:00:02.25+00' where identifier = 'new_year'",
    )
    rows(
        db,
        f"update {SCHEDULES} set last_execution = timestamptz '2025-01-01 00:05:00+00', "
        "last_run_at = timestamptz '2025-01-02 00:05:00+00' where identifier = 'late_one'",
    )
    samples = await scrape(db)
    assert by_schedule(samples, LAST_RUN) == {
        "new_year": 1767225602.25,  # 2026-01-01T00:00:02.25Z
        "late_one": 1735776300.0,  # 2025-01-02T00:05:00Z (a paused one too)
    }
    assert by_schedule(samples, LAG) == {"new_year": 2.25, "late_one": 86400.0}


async def test_no_schedule_no_series_and_a_failed_read_leaves_the_depth(
    db: str,
    utils: WorkerUtils,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    samples = await scrape(db)
    assert by_schedule(samples, LAST_RUN) == {} and by_schedule(samples, LAG) == {}
    assert any(name == "graphile_worker_queue_depth" for name, _ in samples)

    await utils.add_schedule("new_year", "0 0 1 1 *", "celebrate")
    rows(db, f"update {SCHEDULES} set last_execution = now(), last_run_at = now()")
    assert set(by_schedule(await scrape(db), LAST_RUN)) == {"new_year"}
    # The database refuses the statement (a table it does not have).
    broken = schedule_metrics_sql.SCHEDULE_RUNS.replace("_private_py_schedules", "no_such_table")
    monkeypatch.setattr(schedule_metrics_sql, "SCHEDULE_RUNS", broken)
    with caplog.at_level(logging.WARNING, "graphile_worker.metrics"):
        samples = await scrape(db)
    assert by_schedule(samples, LAST_RUN) == {}
    assert any(name == "graphile_worker_queue_depth" for name, _ in samples)
    assert "Could not read the schedules for the metrics" in caplog.text
