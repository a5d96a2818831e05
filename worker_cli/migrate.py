"""Install or upgrade the graphile-worker schema (revision 20) in a database.

The schema is shared with graphile-worker (Node) 0.16-0.18. Revisions are
recorded in ``migrations`` exactly as Node records them (ids 1..20, the same
breaking flags); Python-only objects are recorded in ``_private_py_migrations``.

Each revision runs in its own transaction: it inserts its ``migrations`` row
first, runs its SQL, reapplies the public functions and sends
``NOTIFY "worker:migrate"``. Python migrators take a transaction-level
advisory lock and re-read the state under it, so any number of them can start
on one database at once; a racing Node migrator is detected by the unique
violation on ``migrations`` and treated as "someone else did it".
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql

from . import statements
from .errors import IncompatibleSchemaError, MigrationError, UnsupportedPostgresError

__all__ = [
    "BREAKING_REVISIONS",
    "LATEST_REVISION",
    "MigrationFiles",
    "MigrationReport",
    "migrate",
]

logger = logging.getLogger("graphile_worker.migrate")

LATEST_REVISION = 20
#: Revisions that graphile-worker (Node) flags as breaking.
BREAKING_REVISIONS = frozenset({1, 3, 11, 13, 14, 16, 19})
#: base.sql builds this revision from nothing; older databases are refused.
BASE_REVISION = 16
MIN_SERVER_VERSION = 120000

# First key of the advisory lock that serialises our migrators (per schema).
_LOCK_NAMESPACE = 0x67775079  # "gwPy"

# Errors meaning "another migrator created this first".
_CLASH_ERRORS = (
    pg_errors.UniqueViolation,
    pg_errors.DuplicateSchema,
    pg_errors.DuplicateTable,
    pg_errors.DuplicateObject,
)

_PLACEHOLDER = "{{schema}}"


@dataclass(frozen=True)
class MigrationReport:
    """What one ``migrate`` call did."""

    #: Revision the database was at before (None: no schema).
    previous_revision: int | None
    #: Node revisions applied now (base.sql counts as 1..16).
    applied: tuple[int, ...]
    #: Python-only migrations applied now.
    applied_py: tuple[int, ...]
    #: Revision the database is at now.
    revision: int


class MigrationFiles:
    """The SQL files of the schema, found in the installed package or the source tree."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or _default_directory()

    def read(self, name: str) -> str:
        return (self.directory / name).read_text(encoding="utf-8")

    def revision(self, number: int) -> str:
        return self.read(f"{number:06d}.sql")

    def py_revisions(self) -> list[int]:
        """Numbers of the Python-only migrations (``py/NNNNNN.sql``), ascending."""
        py_dir = self.directory / "py"
        if not py_dir.is_dir():
            return []
        return sorted(
            int(path.stem) for path in py_dir.iterdir() if re.fullmatch(r"\d{6}\.sql", path.name)
        )


def _default_directory() -> Path:
    packaged = resources.files("worker_cli") / "migrations"
    if packaged.is_dir():
        return Path(str(packaged))
    # A source checkout (editable install): the top-level migrations folder.
    source = Path(__file__).resolve().parent.parent / "migrations"
    if source.is_dir():
        return source
    raise MigrationError(
        "the schema's SQL files are missing from this installation of graphile-worker"
    )


@cache
def _split(text: str) -> tuple[str, ...]:
    return tuple(text.split(_PLACEHOLDER))


def compose_script(text: str, schema: str) -> sql.Composed:
    """Replace every ``{{schema}}`` in ``text`` with the quoted schema name."""
    parts: list[sql.Composable] = []
    for index, part in enumerate(_split(text)):
        if index:
            parts.append(sql.Identifier(schema))
        parts.append(sql.SQL(part))
    return sql.Composed(parts)


async def migrate(
    conn: psycopg.AsyncConnection[Any],
    schema: str,
    files: MigrationFiles | None = None,
) -> MigrationReport:
    """Bring ``schema`` to revision 20 on ``conn`` (which must be in autocommit mode)."""
    check_server_version(conn.info.server_version)
    files = files or MigrationFiles()
    previous: int | None = None
    applied: list[int] = []
    for _attempt in range(5):
        state = await _read_state(conn, schema)
        if state is None:
            if await _install_base(conn, schema, files):
                applied.extend(range(1, BASE_REVISION + 1))
            continue  # read the state again, whoever installed it
        latest, latest_breaking = state
        if previous is None and not applied:
            previous = latest
        _check_compatible(latest, latest_breaking)
        for number in range(latest + 1, LATEST_REVISION + 1):
            if await _apply_revision(conn, schema, files, number):
                applied.append(number)
        applied_py = await _apply_py_migrations(conn, schema, files)
        return MigrationReport(
            previous_revision=previous,
            applied=tuple(applied),
            applied_py=tuple(applied_py),
            revision=max(latest, LATEST_REVISION),
        )
    raise MigrationError(f"could not install schema {schema!r}: other migrators kept interfering")


def check_server_version(server_version: int) -> None:
    """Refuse PostgreSQL servers older than 12."""
    if server_version < MIN_SERVER_VERSION:
        raise UnsupportedPostgresError(
            "graphile-worker needs PostgreSQL 12 or newer; this server is version "
            f"{server_version // 10000}.{server_version % 10000} "
            f"(server_version_num {server_version})"
        )


def _check_compatible(latest: int, latest_breaking: int | None) -> None:
    if latest < BASE_REVISION:
        raise MigrationError(
            f"the database's graphile-worker schema is at revision {latest}, older than "
            f"revision {BASE_REVISION}, which this worker can upgrade from. Upgrade it "
            "first by running graphile-worker (Node) 0.16 or newer once "
            "(npx graphile-worker@0.16 -c URL --schema-only), then start this worker."
        )
    if latest_breaking is not None and latest_breaking > LATEST_REVISION:
        raise IncompatibleSchemaError(
            f"the database's graphile-worker schema is at revision {latest}, which includes "
            f"breaking revision {latest_breaking}; this worker supports up to revision "
            f"{LATEST_REVISION}. Running would be unsafe: upgrade graphile-worker for Python "
            "or use a compatible version of graphile-worker (Node)."
        )
    if latest > LATEST_REVISION:
        logger.warning(
            "The database's graphile-worker schema is at revision %d, but this worker "
            "supports up to revision %d; none of the newer revisions is breaking, so "
            "carrying on.",
            latest,
            LATEST_REVISION,
        )


async def _read_state(
    conn: psycopg.AsyncConnection[Any], schema: str
) -> tuple[int, int | None] | None:
    """(latest revision, latest breaking revision), or None if nothing is installed."""
    try:
        cur = await conn.execute(statements.compose(statements.migration_state, schema))
    except (pg_errors.UndefinedTable, pg_errors.InvalidSchemaName):
        return None
    except pg_errors.UndefinedColumn:
        # A migrations table without "breaking": graphile-worker older than 0.11.
        return (0, None)
    row = await cur.fetchone()
    assert row is not None
    latest, latest_breaking = row
    if latest is None:
        return None
    return (int(latest), latest_breaking)


async def _lock(conn: psycopg.AsyncConnection[Any], schema: str) -> None:
    await conn.execute(
        statements.compose(statements.migration_lock, schema),
        {"namespace": _LOCK_NAMESPACE, "schema": schema},
    )


async def _exists(conn: psycopg.AsyncConnection[Any], query: sql.Composed, **params: Any) -> bool:
    """The answer of a ``select exists (...)`` statement."""
    cur = await conn.execute(query, params)
    row = await cur.fetchone()
    return bool(row and row[0])


async def _notify_migrated(
    conn: psycopg.AsyncConnection[Any], schema: str, numbers: Iterable[int]
) -> None:
    for number in numbers:
        payload = json.dumps(
            {"migrationNumber": number, "breaking": number in BREAKING_REVISIONS},
            separators=(",", ":"),
        )
        await conn.execute(
            statements.compose(statements.notify_migrated, schema), {"payload": payload}
        )


async def _install_base(
    conn: psycopg.AsyncConnection[Any], schema: str, files: MigrationFiles
) -> bool:
    """Build revisions 1-16 on an empty schema; False if someone else already had."""
    numbers = list(range(1, BASE_REVISION + 1))
    try:
        async with conn.transaction():
            await _lock(conn, schema)
            await conn.execute(compose_script(files.read("bootstrap.sql"), schema))
            if await _exists(conn, statements.compose(statements.migrations_recorded, schema)):
                return False
            await conn.execute(
                statements.compose(statements.record_base_migrations, schema),
                {"breaking": sorted(BREAKING_REVISIONS), "ids": numbers},
            )
            await conn.execute(compose_script(files.read("base.sql"), schema))
            await conn.execute(compose_script(files.read("functions.sql"), schema))
            await _notify_migrated(conn, schema, numbers)
    except _CLASH_ERRORS:
        logger.debug("another migrator installed schema %s first", schema)
        return False
    logger.info("installed graphile-worker schema %s (revisions 1-%d)", schema, BASE_REVISION)
    return True


async def _apply_revision(
    conn: psycopg.AsyncConnection[Any], schema: str, files: MigrationFiles, number: int
) -> bool:
    """Apply one revision; False if another migrator already had."""
    try:
        async with conn.transaction():
            await _lock(conn, schema)
            if await _exists(
                conn, statements.compose(statements.migration_recorded, schema), id=number
            ):
                return False
            # The row goes in first, so a racing Node migrator waits on it.
            await conn.execute(
                statements.compose(statements.record_migration, schema),
                {"id": number, "breaking": number in BREAKING_REVISIONS},
            )
            await conn.execute(compose_script(files.revision(number), schema))
            await conn.execute(compose_script(files.read("functions.sql"), schema))
            await _notify_migrated(conn, schema, [number])
    except _CLASH_ERRORS:
        logger.debug("another migrator applied revision %d first", number)
        return False
    logger.info("applied graphile-worker schema revision %d to %s", number, schema)
    return True


async def _apply_py_migrations(
    conn: psycopg.AsyncConnection[Any], schema: str, files: MigrationFiles
) -> list[int]:
    """Apply the Python-only migrations not yet recorded in ``_private_py_migrations``."""
    numbers = files.py_revisions()
    if not numbers:
        return []
    try:
        cur = await conn.execute(statements.compose(statements.py_migrations_recorded, schema))
        done = {int(row[0]) for row in await cur.fetchall()}
    except pg_errors.UndefinedTable:
        done = set()
    applied: list[int] = []
    # Every number not recorded yet, in order (a lower number added later still applies).
    for number in (n for n in numbers if n not in done):
        async with conn.transaction():
            await _lock(conn, schema)
            await conn.execute(compose_script(files.read("py/record.sql"), schema))
            if await _exists(
                conn, statements.compose(statements.py_migration_recorded, schema), id=number
            ):
                continue
            await conn.execute(
                statements.compose(statements.record_py_migration, schema), {"id": number}
            )
            await conn.execute(compose_script(files.read(f"py/{number:06d}.sql"), schema))
        applied.append(number)
        logger.info("applied Python-only migration %d to %s", number, schema)
    return applied
