"""The session sign's rules, in one process: a pool is declared dead when the
advisory lock its row names has been missing for its grace, on the server run
it was taken on; never while a session holds it, nor for a sign of an earlier
run of the server (a restart, a failover). Real processes killed, stopped and
cut off: tests/system/test_killed_workers.py."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
import pytest
from dbhelpers import rows, value
from fault_helpers import wait_until

from worker_cli import Helpers, run
from worker_cli.db.connections import WorkerConnections
from worker_cli.worker.background.heartbeat import Heartbeat
from worker_cli.worker.background.session_sign import SIGN_CLASS, SessionSign

pytestmark = pytest.mark.db

HEARTBEATS = "graphile_worker._private_py_heartbeats"


def add_other_pool(db: str, pool: str, key: int, server_start: str = "now") -> int:
    """A row of another pool with its sign ``key``, a grace of 0.5 s and a
    timeout of 5 minutes, holding a job (its id). ``server_start``: "now" for
    this server run's start, else a timestamp."""
    started = (
        "pg_postmaster_start_time()" if server_start == "now" else f"'{server_start}'::timestamptz"
    )
    rows(
        db,
        f"insert into {HEARTBEATS} (pool_id, timeout, sign_key, sign_server_start, sign_grace) "
        f"values (%s, interval '5 minutes', %s, {started}, interval '0.5 seconds')",
        (pool, key),
    )
    job_id = int(value(db, "select id from graphile_worker.add_job('t')"))
    rows(
        db,
        "update graphile_worker._private_jobs set locked_by = %s, locked_at = now(), "
        "attempts = 1 where id = %s",
        (pool, job_id),
    )
    return job_id


def locked_by(db: str, job_id: int) -> str | None:
    return value(db, "select locked_by from graphile_worker._private_jobs where id = %s", (job_id,))


async def test_a_pool_is_declared_dead_once_its_sign_is_gone_for_its_grace(
    db: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "graphile_worker")
    # Its session: a connection of the test holding the pool's lock.
    session = psycopg.connect(db, autocommit=True)
    session.execute("select pg_advisory_lock(%s, %s)", (SIGN_CLASS, 4401))
    job_id = add_other_pool(db, "pool-held", 4401)
    ran = asyncio.Event()
    errors: list[str | None] = []

    async def t(payload: Any, helpers: Helpers) -> None:
        errors.append(helpers.job.last_error)
        ran.set()

    runner = await run(
        db, task_list={"t": t}, no_handle_signals=True, heartbeat_interval=0.2,
        heartbeat_timeout=10,
    )  # fmt: skip
    try:
        # Held: looked at for 2 s (10 ticks, 4 graces), the pool lives on.
        await asyncio.sleep(2)
        assert locked_by(db, job_id) == "pool-held"
        assert (
            value(db, f"select sign_missing_since from {HEARTBEATS} where pool_id = 'pool-held'")
            is None
        )
        session.close()  # its process dies
        gone = asyncio.get_running_loop().time()
        await asyncio.wait_for(ran.wait(), 10)
        released_in = asyncio.get_running_loop().time() - gone
    finally:
        await runner.stop()
    # Found missing within a tick (0.1 s: half the grace), judged after the grace.
    assert 0.5 <= released_in < 2.0, released_in
    assert errors[0] is not None and errors[0].startswith(
        "the worker pool pool-held running this job was declared dead: its database session "
        "ended (gone since "
    ), errors
    assert rows(db, f"select 1 from {HEARTBEATS} where pool_id = 'pool-held'") == []
    assert "declared worker pool pool-held dead (its database session ended; gone for" in (
        caplog.text
    )


async def test_a_sign_taken_on_an_earlier_server_run_does_not_count(db: str) -> None:
    # As after a restart or a failover: the lock is gone, the row still names it.
    job_id = add_other_pool(db, "pool-before", 4402, server_start="2000-01-01 00:00:00+00")

    async def t(payload: Any, helpers: Helpers) -> None:
        pass

    runner = await run(
        db, task_list={"t": t}, no_handle_signals=True, heartbeat_interval=0.2,
        heartbeat_timeout=10,
    )  # fmt: skip
    try:
        await asyncio.sleep(2)  # 4 graces
    finally:
        await runner.stop()
    assert locked_by(db, job_id) == "pool-before"
    assert value(db, f"select count(*) from {HEARTBEATS} where pool_id = 'pool-before'") == 1


async def test_each_pool_holds_its_own_sign_while_it_runs(db: str) -> None:
    async def t(payload: Any, helpers: Helpers) -> None:
        pass

    runners = [
        await run(db, task_list={"t": t}, no_handle_signals=True, heartbeat_interval=0.2)
        for _ in range(2)
    ]
    held = (
        f"select h.pool_id, h.sign_grace, l.pid = a.pid as by_heartbeat from {HEARTBEATS} h "
        "join pg_locks l on l.locktype = 'advisory' and l.classid = %s::int::oid "
        "and l.objid = h.sign_key::oid and l.objsubid = 2 and l.granted "
        "join pg_stat_activity a on a.pid = l.pid and a.application_name like '%% heartbeat'"
    )
    try:
        signs = rows(db, held, (SIGN_CLASS,))
        assert sorted(s["pool_id"] for s in signs) == sorted(r.pool.id for r in runners)
        assert all(s["by_heartbeat"] and s["sign_grace"].total_seconds() == 5 for s in signs)
    finally:
        for runner in runners:
            await runner.stop()
    # A clean stop: the row is gone, then the session with its lock.
    assert value(db, f"select count(*) from {HEARTBEATS}") == 0
    wait_until(
        lambda: (
            value(
                db,
                "select count(*) from pg_locks where locktype = 'advisory' "
                "and classid = %s::int::oid and database = "
                "(select oid from pg_database where datname = current_database())",
                (SIGN_CLASS,),
            )
            == 0
        ),
        5,
        "the signs to go with their sessions",
    )


async def test_a_session_grace_of_0_takes_no_sign(db: str) -> None:
    async def t(payload: Any, helpers: Helpers) -> None:
        pass

    runner = await run(db, task_list={"t": t}, no_handle_signals=True, session_grace=0)
    try:
        [row] = rows(db, f"select sign_key, sign_grace from {HEARTBEATS}")
    finally:
        await runner.stop()
    assert row == {"sign_key": None, "sign_grace": None}


class _PoolerSign(SessionSign):
    """A sign as a pooler in transaction mode gives it: taken, but on a server
    connection other than the one the next statements run on (here: held by
    ``holder``, a connection of the test)."""

    def __init__(self, holder: psycopg.Connection[Any], key: int) -> None:
        super().__init__("pool-pooled", 1.0, enabled=True)
        self._holder, self._key = holder, key

    def take(self, conn: psycopg.Connection[Any]) -> None:
        self._holder.execute("select pg_advisory_lock(%s, %s)", (SIGN_CLASS, self._key))
        self.key = self._key


async def test_a_sign_not_held_by_its_own_session_is_dropped(
    db: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "graphile_worker")
    holder = psycopg.connect(db, autocommit=True)
    heartbeat = Heartbeat(
        WorkerConnections(db, "pool-pooled"),
        schema="graphile_worker",
        interval=0.2,
        timeout=10,
        on_released=lambda: None,
        sign=_PoolerSign(holder, 4403),
    )
    await heartbeat.start()
    try:
        assert value(db, f"select sign_key from {HEARTBEATS}") == 4403

        def dropped() -> bool:
            return value(db, f"select count(*) from {HEARTBEATS} where sign_key is null") == 1

        await asyncio.to_thread(wait_until, dropped, 5, "the sign to be dropped")
    finally:
        heartbeat.stop()
        await heartbeat.wait_stopped(5)
        holder.close()
    assert caplog.text.count("does not hold the pool's session sign") == 1, caplog.text
    assert "is the connection string a pooler's in transaction mode?" in caplog.text


class _CountedSweeps(Heartbeat):
    """A pool's heartbeat that counts its looks for dead pools."""

    sweeps = 0

    def _reap(self) -> int:
        self.sweeps += 1
        return super()._reap()


async def test_a_fleet_takes_turns_sweeping_and_still_finds_a_dead_pool(db: str) -> None:
    """Eight pools (a 0.2 s tick each) sweep about four times a tick between
    them, not eight; a pool whose session ends is still declared dead soon
    after its grace."""
    heartbeats = [
        _CountedSweeps(
            WorkerConnections(db, f"pool-{n}"),
            schema="graphile_worker",
            interval=0.2,
            timeout=10,
            on_released=lambda: None,
            sign=SessionSign(f"pool-{n}", 0.5, enabled=True),
        )
        for n in range(8)
    ]
    session = psycopg.connect(db, autocommit=True)
    try:
        for heartbeat in heartbeats:
            await heartbeat.start()
        await asyncio.sleep(1.0)  # each has seen the others
        before = sum(h.sweeps for h in heartbeats)
        await asyncio.sleep(2.0)  # 10 ticks
        swept = sum(h.sweeps for h in heartbeats) - before
        # 80 if each swept every tick; about 40 when they take turns.
        assert swept <= 60, swept

        session.execute("select pg_advisory_lock(%s, %s)", (SIGN_CLASS, 4404))
        job_id = add_other_pool(db, "pool-held", 4404)
        await asyncio.sleep(0.5)
        assert locked_by(db, job_id) == "pool-held"
        session.close()  # its process dies
        gone = asyncio.get_running_loop().time()

        def released() -> bool:
            return locked_by(db, job_id) is None

        await asyncio.to_thread(wait_until, released, 10, "the dead pool's job to be released")
        released_in = asyncio.get_running_loop().time() - gone
    finally:
        session.close()
        for heartbeat in heartbeats:
            heartbeat.stop()
        for heartbeat in heartbeats:
            await heartbeat.wait_stopped(5)
    # Found missing within a sweep of the fleet, judged after the grace (0.5 s).
    assert 0.5 <= released_in < 2.5, released_in
