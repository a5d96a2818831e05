"""Schedules in the database (``add_schedule``; migrations/py/000027.sql),
against real PostgreSQL with a clock the test controls: fired by the cron
scheduler at the crontab's instants (time zones included), once per instant
however many workers, never in an old version, paused or removed;
backfilled from where they last fired, never before they were added or
resumed; bad input refused with one line naming the field, nothing written;
a crontab item of a schedule's identifier refused at start-up."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cron_helpers import FakeClock, cron_jobs, pool, settle, start, stop, wait_for_jobs
from dbhelpers import rows, run_cli, value
from psycopg_pool import AsyncConnectionPool

from worker_cli import JobSpecError, WorkerUtils, make_sync_worker_utils, parse_crontab
from worker_cli.worker.background.cron_scheduler import CronScheduler
from worker_cli.worker.background.schedule_source import DatabaseSchedules

__all__ = ["pool"]  # the fixture (tests/support/cron_helpers.py)

pytestmark = pytest.mark.db

SCHEDULES = "graphile_worker._private_py_schedules"
# The clock of these tests starts after the database's now(): a schedule
# fires only at instants from its creation on.
START = (datetime.now(UTC) + timedelta(hours=2)).replace(minute=0, second=30, microsecond=0)


def scheduler(pool: AsyncConnectionPool[Any], clock: FakeClock, items: str = "") -> CronScheduler:
    return CronScheduler(
        parse_crontab(items),
        pool,
        "graphile_worker",
        clock=clock,
        schedules=DatabaseSchedules(pool, "graphile_worker", default_zone=None),
    )


async def test_a_schedule_fires_at_each_instant_with_its_options(
    db: str, utils: WorkerUtils, pool: AsyncConnectionPool[Any]
) -> None:
    added = await utils.add_schedule(
        "ticks",
        "*/2 * * * *",
        "tick",
        {"source": "db"},
        queue_name="ticks",
        priority=2,
        max_attempts=3,
    )
    assert (added.identifier, added.version, added.paused) == ("ticks", 1, False)
    clock = FakeClock(START)
    task = start(scheduler(pool, clock))
    try:
        await settle(clock, task)
        for _ in range(4):
            await clock.advance(timedelta(minutes=1))
            await settle(clock, task)
    finally:
        await stop(task)
    jobs = cron_jobs(db)
    base = START.replace(second=0)
    assert [j["run_at"] for j in jobs] == [base + timedelta(minutes=m) for m in (2, 4)]
    assert jobs[0]["payload"] == {
        "source": "db",
        "_cron": {
            "ts": f"{base + timedelta(minutes=2):%Y-%m-%dT%H:%M}:00.000Z",
            "backfilled": False,
        },
    }
    assert {(j["task"], j["queue_name"], j["max_attempts"], j["priority"]) for j in jobs} == {
        ("tick", "ticks", 3, 2)
    }
    (schedule,) = await utils.list_schedules()
    assert schedule.last_execution == base + timedelta(minutes=4)
    assert schedule.lag is not None


async def test_three_schedulers_add_one_job_per_instant(db: str, utils: WorkerUtils) -> None:
    await utils.add_schedule("every", "* * * * *", "tick")
    await utils.add_schedule("paris", "0 * * * *", "hourly", tz="Europe/Paris")
    clock = FakeClock(START - timedelta(minutes=2))
    pools = [
        AsyncConnectionPool(db, min_size=1, max_size=2, kwargs={"autocommit": True}, open=False)
        for _ in range(3)
    ]
    for p in pools:
        await p.open(wait=True)
    tasks = [start(scheduler(p, clock)) for p in pools]
    try:
        await settle(clock, *tasks)
        for _ in range(4):
            await clock.advance(timedelta(minutes=1))
            await settle(clock, *tasks)
    finally:
        await stop(*tasks)
        for p in pools:
            await p.close()
    jobs = cron_jobs(db)
    minutes = [j["run_at"] for j in jobs if j["task"] == "tick"]
    assert len(minutes) == len(set(minutes)) == 4
    (hourly,) = [j for j in jobs if j["task"] == "hourly"]
    assert hourly["run_at"] == START.replace(second=0)
    assert "local" in hourly["payload"]["_cron"]  # the wall time in Paris


async def test_a_change_never_fires_the_old_version_nor_a_paused_or_removed_one(
    db: str, utils: WorkerUtils, pool: AsyncConnectionPool[Any]
) -> None:
    await utils.add_schedule("every", "* * * * *", "tick")
    await utils.add_schedule("paused", "* * * * *", "paused_tick")
    await utils.add_schedule("removed", "* * * * *", "removed_tick")
    clock = FakeClock(START)
    source = DatabaseSchedules(pool, "graphile_worker", default_zone=None)
    cron = CronScheduler([], pool, "graphile_worker", clock=clock, schedules=source)
    task = start(cron)
    try:
        await settle(clock, task)
        # Changed behind the scheduler's back (no notification reaches it):
        # what it read is stale, and the database refuses to fire it.
        await utils.add_schedule("every", "0 0 1 1 *", "tick")
        await utils.pause_schedule("paused")
        assert await utils.remove_schedule("removed") is True
        await clock.advance(timedelta(minutes=1))
        await settle(clock, task)
        assert cron_jobs(db) == []
        # Read again (as when told): the new pattern is not due.
        await source.load()
        assert "paused" not in source.entries
        await clock.advance(timedelta(minutes=1))
        await settle(clock, task)
        assert cron_jobs(db) == []
        resumed = await utils.resume_schedule("paused")
        assert resumed is not None and not resumed.paused
        await source.load()
        await clock.advance(timedelta(minutes=1))
        await wait_for_jobs(db, 1)
        await settle(clock, task)
    finally:
        await stop(task)
    assert [j["task"] for j in cron_jobs(db)] == ["paused_tick"]
    assert await utils.remove_schedule("removed") is False
    assert await utils.pause_schedule("nothing") is None


async def test_backfill_from_the_last_run_never_before_the_schedule_existed(
    db: str, utils: WorkerUtils, pool: AsyncConnectionPool[Any]
) -> None:
    await utils.add_schedule("filled", "*/10 * * * *", "filled", fill="1h")
    await utils.add_schedule("new", "*/10 * * * *", "new", fill=3600)
    await utils.add_schedule("empty", "*/10 * * * *", "not_filled")
    # Two of them have existed for hours; "filled" last fired 40 minutes ago.
    rows(
        db,
        f"update {SCHEDULES} set known_since = %s where identifier in ('filled', 'empty')",
        (START - timedelta(hours=5),),
    )
    rows(
        db,
        f"update {SCHEDULES} set last_execution = %s where identifier = 'filled'",
        (START.replace(second=0) - timedelta(minutes=40),),
    )
    rows(db, f"update {SCHEDULES} set known_since = %s where identifier = 'new'", (START,))
    clock = FakeClock(START)
    task = start(scheduler(pool, clock))
    try:
        await wait_for_jobs(db, 4)
        await settle(clock, task)
    finally:
        await stop(task)
    jobs = cron_jobs(db)
    assert [(j["task"], j["run_at"].strftime("%M")) for j in jobs] == [
        ("filled", m) for m in ("30", "40", "50", "00")
    ]
    assert all(j["payload"]["_cron"]["backfilled"] is True for j in jobs)


async def test_bad_input_is_refused_naming_the_field_with_nothing_written(
    db: str, utils: WorkerUtils
) -> None:
    rows(
        db,
        "insert into graphile_worker._private_known_crontabs (identifier, known_since) "
        "values ('node_item', now())",
    )
    cases: list[tuple[dict[str, Any], str]] = [
        ({"pattern": "0 0 31 2 *"}, "pattern"),  # never fires
        ({"pattern": "61 * * * *"}, "pattern"),
        ({"pattern": "* * *"}, "pattern"),
        ({"tz": "Mars/Olympus"}, "tz"),
        ({"payload": {"blob": "x" * 10_000_000}}, "payload"),
        ({"payload": [1, 2]}, "payload"),
        ({"payload": {"n": float("nan")}}, "payload"),
        ({"identifier": "node_item"}, "identifier"),  # a crontab's (Node's or ours)
        ({"identifier": "bad id"}, "identifier"),
        ({"task_identifier": "no spaces"}, "task_identifier"),
        ({"fill": "2 days"}, "fill"),
        ({"fill": timedelta(days=400)}, "fill"),
        ({"priority": 40_000}, "priority"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"queue_name": "a queue"}, "queue_name"),
        ({"paused": "yes"}, "paused"),
        ({"job_key": "k\x00"}, "job_key"),
        ({"job_key": "k\udcff"}, "job_key"),
    ]
    for change, field in cases:
        args: dict[str, Any] = {
            "identifier": "s",
            "pattern": "* * * * *",
            "task_identifier": "t",
            **change,
        }
        with pytest.raises(JobSpecError) as raised:
            await utils.add_schedule(**args)
        assert raised.value.field == field, (change, str(raised.value))
        assert "\n" not in str(raised.value)
    assert value(db, f"select count(*) from {SCHEDULES}") == 0


def test_the_sync_utilities_manage_schedules(db: str) -> None:
    with make_sync_worker_utils(connection_string=db) as utils:
        first = utils.add_schedule("nightly", "0 3 * * *", "report", {"a": 1}, tz="Europe/Paris")
        replaced = utils.add_schedule("nightly", "30 3 * * *", "report")
        assert (first.version, replaced.version) == (1, 2)
        assert replaced.created_at == first.created_at and replaced.payload is None
        paused = utils.pause_schedule("nightly")
        assert paused is not None and paused.paused
        resumed = utils.resume_schedule("nightly")
        assert resumed is not None and resumed.known_since > first.known_since
        assert [s.identifier for s in utils.list_schedules()] == ["nightly"]
        assert utils.get_schedule("nightly") == resumed
        assert utils.remove_schedule("nightly") is True
        assert utils.list_schedules() == []


def test_a_crontab_item_with_a_schedules_identifier_stops_start_up(db: str, tmp_path: Path) -> None:
    rows(
        db,
        f"insert into {SCHEDULES} (identifier, pattern, task_identifier) "
        "values ('nightly', '0 3 * * *', 'report')",
    )
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "report.py").write_text("async def task(payload, helpers): pass\n")
    (tmp_path / "crontab").write_text("0 4 * * * report ?id=nightly\n")
    result = run_cli("-c", db, cwd=tmp_path, timeout=60)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines[-1].endswith(
        "crontab item(s) 'nightly': the identifier of a schedule in the database too; "
        "rename the crontab item, or remove the schedule (graphile-worker schedule remove ID)"
    ), result.stderr
    assert "Traceback" not in result.stderr


async def test_a_schedule_whose_payload_python_cannot_read_is_skipped_alone(
    db: str, utils: WorkerUtils, pool: AsyncConnectionPool[Any]
) -> None:
    # Written by SQL, past add_schedule's checks: JSON nested 5,000 deep, and
    # an integer of 5,000 digits (Python reads neither).
    await utils.add_schedule("good", "* * * * *", "tick")
    rows(
        db,
        f"insert into {SCHEDULES} (identifier, pattern, task_identifier, payload) values "
        "('deep', '* * * * *', 'tick', (repeat('[', 5000) || repeat(']', 5000))::json), "
        "('digits', '* * * * *', 'tick', ('{\"n\": ' || repeat('9', 5000) || '}')::json)",
    )
    clock = FakeClock(START)
    task = start(scheduler(pool, clock))
    try:
        await settle(clock, task)
        await clock.advance(timedelta(minutes=1))
        await wait_for_jobs(db, 1)
        await settle(clock, task)
    finally:
        await stop(task)
    assert [j["task"] for j in cron_jobs(db)] == ["tick"]
    assert value(
        db, f"select array_agg(identifier order by 1) from {SCHEDULES} where last_execution is null"
    ) == ["deep", "digits"]
    # Listed and read alone too, each saying what is wrong (the command line
    # and the dashboard's Crontab page list them through list_schedules).
    # (Python 3.13's JSON parser reads the 5,000-deep one; no Python reads
    # the 5,000 digits.)
    listed = {s.identifier: (s.payload, s.payload_error) for s in await utils.list_schedules()}
    assert set(listed) == {"deep", "digits", "good"}
    assert listed["digits"] == (None, "its payload cannot be read: ValueError")
    assert listed["good"] == (None, None)
    digits = await utils.get_schedule("digits")
    assert digits is not None and digits.as_dict()["payload_error"].endswith("ValueError")
    assert "payload_error" not in (await utils.get_schedule("good")).as_dict()  # type: ignore[union-attr]
