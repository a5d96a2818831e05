"""The cron scheduler against real PostgreSQL, with a clock the test controls."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cron_helpers import FakeClock, cron_jobs, pool, settle, start, stop, wait_for_jobs
from dbhelpers import cli_path, rows, run_cli, value
from node_worker import NodeWorker
from psycopg_pool import AsyncConnectionPool

from worker_cli import parse_crontab
from worker_cli.worker.background.cron_scheduler import CronScheduler

__all__ = ["pool"]  # the fixture (tests/support/cron_helpers.py)

pytestmark = pytest.mark.db


ROOT = Path(__file__).resolve().parents[2]
START = datetime(2026, 3, 10, 12, 0, 30, tzinfo=UTC)


async def test_one_job_per_tick_with_payload_and_options(
    db: str, pool: AsyncConnectionPool[Any]
) -> None:
    items = parse_crontab("* * * * * tick ?queue=ticks&max=3&priority=2 {source: 'cron'}")
    clock = FakeClock(START)
    task = start(CronScheduler(items, pool, "graphile_worker", clock=clock))
    try:
        await settle(clock, task)
        assert cron_jobs(db) == []  # 12:00 is before the start: not scheduled
        for minute in range(1, 4):
            await clock.advance(timedelta(minutes=1))
            await wait_for_jobs(db, minute)
            await settle(clock, task)
    finally:
        await stop(task)
    jobs = cron_jobs(db)
    assert [j["run_at"] for j in jobs] == [
        START.replace(second=0) + timedelta(minutes=m) for m in (1, 2, 3)
    ]
    assert jobs[0]["payload"] == {
        "source": "cron",
        "_cron": {"ts": "2026-03-10T12:01:00.000Z", "backfilled": False},
    }
    assert {(j["task"], j["queue_name"], j["max_attempts"], j["priority"]) for j in jobs} == {
        ("tick", "ticks", 3, 2)
    }


async def test_an_item_at_the_crontabs_limits_is_registered_and_scheduled(
    db: str, pool: AsyncConnectionPool[Any]
) -> None:
    """The crontab refuses longer identifiers, task names, queue names and job
    keys at parse time (issue 23: a 10 MB identifier was retried for ever);
    the longest it accepts go through."""
    task_name, identifier, queue = "t" * 128, "i" * 128, "q" * 128
    items = parse_crontab(
        f"* * * * * {task_name} ?id={identifier}&queue={queue}&jobKey={'k' * 512}&fill=366d"
    )
    clock = FakeClock(START)
    task = start(CronScheduler(items, pool, "graphile_worker", clock=clock))
    try:
        await settle(clock, task)
        await clock.advance(timedelta(minutes=1))
        await wait_for_jobs(db, 1)
        await settle(clock, task)
    finally:
        await stop(task)
    [job] = cron_jobs(db)
    assert (job["task"], job["queue_name"]) == (task_name, queue)
    known = "select identifier from graphile_worker._private_known_crontabs"
    assert value(db, known) == identifier


async def test_three_pools_with_one_crontab_add_one_job_per_tick(db: str) -> None:
    items = parse_crontab("* * * * * tick\n*/2 * * * * even ?id=even_minutes")
    clock = FakeClock(START)
    pools = [
        AsyncConnectionPool(db, min_size=1, max_size=2, kwargs={"autocommit": True}, open=False)
        for _ in range(3)
    ]
    for p in pools:
        await p.open(wait=True)
    tasks = [start(CronScheduler(items, p, "graphile_worker", clock=clock)) for p in pools]
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
    assert sorted((j["run_at"].minute, j["task"]) for j in jobs) == [
        (1, "tick"),
        (2, "even"),
        (2, "tick"),
        (3, "tick"),
        (4, "even"),
        (4, "tick"),
    ]


async def test_backfill_known_items_oldest_first_but_not_new_ones(
    db: str, pool: AsyncConnectionPool[Any]
) -> None:
    rows(
        db,
        "insert into graphile_worker._private_known_crontabs (identifier, known_since) "
        "values ('known', %s)",
        (START - timedelta(hours=5),),
    )
    items = parse_crontab("*/10 * * * * known ?fill=1h\n*/10 * * * * brand_new ?fill=1h")
    clock = FakeClock(START)
    task = start(CronScheduler(items, pool, "graphile_worker", clock=clock))
    try:
        await wait_for_jobs(db, 6)
        await settle(clock, task)
    finally:
        await stop(task)
    jobs = cron_jobs(db)
    assert [(j["task"], j["run_at"].strftime("%H:%M")) for j in jobs] == [
        ("known", t) for t in ("11:10", "11:20", "11:30", "11:40", "11:50", "12:00")
    ]
    assert [j["id"] for j in jobs] == sorted(j["id"] for j in jobs)  # added oldest first
    assert all(j["payload"]["_cron"]["backfilled"] is True for j in jobs)
    assert (
        value(
            db,
            "select known_since from graphile_worker._private_known_crontabs "
            "where identifier = 'brand_new'",
        )
        == START
    )


async def test_backfill_stops_at_the_last_execution(
    db: str, pool: AsyncConnectionPool[Any]
) -> None:
    rows(
        db,
        "insert into graphile_worker._private_known_crontabs "
        "(identifier, known_since, last_execution) "
        "values ('t', %s, %s)",
        (START - timedelta(days=1), START - timedelta(minutes=3, seconds=30)),
    )
    items = parse_crontab("* * * * * t ?fill=10m")
    clock = FakeClock(START)
    task = start(CronScheduler(items, pool, "graphile_worker", clock=clock))
    try:
        await wait_for_jobs(db, 3)
        await settle(clock, task)
    finally:
        await stop(task)
    assert [j["run_at"].strftime("%H:%M") for j in cron_jobs(db)] == ["11:58", "11:59", "12:00"]


async def test_a_restart_does_not_schedule_a_tick_again(
    db: str, pool: AsyncConnectionPool[Any]
) -> None:
    items = parse_crontab("* * * * * t ?fill=10m")
    clock = FakeClock(START)
    task = start(CronScheduler(items, pool, "graphile_worker", clock=clock))
    await settle(clock, task)
    await clock.advance(timedelta(minutes=2))
    await wait_for_jobs(db, 2)
    await settle(clock, task)
    await stop(task)
    # Restart in the same minute as the last tick, with backfill on.
    clock = FakeClock(clock.now())
    task = start(CronScheduler(items, pool, "graphile_worker", clock=clock))
    await settle(clock, task)
    await stop(task)
    assert [j["run_at"].strftime("%H:%M") for j in cron_jobs(db)] == ["12:01", "12:02"]


async def test_early_timer_waits_and_late_timer_catches_up_once(
    db: str, pool: AsyncConnectionPool[Any]
) -> None:
    items = parse_crontab("* * * * * t")
    clock = FakeClock(START)
    clock.early = 3  # the next sleeps return too soon (clock skew)
    task = start(CronScheduler(items, pool, "graphile_worker", clock=clock))
    try:
        await settle(clock, task)
        assert cron_jobs(db) == []
        await clock.advance(timedelta(minutes=4, seconds=10))  # paused for 4 minutes
        await wait_for_jobs(db, 4)
        await settle(clock, task)
        await clock.advance(timedelta(minutes=1))
        await wait_for_jobs(db, 5)
        await settle(clock, task)
    finally:
        await stop(task)
    jobs = cron_jobs(db)
    assert [j["run_at"].strftime("%H:%M") for j in jobs] == [
        "12:01",
        "12:02",
        "12:03",
        "12:04",
        "12:05",
    ]
    assert not any(j["payload"]["_cron"]["backfilled"] for j in jobs)


def _start(args: list[str], cwd: Path, log: Path) -> subprocess.Popen[str]:
    """Start ``args``; its output goes to ``log``, which the test can read while it runs."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL" and not k.startswith("PG")}
    with log.open("w") as out:
        return subprocess.Popen(
            args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True
        )


def _live_ticks(db: str) -> list[str]:
    return [
        r["ts"]
        for r in rows(
            db,
            "select payload->'_cron'->>'ts' as ts from graphile_worker._private_jobs "
            "where payload->'_cron'->>'backfilled' = 'false' order by run_at",
        )
    ]


@pytest.mark.node
@pytest.mark.slow
def test_node_and_python_with_one_crontab_and_the_example(
    pg: Any, db: str, tmp_path: Path, node: NodeWorker
) -> None:
    """Real time: Node 0.18 and our worker share a crontab (backfill and a live tick)
    and, beside them, `--crontab crontab.example --tasks tasks_example` runs its
    every-minute item once a minute."""
    crontab = "* * * * * cron_task ?id=shared_item&fill=20m {from: 'crontab'}\n"
    for side, task_file in (("py", "other.py"), ("node", "other.cjs")):
        (tmp_path / side / "tasks").mkdir(parents=True)
        (tmp_path / side / "crontab").write_text(crontab)
        body = (
            "async def task(p, h): pass\n" if side == "py" else "module.exports = async () => {};\n"
        )
        (tmp_path / side / "tasks" / task_file).write_text(body)
    rows(
        db,
        "insert into graphile_worker._private_known_crontabs (identifier, known_since) "
        "values ('shared_item', now() - interval '30 minutes')",
    )
    logs = [tmp_path / f"{name}.log" for name in ("py", "node", "example")]
    with pg.database() as example_db:
        # No live tick can be before the first minute that starts after this.
        first_possible = datetime.now(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
        procs = [
            _start([cli_path(), "-c", db], tmp_path / "py", logs[0]),
            _start(node.argv("-c", db), tmp_path / "node", logs[1]),
            _start(
                [
                    cli_path(),
                    "-c",
                    example_db,
                    "--crontab",
                    str(ROOT / "crontab.example"),
                    "--tasks",
                    str(ROOT / "tasks_example"),
                ],
                tmp_path,
                logs[2],
            ),
        ]
        try:
            # Until a live tick (not a backfilled one) of the shared item has been
            # scheduled, and the example has run its every-minute item (the first
            # minute after start-up: up to two minutes away).
            deadline = time.monotonic() + 180
            while not (_live_ticks(db) and "Hello, cron!" in logs[2].read_text()):
                exited = [p.args for p in procs if p.poll() is not None]
                assert not exited, f"exited early: {exited}; {[f.read_text() for f in logs]}"
                assert time.monotonic() < deadline, [f.read_text() for f in logs]
                time.sleep(0.1)
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGINT)
            codes = [proc.wait(timeout=30) for proc in procs]
        outputs = [f.read_text() for f in logs]
        assert codes[0] == 0 and codes[2] == 0, (codes, outputs)
        stamps = [
            r["ts"]
            for r in rows(
                db,
                "select payload->'_cron'->>'ts' as ts "
                "from graphile_worker._private_jobs order by run_at",
            )
        ]
        assert len(stamps) == len(set(stamps)), "a tick was scheduled twice"
        assert len(stamps) >= 21  # 20 backfilled minutes, and the live tick(s)
        assert min(_live_ticks(db)) >= first_possible.strftime("%Y-%m-%dT%H:%M:00.000Z")
        # The example: its every-minute item ran exactly once for each tick it scheduled
        # (one, unless a further minute began before it stopped).
        ticks = value(  # from the first minute after it started to the last one it scheduled
            example_db,
            "select 1 + extract(epoch from last_execution - date_trunc('minute', "
            "known_since + interval '1 minute' - interval '1 microsecond')) / 60 "
            "from graphile_worker._private_known_crontabs "
            "where identifier = 'hello_every_minute'",
        )
        not_run = value(
            example_db,
            "select count(*) from graphile_worker._private_jobs where payload->>'name' = 'cron'",
        )
        assert ticks >= 1, ticks
        assert outputs[2].count("Hello, cron!") == ticks - not_run, outputs[2]


@pytest.mark.parametrize(
    "crontab,message",
    [
        ("* * * * * ok\n\n61 * * * * bad\n", "crontab line 3: minute value 61"),
        ("* * * * * t {broken\n", "crontab line 1: the payload '{broken' is not valid JSON5"),
    ],
)
def test_cli_bad_crontab_stops_start_up(
    db: str, tmp_path: Path, crontab: str, message: str
) -> None:
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "t.py").write_text("async def task(p, h): pass\n")
    (tmp_path / "crontab").write_text(crontab)
    result = run_cli("-c", db, cwd=tmp_path)
    assert result.returncode == 1
    assert message in result.stderr and "crontab" in result.stderr
    assert "Traceback" not in result.stderr
    missing = run_cli("-c", db, "--crontab", "nope.txt", cwd=tmp_path)
    assert missing.returncode == 1 and "cannot read crontab 'nope.txt'" in missing.stderr
