"""One set of connection settings for every connection a worker pool opens."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from dbhelpers import rows
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row, tuple_row
from psycopg_pool import AsyncConnectionPool
from workers import until

from worker_cli import Events, Helpers, make_sync_worker_utils, make_worker_utils, run
from worker_cli.db.connections import WorkerConnections, connect
from worker_cli.sql import sessions as sessions_sql


@pytest.mark.unit
def test_every_role_gets_the_timeouts_and_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("PGCONNECT_TIMEOUT", "PGAPPNAME"):
        monkeypatch.delenv(variable, raising=False)
    connections = WorkerConnections("postgres://u@db.example/app", "pool-1")
    for role in ("pool", "fetch", "listen", "heartbeat"):
        params = conninfo_to_dict(connections.conninfo_for(role))
        assert params["application_name"] == f"graphile-worker pool-1 {role}"
        assert (params["connect_timeout"], params["tcp_user_timeout"]) == ("10", "60000")
        assert (params["keepalives_idle"], params["keepalives_count"]) == ("30", "3")
        assert (params["host"], params["dbname"]) == ("db.example", "app")


@pytest.mark.unit
def test_the_connection_string_and_the_environment_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGAPPNAME", raising=False)
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "3")
    connections = WorkerConnections(
        "postgres://u@db/app?application_name=mine&keepalives_idle=5", "pool-1"
    )
    params = conninfo_to_dict(connections.conninfo_for("fetch"))
    assert params["application_name"] == "mine"
    assert params["keepalives_idle"] == "5"
    assert "connect_timeout" not in params  # libpq reads PGCONNECT_TIMEOUT itself


@pytest.mark.unit
def test_no_prepared_statements_reaches_every_connection() -> None:
    assert WorkerConnections("", "p").kwargs() == {"autocommit": True}
    assert WorkerConnections("", "p", no_prepared_statements=True).kwargs() == {
        "autocommit": True,
        "prepare_threshold": None,
    }


@pytest.mark.db
@pytest.mark.parametrize("no_prepared_statements", [False, True])
async def test_a_dba_sees_each_connection_of_a_pool_by_name(
    db: str, no_prepared_statements: bool
) -> None:
    """pg_stat_activity names the pool and the role of each of its connections,
    and the listener works with prepared statements off too."""
    ran, listening = asyncio.Event(), asyncio.Event()

    async def t(payload: Any, helpers: Helpers) -> None:
        ran.set()

    events = Events()
    events.on("pool:listen:success", lambda _: listening.set())
    runner = await run(
        db,
        task_list={"t": t},
        events=events,
        no_handle_signals=True,
        no_prepared_statements=no_prepared_statements,
        poll_interval=3600,  # only a notification can start the job in time
    )
    try:
        await asyncio.wait_for(listening.wait(), 10)
        pool_id = runner.pool.id
        names = {
            row["application_name"]
            for row in rows(
                db,
                "select application_name from pg_stat_activity where application_name like %s",
                (f"graphile-worker {pool_id} %",),
            )
        }
        roles = {name.rsplit(" ", 1)[1] for name in names}
        assert roles == {"pool", "fetch", "listen", "heartbeat"}
        rows(db, "select graphile_worker.add_job('t')")
        await asyncio.wait_for(ran.wait(), 10)
    finally:
        await runner.stop()


@pytest.mark.db
async def test_a_connect_timeout_in_the_connection_string_wins(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """connect() (status, migrations, the fetcher's first connection) adds the
    worker's timeout only where the connection string sets none."""
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    separator = "&" if "?" in db else "?"
    conn = await connect(f"{db}{separator}connect_timeout=7")
    try:
        assert conninfo_to_dict(conn.info.dsn)["connect_timeout"] == "7"
    finally:
        await conn.close()
    conn = await connect(db)
    try:
        assert conninfo_to_dict(conn.info.dsn)["connect_timeout"] == "10"
    finally:
        await conn.close()


# --- Connections lent to code that is not the package's go back reset ------------
#
# helpers.query, helpers.with_pg_client and WorkerUtils.connection() /
# holding_connection() lend a pool connection to a task or an application;
# what it set there must not reach the next job, nor the worker's own
# statements on the same pool.

#: What a task may leave on its connection: settings, session
#: characteristics, a role, a temporary table.
LEAK = (
    "create temp table leaked (x int); "
    "set statement_timeout = '4321ms'; set search_path = pg_catalog; "
    "set session characteristics as transaction read only; "
    "set role pg_monitor"
)

#: What the next user reads.
STATE = (
    "select current_setting('statement_timeout') as statement_timeout, "
    "current_setting('search_path') as search_path, "
    "current_setting('default_transaction_read_only') as read_only, "
    "current_user::text as current_user, session_user::text as session_user, "
    "pg_catalog.to_regclass('pg_temp.leaked') is not null as temp_table"
)


def fresh_state(db: str) -> dict[str, Any]:
    """What a new session reads: what every lent connection must read again."""
    [row] = rows(db, STATE)
    return row


@pytest.mark.db
@pytest.mark.parametrize("lend", ["connection", "holding_connection"])
async def test_a_connection_lent_by_worker_utils_goes_back_to_the_pool_reset(
    db: str, lend: str
) -> None:
    async with make_worker_utils(connection_string=db, max_pool_size=1) as utils:
        async with getattr(utils, lend)() as conn:
            pid = conn.info.backend_pid
            await conn.execute(LEAK)
            await conn.execute("set session authorization pg_monitor")
            await conn.commit()
            await conn.set_autocommit(True)  # the utilities' pool: not autocommit
            conn.row_factory = dict_row
        async with utils.connection() as conn:
            assert conn.info.backend_pid == pid  # the pool's only connection
            assert not conn.autocommit and conn.row_factory is tuple_row
            cur = await conn.cursor(row_factory=dict_row).execute(STATE)
            assert await cur.fetchone() == fresh_state(db)
        # The utilities' own statements run as they should (not read-only).
        assert (await utils.add_job("t", {})).task_identifier == "t"


@pytest.mark.db
def test_a_connection_lent_by_sync_worker_utils_goes_back_to_the_pool_reset(db: str) -> None:
    with make_sync_worker_utils(connection_string=db, max_pool_size=1) as utils:
        with utils.holding_connection() as conn:
            pid = conn.info.backend_pid
            conn.execute(LEAK)
            conn.commit()
            conn.autocommit = True
        with utils.connection() as conn:
            assert conn.info.backend_pid == pid and not conn.autocommit
            assert conn.cursor(row_factory=dict_row).execute(STATE).fetchone() == fresh_state(db)
        assert utils.add_job("t", {}).task_identifier == "t"


@pytest.mark.db
@pytest.mark.parametrize("helper", ["query", "with_pg_client"])
async def test_what_a_task_sets_is_not_seen_by_the_next_job_nor_by_the_worker(
    db: str, helper: str
) -> None:
    """Every connection of the worker's pool (two) is dirtied by one job; the
    next job reads a fresh session's state, and the worker writes both
    jobs' outcomes (as pg_monitor or read-only, it could not)."""
    seen: list[dict[str, Any]] = []

    async def dirty(helpers: Helpers) -> None:
        if helper == "query":
            await helpers.query(LEAK + "; select pg_sleep(0.3)")
            return
        async with helpers.with_pg_client() as conn:
            await conn.execute(LEAK + "; select pg_sleep(0.3)")
            conn.row_factory = dict_row
            await conn.set_autocommit(False)

    async def setter(payload: Any, helpers: Helpers) -> None:
        # Two at once: each on a connection of its own, the pool's two.
        await asyncio.gather(dirty(helpers), dirty(helpers))

    async def checker(payload: Any, helpers: Helpers) -> None:
        seen.extend(await helpers.query(STATE))

    remaining = "select count(*) as n from graphile_worker._private_jobs"
    rows(db, "select graphile_worker.add_job('setter', priority => -1)")
    rows(db, "select graphile_worker.add_job('checker', run_at => now() + interval '1s')")
    runner = await run(
        db,
        task_list={"setter": setter, "checker": checker},
        no_handle_signals=True,
        concurrency=1,
        max_pool_size=2,
    )
    try:
        await until(lambda: not rows(db, remaining)[0]["n"], what="both jobs' outcomes")
    except BaseException:
        runner.force_stop()  # its outcomes may never be written: stop anyway
        raise
    finally:
        await runner.stop()
    assert seen == [fresh_state(db)]


@pytest.mark.db
async def test_a_connection_whose_reset_fails_is_closed_not_returned(
    db: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sessions_sql, "RESET_SESSION", b"select 1/0")  # the reset fails
    async with make_worker_utils(connection_string=db, max_pool_size=1) as utils:
        async with utils.connection() as conn:
            dirty = conn.info.backend_pid
            await conn.execute("set statement_timeout = '4321ms'")
        assert "could not be reset; it is closed" in caplog.text
        async with utils.connection() as conn:  # the pool opened another
            assert conn.info.backend_pid != dirty
            cur = await conn.execute("show statement_timeout")
            assert await cur.fetchone() != ("4321ms",)
    gone = "select count(*) as n from pg_stat_activity where pid = %s"
    await until(lambda: not rows(db, gone, (dirty,))[0]["n"], what="the dirty backend to end")


@pytest.mark.db
async def test_a_pool_or_connection_of_the_application_is_left_as_it_is(db: str) -> None:
    """The package resets only what it opened: the application's pool
    (pool=) and connection (connection=) keep what their users set."""
    async with AsyncConnectionPool(db, min_size=1, max_size=1, open=False) as pool:
        async with make_worker_utils(pool=pool) as utils, utils.connection() as conn:
            await conn.execute("set statement_timeout = '4321ms'")
        async with pool.connection() as conn:
            cur = await conn.execute("show statement_timeout")
            assert await cur.fetchone() == ("4321ms",)
            async with make_worker_utils(connection=conn) as utils, utils.connection() as given:
                await given.execute("set lock_timeout = '1234ms'")
            cur = await conn.execute("show lock_timeout")
            assert await cur.fetchone() == ("1234ms",)
