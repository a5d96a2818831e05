"""The migrator: fresh installs, upgrades, refusals and concurrent starts."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest
from catalog import differences, snapshot
from dbhelpers import cli_path, rows, run_cli, value
from pg_server import PgServer

from worker_cli import IncompatibleSchemaError, MigrationError, UnsupportedPostgresError
from worker_cli.schema.migrate import (
    BREAKING_REVISIONS,
    MigrationFiles,
    check_server_version,
    migrate,
)

EXPECTED_BREAKING = {1, 3, 11, 13, 14, 16, 19}


async def run_migrate(
    url: str, schema: str = "graphile_worker", files: MigrationFiles | None = None
):
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        return await migrate(conn, schema, files)


def migration_rows(url: str, schema: str = "graphile_worker") -> list[tuple[int, bool]]:
    ident = psycopg.sql.Identifier(schema, "migrations")
    with psycopg.connect(url) as conn:
        return [
            (r[0], r[1])
            for r in conn.execute(
                psycopg.sql.SQL("select id, breaking from {} order by id").format(ident)
            )
        ]


@pytest.mark.db
async def test_fresh_database_reaches_revision_20(empty_db: str) -> None:
    report = await run_migrate(empty_db)
    assert report.previous_revision is None
    assert report.applied == tuple(range(1, 21))
    assert report.revision == 20
    assert migration_rows(empty_db) == [(n, n in EXPECTED_BREAKING) for n in range(1, 21)]
    assert BREAKING_REVISIONS == EXPECTED_BREAKING

    again = await run_migrate(empty_db)
    assert again.applied == () and again.previous_revision == 20


@pytest.mark.db
async def test_every_revision_notifies_worker_migrate(empty_db: str) -> None:
    async with await psycopg.AsyncConnection.connect(empty_db, autocommit=True) as listener:
        await listener.execute('listen "worker:migrate"')
        await run_migrate(empty_db)
        payloads = [
            json.loads(notify.payload)
            async for notify in listener.notifies(timeout=2.0, stop_after=21)
        ]
    assert payloads == [
        {"migrationNumber": n, "breaking": n in EXPECTED_BREAKING} for n in range(1, 21)
    ]


@pytest.mark.db
async def test_schema_name_needing_quotes(empty_db: str) -> None:
    await run_migrate(empty_db, 'my "odd" schema')
    default_url = empty_db
    await run_migrate(default_url)
    assert not differences(snapshot(empty_db, 'my "odd" schema'), snapshot(empty_db))
    job = rows(empty_db, """select * from "my ""odd"" schema".add_job('hello', '{"a": 1}')""")
    assert job[0]["payload"] == {"a": 1}


def _downgrade_to(url: str, revision: int) -> None:
    """Turn our revision-20 schema back into what Node left at ``revision`` (16 or 17)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("delete from graphile_worker.migrations where id > %s", (revision,))
        # Revisions 16-17 sent "jobs:insert" from a statement trigger.
        conn.execute(
            """
            create function graphile_worker.tg_jobs__after_insert() returns trigger
            language plpgsql as $$ begin perform pg_notify('jobs:insert', ''); return new; end $$;
            create trigger _900_after_insert after insert on graphile_worker._private_jobs
            for each statement execute procedure graphile_worker.tg_jobs__after_insert();
            """
        )
        if revision < 17:
            conn.execute("drop view graphile_worker.jobs")


@pytest.mark.parametrize("revision", [16, 17])
@pytest.mark.db
async def test_upgrade_from_revision_16_and_17(db: str, revision: int) -> None:
    reference = snapshot(db)
    rows(db, "select graphile_worker.add_job('pending', '{\"n\": 1}', queue_name => 'q')")
    _downgrade_to(db, revision)

    report = await run_migrate(db)
    assert report.previous_revision == revision
    assert report.applied == tuple(range(revision + 1, 21))
    assert not differences(snapshot(db), reference)
    assert (
        value(db, "select count(*) from graphile_worker.jobs where task_identifier = 'pending'")
        == 1
    )


@pytest.mark.parametrize("version,revision", [("0.16.6", 18), ("0.17.3", 19), ("0.18.0", 20)])
@pytest.mark.db
@pytest.mark.node
async def test_upgrade_database_installed_by_node(
    pg: PgServer, node_factory, node, version: str, revision: int
) -> None:
    old_node = node_factory(version)
    with pg.database() as theirs, pg.database() as reference:
        result = old_node.run("-c", theirs, "--schema-only")
        assert result.returncode == 0, result.stderr
        assert value(theirs, "select max(id) from graphile_worker.migrations") == revision
        rows(
            theirs,
            """select graphile_worker.add_job('pending_' || n, json_build_object('n', n),
                   queue_name => case when n % 2 = 0 then 'even' end,
                   run_at => now() + interval '1 hour', job_key => 'key' || n)
               from generate_series(1, 50) as n""",
        )
        before = rows(theirs, "select * from graphile_worker.jobs order by id")

        report = await run_migrate(theirs)
        assert report.previous_revision == revision
        assert report.applied == tuple(range(revision + 1, 21))
        assert rows(theirs, "select * from graphile_worker.jobs order by id") == before
        assert [
            r["payload"]
            for r in rows(theirs, "select payload from graphile_worker._private_jobs order by id")
        ] == [{"n": n} for n in range(1, 51)]
        # Same structure as a database that Node 0.18 installed from nothing.
        assert node.run("-c", reference, "--schema-only").returncode == 0
        assert not differences(snapshot(theirs), snapshot(reference))


@pytest.mark.db
async def test_older_revision_is_refused_with_upgrade_advice(db: str) -> None:
    rows(db, "delete from graphile_worker.migrations where id > 15")
    with pytest.raises(MigrationError) as info:
        await run_migrate(db)
    assert "revision 15" in str(info.value)
    assert "graphile-worker (Node) 0.16 or newer" in str(info.value)

    result = run_cli("-c", db, "--schema-only")
    assert result.returncode == 1
    assert "0.16 or newer" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.db
async def test_unknown_breaking_revision_exits_57(db: str) -> None:
    rows(db, "insert into graphile_worker.migrations (id, breaking) values (21, true)")
    with pytest.raises(IncompatibleSchemaError) as info:
        await run_migrate(db)
    assert "revision 21" in str(info.value) and "revision 20" in str(info.value)

    result = run_cli("-c", db, "--schema-only")
    assert result.returncode == 57
    assert "revision 21" in result.stderr and "revision 20" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.db
async def test_unknown_safe_revision_warns_and_continues(db: str) -> None:
    rows(db, "insert into graphile_worker.migrations (id, breaking) values (21, false)")
    result = run_cli("-c", db, "--schema-only")
    assert result.returncode == 0, result.stderr
    assert "revision 21" in result.stderr and "WARNING" in result.stderr
    assert [r for r, _ in migration_rows(db)] == list(range(1, 22))


@pytest.mark.unit
def test_postgres_older_than_12_is_refused() -> None:
    with pytest.raises(UnsupportedPostgresError, match=r"PostgreSQL 12 or newer.*version 11\.5"):
        check_server_version(110005)
    check_server_version(120000)


@pytest.mark.parametrize("processes", [2, 3, 10])
@pytest.mark.db
def test_concurrent_migrators_all_succeed(empty_db: str, processes: int) -> None:
    command = [cli_path(), "-c", empty_db, "--schema-only"]
    procs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(processes)
    ]
    outcomes = [(p.wait(timeout=60), p.stderr.read() if p.stderr else "") for p in procs]
    assert [code for code, _ in outcomes] == [0] * processes, outcomes
    assert migration_rows(empty_db) == [(n, n in EXPECTED_BREAKING) for n in range(1, 21)]
    assert (
        value(
            empty_db,
            "select count(*) from pg_proc where pronamespace = 'graphile_worker'::regnamespace "
            "and proname not like 'py\\_%'",
        )
        == 7
    )


@pytest.mark.db
@pytest.mark.node
async def test_concurrent_with_node_migrator(empty_db: str, node) -> None:
    async def node_migrate() -> int:
        proc = await asyncio.create_subprocess_exec(
            *node.argv("-c", empty_db, "--schema-only"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        await proc.communicate()
        return proc.returncode or 0

    results = await asyncio.gather(node_migrate(), run_migrate(empty_db), run_migrate(empty_db))
    assert results[0] == 0
    assert migration_rows(empty_db) == [(n, n in EXPECTED_BREAKING) for n in range(1, 21)]


@pytest.mark.db
@pytest.mark.node
async def test_python_only_migrations_have_their_own_record(db: str, tmp_path: Path, node) -> None:
    files_dir = tmp_path / "migrations"
    shutil.copytree(MigrationFiles().directory, files_dir)
    (files_dir / "py").mkdir(exist_ok=True)
    # A number below one already applied still applies (branches add them in any order).
    (files_dir / "py" / "000000.sql").write_text(
        "create table {{schema}}._private_py_example (id int primary key);\n"
    )
    report = await run_migrate(db, files=MigrationFiles(files_dir))
    assert report.applied == () and report.applied_py == (0,)
    recorded = value(
        db, "select array_agg(id order by id) from graphile_worker._private_py_migrations"
    )
    assert recorded == [0, *MigrationFiles().py_revisions()]
    assert value(db, "select count(*) from graphile_worker._private_py_example") == 0
    assert value(db, "select max(id) from graphile_worker.migrations") == 20
    assert (await run_migrate(db, files=MigrationFiles(files_dir))).applied_py == ()

    # Node does not notice: no migration, no warning.
    result = node.run("-c", db, "--schema-only")
    assert result.returncode == 0
    assert "warn" not in (result.stdout + result.stderr).lower()
