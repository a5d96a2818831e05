"""Databases as the migrator built them before the functions file (issue 42).

``tests/fixtures/migrations_before_issue_42`` is a frozen copy of the
migration files as they were then, each Python revision defining its own
functions. :func:`install_before` builds a schema at one of its Python
revisions by the steps the migrator took then, for tests of what an upgrade
does to a database installed by an earlier version.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import psycopg

from worker_cli.schema.migrate import MigrationFiles, compose_script, migrate

#: The migration files as they were before the functions file (issue 42).
FILES_BEFORE = Path(__file__).resolve().parents[1] / "fixtures" / "migrations_before_issue_42"
#: The last Python revision of FILES_BEFORE.
LATEST_BEFORE = 21


async def install_before(
    url: str, tmp_path: Path, revision: int, schema: str = "graphile_worker"
) -> None:
    """Build ``schema`` at Python revision ``revision`` from FILES_BEFORE, as the
    migrator did then: Node's revisions (unchanged since), then each Python
    revision in its own transaction (``py/record.sql``, its ledger row, its file)."""
    node_only = tmp_path / "migrations_before_node_only"
    shutil.copytree(FILES_BEFORE, node_only, ignore=shutil.ignore_patterns("py"))
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        report = await migrate(conn, schema, MigrationFiles(node_only))
    assert report.applied_py == ()
    ledger = psycopg.sql.Identifier(schema, "_private_py_migrations")
    with psycopg.connect(url, autocommit=True) as conn:
        for number in range(1, revision + 1):
            with conn.transaction():
                conn.execute(
                    compose_script((FILES_BEFORE / "py" / "record.sql").read_text(), schema)
                )
                conn.execute(
                    psycopg.sql.SQL("insert into {} (id) values (%s)").format(ledger), (number,)
                )
                script = (FILES_BEFORE / "py" / f"{number:06d}.sql").read_text()
                conn.execute(compose_script(script, schema))
