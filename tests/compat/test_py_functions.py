"""The Python-only functions (``py_*``): one definition each, in
``migrations/py/functions.sql``, applied with the last pending Python revision.

A database installed before that layout (issue 42) is built from a frozen copy
of the migration files as they were (``tests/fixtures/migrations_before_issue_42``)
by the steps the migrator took then, and upgraded by today's migrator: it must
end with the catalog of a fresh install, its rows kept.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
from catalog import differences, snapshot
from dbhelpers import rows, value
from migrations_before import LATEST_BEFORE, install_before

from worker_cli.schema.migrate import MigrationFiles, compose_script, migrate

SCHEMA = "graphile_worker"

#: The functions file's text (outside comments) with each latest Python
#: revision: a changed function needs a new revision (migrations/README.md),
#: so changing the file means adding a revision and its line here.
FUNCTIONS_AT_REVISION = {
    21: "406b006a015ba5dfe413a40a23e9d6c809dc9215d0835e3c67221e9ff104a983",
    22: "1e07128e3f4ed05ed5bb27110ea62693462af6ff797656478b91c1fbc3a5a67b",
    23: "d3c5a9474630c1642c2c97e25cf38db3fbcdfd4d3af82ff67762188a95617359",
    24: "d3c5a9474630c1642c2c97e25cf38db3fbcdfd4d3af82ff67762188a95617359",
    25: "d3c5a9474630c1642c2c97e25cf38db3fbcdfd4d3af82ff67762188a95617359",
    26: "09954ac1afbbf3e11177f57a25643bc911886c0661d7652bb46b74d626e2bf7d",
    27: "09954ac1afbbf3e11177f57a25643bc911886c0661d7652bb46b74d626e2bf7d",
    28: "e5bbb8c775ffc92de457e386496f92dfbf8a21518180adf0f6386e9de49640fa",
    29: "7f6167194e9437810dcd5ec68a0f707f6f30cb3951a6459e0137e77518303188",
}

_DEFINED = re.compile(r"^create or replace function \{\{schema\}\}\.(\w+)\(", re.M)
_CREATE_FUNCTION = re.compile(r"\bcreate\s+(or\s+replace\s+)?function\b", re.I)

_CATALOG_FUNCTIONS = """
    select p.proname, pg_get_function_identity_arguments(p.oid), md5(pg_get_functiondef(p.oid))
    from pg_proc p
    where p.pronamespace = 'graphile_worker'::regnamespace and p.proname like 'py\\_%'
"""

#: Tables whose rows an upgrade must keep, with the first Python revision that has them.
DATA_TABLES = {
    "_private_jobs": 0,
    "_private_job_queues": 0,
    "_private_py_unique_locks": 1,
    "_private_py_pauses": 14,
    "_private_py_limits": 15,
    "_private_py_limit_state": 15,
}

PARTITIONS = "select array_agg(partition) from graphile_worker._private_py_limit_state"

#: A partition value over 256 bytes: py/000020.sql stores it by its start and
#: SHA-256 (py_limit_key); revisions before stored it as it was.
LONG_PARTITION = "account-" + "x" * 300


async def run_migrate(url: str, files: MigrationFiles | None = None) -> Any:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        return await migrate(conn, SCHEMA, files)


def catalog_functions(url: str) -> set[tuple[str, str, str]]:
    """Each ``py_*`` function: name, identity arguments, hash of its whole definition."""
    with psycopg.connect(url) as conn:
        return {(r[0], r[1], r[2]) for r in conn.execute(_CATALOG_FUNCTIONS)}


def functions_text_hash(text: str) -> str:
    """SHA-256 of the functions file without its comment lines and blank lines
    (comments inside a function body are indented, so they count)."""
    kept = [line for line in text.splitlines() if line.strip() and not line.startswith("--")]
    return hashlib.sha256("\n".join(kept).encode()).hexdigest()


def fill(url: str, revision: int) -> None:
    """Jobs, unique locks, pauses and limits (a long partition value among them),
    through the functions of Python revision ``revision`` where it has them."""
    rows(
        url,
        """select graphile_worker.add_job('plain_' || n, json_build_object('n', n),
               queue_name => case when n % 2 = 0 then 'even' end,
               run_at => now() + interval '1 hour', job_key => 'key' || n)
           from generate_series(1, 20) as n""",
    )
    rows(
        url,
        """select graphile_worker.py_add_job('unique_' || n, json_build_object('n', n),
               unique_rule => '{"period": 3600}')
           from generate_series(1, 5) as n""",
    )
    if revision >= 14:
        rows(url, "select graphile_worker.py_pause('queue', 'even', null, 'upgrade test', true)")
        rows(url, "select graphile_worker.py_pause('task', 'plain_3')")
    if revision >= 15:
        rows(
            url, "select graphile_worker.py_set_limit('task', 'limited', 2, null, null, 'account')"
        )
        rows(url, "select graphile_worker.py_set_limit('operation', 'api', 1, 10, '1 minute')")
        rows(
            url,
            """insert into graphile_worker._private_py_limit_state (kind, name, partition)
               values ('task', 'limited', 'short'), ('operation', 'api', %s)""",
            # As the fetch stored it: keyed from revision 20 on.
            (
                value(url, "select graphile_worker.py_limit_key(%s)", (LONG_PARTITION,))
                if revision >= 20
                else LONG_PARTITION,
            ),
        )


def counts(url: str) -> dict[str, int]:
    """Rows of each table of DATA_TABLES that the database has."""
    result = {}
    for table in DATA_TABLES:
        if value(url, "select to_regclass(%s)", (f"graphile_worker.{table}",)):
            ident = psycopg.sql.Identifier(SCHEMA, table)
            result[table] = value(url, psycopg.sql.SQL("select count(*) from {}").format(ident))
    return result


@pytest.mark.unit
def test_functions_file_defines_each_py_function_once() -> None:
    text = MigrationFiles().py_functions()
    defined = _DEFINED.findall(text)
    assert defined and all(name.startswith("py_") for name in defined)
    assert len(_CREATE_FUNCTION.findall(text)) == len(defined), "a function not made as py_*"
    # Overloads (py_get_jobs) share a name; nothing else does.
    assert {n: c for n, c in Counter(defined).items() if c > 1} == {"py_get_jobs": 2}


@pytest.mark.unit
def test_numbered_py_revisions_define_no_function() -> None:
    files = MigrationFiles()
    for number in files.py_revisions():
        text = files.read(f"py/{number:06d}.sql")
        code = "\n".join(line.split("--")[0] for line in text.splitlines())
        assert not _CREATE_FUNCTION.search(code), f"py/{number:06d}.sql defines a function"


@pytest.mark.unit
def test_a_changed_functions_file_comes_with_a_new_revision() -> None:
    files = MigrationFiles()
    latest = max(files.py_revisions())
    assert FUNCTIONS_AT_REVISION.get(latest) == functions_text_hash(files.py_functions()), (
        "migrations/py/functions.sql changed without a new Python revision: add "
        "py/NNNNNN.sql (its number alone will do) and its line in FUNCTIONS_AT_REVISION"
    )


@pytest.mark.db
async def test_installed_py_functions_are_exactly_the_files(
    db: str, empty_db: str, tmp_path: Path
) -> None:
    installed = catalog_functions(db)
    assert Counter(name for name, _, _ in installed) == Counter(
        _DEFINED.findall(MigrationFiles().py_functions())
    )

    # The same install without the functions file has no py_* function at all;
    # the file applied on its own then gives exactly the installed ones.
    tree = tmp_path / "migrations"
    shutil.copytree(MigrationFiles().directory, tree)
    (tree / "py" / "functions.sql").write_text("-- nothing\n")
    await run_migrate(empty_db, MigrationFiles(tree))
    assert catalog_functions(empty_db) == set()
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute(compose_script(MigrationFiles().py_functions(), SCHEMA))
    assert catalog_functions(empty_db) == installed


@pytest.mark.parametrize("revision", [1, 18, 19, 20, LATEST_BEFORE])
@pytest.mark.db
async def test_database_installed_before_upgrades_to_a_fresh_install(
    db: str, empty_db: str, tmp_path: Path, revision: int
) -> None:
    await install_before(empty_db, tmp_path, revision)
    fill(empty_db, revision)
    before = counts(empty_db)
    partitions = set(value(empty_db, PARTITIONS) or []) if revision >= 15 else set()

    assert before["_private_jobs"] == 25
    assert before.get("_private_py_limit_state", 2) == before.get("_private_py_pauses", 2) == 2

    report = await run_migrate(empty_db)
    assert report.applied == ()
    assert report.applied_py == tuple(n for n in MigrationFiles().py_revisions() if n > revision)

    assert not differences(
        snapshot(empty_db, python_objects=True), snapshot(db, python_objects=True)
    )
    assert counts(empty_db) == {table: before.get(table, 0) for table in DATA_TABLES}
    if revision >= 15:
        # Keys stored before py/000020.sql take their new form (py_limit_key's);
        # keys stored since stay as they were.
        stored = set(value(empty_db, PARTITIONS))
        assert LONG_PARTITION not in stored
        if revision >= 20:
            assert stored == partitions
        else:
            assert LONG_PARTITION in partitions
            assert stored == {
                value(empty_db, "select graphile_worker.py_limit_key(%s)", (p,)) for p in partitions
            }


@pytest.mark.db
async def test_functions_commit_with_the_last_pending_revision(
    empty_db: str, tmp_path: Path
) -> None:
    await install_before(empty_db, tmp_path, 20)
    tree = tmp_path / "migrations"
    shutil.copytree(MigrationFiles().directory, tree)
    functions = tree / "py" / "functions.sql"
    functions.write_text(functions.read_text() + "\nselect 1 / 0;\n")

    *_, before, latest = MigrationFiles().py_revisions()
    with pytest.raises(psycopg.errors.DivisionByZero):
        await run_migrate(empty_db, MigrationFiles(tree))
    # The last revision went with the functions that failed after it; those
    # before it (each its own transaction) stay.
    assert value(empty_db, "select max(id) from graphile_worker._private_py_migrations") == before
    assert value(
        empty_db, "select to_regclass('graphile_worker._private_py_declared_limits') is not null"
    )  # py/000024.sql's
    assert value(
        empty_db,
        """select exists (select 1 from information_schema.columns
           where table_schema = 'graphile_worker' and column_name = 'sign_key')""",
    )  # py/000025.sql's
    assert value(
        empty_db, "select to_regclass('graphile_worker._private_py_workflows') is not null"
    )  # py/000026.sql's
    assert value(
        empty_db, "select to_regclass('graphile_worker._private_py_schedules') is not null"
    )  # py/000027.sql's
    assert value(
        empty_db, "select to_regclass('graphile_worker._private_py_limit_leases') is not null"
    )  # py/000028.sql's; py/000029.sql (functions only) went with the functions

    report = await run_migrate(empty_db)
    assert report.applied_py == (latest,)


@pytest.mark.db
async def test_functions_may_read_the_tables_of_the_last_revision(db: str, tmp_path: Path) -> None:
    # A later revision (the next number) adds a table and a language sql
    # function reading it, checked when created: the file runs after the
    # revision's own SQL.
    tree = tmp_path / "migrations"
    shutil.copytree(MigrationFiles().directory, tree)
    *_, latest = MigrationFiles().py_revisions()
    (tree / "py" / f"{latest + 1:06d}.sql").write_text(
        "create table {{schema}}._private_py_example (id int primary key);\n"
    )
    functions = tree / "py" / "functions.sql"
    functions.write_text(
        functions.read_text()
        + "\ncreate or replace function {{schema}}.py_example_count() returns bigint"
        + " language sql stable as $fn$ select count(*) from {{schema}}._private_py_example"
        + " $fn$;\n"
    )
    report = await run_migrate(db, MigrationFiles(tree))
    assert report.applied_py == (latest + 1,)
    assert value(db, "select graphile_worker.py_example_count()") == 0
