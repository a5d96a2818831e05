"""One set of connection settings for every connection a worker pool opens."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from dbhelpers import rows
from psycopg.conninfo import conninfo_to_dict

from worker_cli import Events, Helpers, run
from worker_cli.db.connections import WorkerConnections, connect


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
