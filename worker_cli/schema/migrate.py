"""Install or upgrade the graphile-worker schema (revision 20) in a database.

The schema is shared with graphile-worker (Node) 0.16-0.18. Revisions are
recorded in ``migrations`` exactly as Node records them (ids 1..20, the same
breaking flags); Python-only objects are recorded in ``_private_py_migrations``.

Each revision runs in its own transaction (a savepoint, when the caller's
connection is in a transaction: see :meth:`WorkerUtils.migrate
<worker_cli.client.worker_utils.WorkerUtils.migrate>`): it inserts its ``migrations`` row
first, runs its SQL, reapplies the public functions and sends
``NOTIFY "worker:migrate"``. The Python-only revisions (``py/NNNNNN.sql``)
hold tables, indexes and data changes; every ``py_*`` function is defined once,
in ``py/functions.sql``, applied in the transaction of the last pending Python
revision. Python migrators take a transaction-level
advisory lock and re-read the state under it, so any number of them can start
on one database at once; a racing Node migrator is detected by the unique
violation on ``migrations`` and treated as "someone else did it".

The migrator is a plan (:mod:`worker_cli.db.plan`): :func:`migrate` runs it on an
``AsyncConnection`` (the worker's start-up), and the sync WorkerUtils runs the
same plan on a ``Connection``.
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

from ..db.drivers import run_plan_async
from ..db.plan import Plan, execute, protected, query, server_version, transaction
from ..errors import IncompatibleSchemaError, MigrationError, UnsupportedPostgresError
from ..sql import compose
from ..sql import migrations as migration_sql

__all__ = [
    "BREAKING_REVISIONS",
    "LATEST_REVISION",
    "MigrationFiles",
    "MigrationReport",
    "migrate",
    "migration_plan",
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

#: The Python-only functions, applied with the last pending Python revision.
PY_FUNCTIONS = "py/functions.sql"

_PLACEHOLDERS = re.compile(r"\{\{(schema|schema_name)\}\}")


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

    def py_functions(self) -> str:
        """Every ``py_*`` function, as the latest Python revision wants it
        (``py/functions.sql``, ``create or replace`` each)."""
        return self.read(PY_FUNCTIONS)

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
    source = Path(__file__).resolve().parents[2] / "migrations"
    if source.is_dir():
        return source
    raise MigrationError(
        "the schema's SQL files are missing from this installation of graphile-worker"
    )


@cache
def _split(text: str) -> tuple[str, ...]:
    """The text between placeholders, and the placeholders' names, in turn."""
    return tuple(_PLACEHOLDERS.split(text))


def compose_script(text: str, schema: str) -> sql.Composed:
    """Replace every ``{{schema}}`` in ``text`` with the quoted schema name, and
    every ``{{schema_name}}`` with the name as a string literal (for a
    notification channel named after the schema)."""
    parts: list[sql.Composable] = []
    for index, part in enumerate(_split(text)):
        if index % 2 == 0:
            parts.append(sql.SQL(part))
        else:
            parts.append(sql.Identifier(schema) if part == "schema" else sql.Literal(schema))
    return sql.Composed(parts)


async def migrate(
    conn: psycopg.AsyncConnection[Any],
    schema: str,
    files: MigrationFiles | None = None,
) -> MigrationReport:
    """Bring ``schema`` to revision 20 on ``conn`` (which must be in autocommit mode)."""
    return await run_plan_async(conn, migration_plan(schema, files))


def migration_plan(schema: str, files: MigrationFiles | None = None) -> Plan[MigrationReport]:
    """Bring ``schema`` to revision 20: each revision in its own transaction on a
    connection in autocommit mode, or in a savepoint of the transaction open on it."""
    check_server_version((yield from server_version()))
    files = files or MigrationFiles()
    previous: int | None = None
    applied: list[int] = []
    for _attempt in range(5):
        state = yield from protected(_read_state(schema))
        if state is None:
            if (yield from _install_base(schema, files)):
                applied.extend(range(1, BASE_REVISION + 1))
            continue  # read the state again, whoever installed it
        latest, latest_breaking = state
        if previous is None and not applied:
            previous = latest
        _check_compatible(latest, latest_breaking)
        for number in range(latest + 1, LATEST_REVISION + 1):
            if (yield from _apply_revision(schema, files, number)):
                applied.append(number)
        applied_py = yield from _apply_py_migrations(schema, files)
        report = MigrationReport(
            previous_revision=previous,
            applied=tuple(applied),
            applied_py=tuple(applied_py),
            revision=max(latest, LATEST_REVISION),
        )
        if applied or applied_py:
            logger.info("%s", migrated_line(schema, report))
        return report
    raise MigrationError(f"could not install schema {schema!r}: other migrators kept interfering")


def migrated_line(schema: str, report: MigrationReport) -> str:
    """What a migration did, in one line (logged at INFO; each revision is a
    DEBUG line): ``Schema 'graphile_worker' migrated to revision 20 (41
    migrations: graphile-worker 1-20, Python-only 1-21)``."""
    parts = [
        f"{kind} {_ranges(numbers)}"
        for kind, numbers in (
            ("graphile-worker", report.applied),
            ("Python-only", report.applied_py),
        )
        if numbers
    ]
    count = len(report.applied) + len(report.applied_py)
    return (
        f"Schema {schema!r} migrated to revision {report.revision} "
        f"({count} migration{'' if count == 1 else 's'}: {', '.join(parts)})"
    )


def _ranges(numbers: Iterable[int]) -> str:
    """``1-20``, ``3, 5-7``: sorted numbers with their runs joined."""
    runs: list[list[int]] = []
    for number in sorted(numbers):
        if runs and number == runs[-1][-1] + 1:
            runs[-1].append(number)
        else:
            runs.append([number])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


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


def _read_state(schema: str) -> Plan[tuple[int, int | None] | None]:
    """(latest revision, latest breaking revision), or None if nothing is installed.
    (Run :func:`~worker_cli.db.plan.protected`: the error caught here must not
    abort a transaction open on the caller's connection.)"""
    try:
        rows = yield from query(compose(migration_sql.MIGRATION_STATE, schema))
    except (pg_errors.UndefinedTable, pg_errors.InvalidSchemaName):
        return None
    except pg_errors.UndefinedColumn:
        # A migrations table without "breaking": graphile-worker older than 0.11.
        return (0, None)
    latest, latest_breaking = rows[0]
    if latest is None:
        return None
    return (int(latest), latest_breaking)


def _lock(schema: str) -> Plan[None]:
    yield from query(
        compose(migration_sql.MIGRATION_LOCK, schema),
        {"namespace": _LOCK_NAMESPACE, "schema": schema},
    )


def _exists(statement: sql.Composed, **params: Any) -> Plan[bool]:
    """The answer of a ``select exists (...)`` statement."""
    rows = yield from query(statement, params)
    return bool(rows and rows[0][0])


def _script(text: str, schema: str) -> Plan[None]:
    """Run a migration script (several statements, no parameters)."""
    yield from execute(compose_script(text, schema))


def _notify_migrated(schema: str, numbers: Iterable[int]) -> Plan[None]:
    for number in numbers:
        payload = json.dumps(
            {"migrationNumber": number, "breaking": number in BREAKING_REVISIONS},
            separators=(",", ":"),
        )
        yield from query(compose(migration_sql.NOTIFY_MIGRATED, schema), {"payload": payload})


def _install_base(schema: str, files: MigrationFiles) -> Plan[bool]:
    """Build revisions 1-16 on an empty schema; False if someone else already had."""
    try:
        installed = yield from transaction(_base_steps(schema, files))
    except _CLASH_ERRORS:
        logger.debug("another migrator installed schema %s first", schema)
        return False
    if not installed:
        return False
    logger.debug("installed graphile-worker schema %s (revisions 1-%d)", schema, BASE_REVISION)
    return True


def _base_steps(schema: str, files: MigrationFiles) -> Plan[bool]:
    numbers = list(range(1, BASE_REVISION + 1))
    yield from _lock(schema)
    yield from _script(files.read("bootstrap.sql"), schema)
    if (yield from _exists(compose(migration_sql.MIGRATIONS_RECORDED, schema))):
        return False
    yield from execute(
        compose(migration_sql.RECORD_BASE_MIGRATIONS, schema),
        {"breaking": sorted(BREAKING_REVISIONS), "ids": numbers},
    )
    yield from _script(files.read("base.sql"), schema)
    yield from _script(files.read("functions.sql"), schema)
    yield from _notify_migrated(schema, numbers)
    return True


def _apply_revision(schema: str, files: MigrationFiles, number: int) -> Plan[bool]:
    """Apply one revision; False if another migrator already had."""
    try:
        applied = yield from transaction(_revision_steps(schema, files, number))
    except _CLASH_ERRORS:
        logger.debug("another migrator applied revision %d first", number)
        return False
    if applied:
        logger.debug("applied graphile-worker schema revision %d to %s", number, schema)
    return applied


def _revision_steps(schema: str, files: MigrationFiles, number: int) -> Plan[bool]:
    yield from _lock(schema)
    if (yield from _exists(compose(migration_sql.MIGRATION_RECORDED, schema), id=number)):
        return False
    # The row goes in first, so a racing Node migrator waits on it.
    yield from execute(
        compose(migration_sql.RECORD_MIGRATION, schema),
        {"id": number, "breaking": number in BREAKING_REVISIONS},
    )
    yield from _script(files.revision(number), schema)
    yield from _script(files.read("functions.sql"), schema)
    yield from _notify_migrated(schema, [number])
    return True


def _apply_py_migrations(schema: str, files: MigrationFiles) -> Plan[list[int]]:
    """Apply the Python-only migrations not yet recorded in ``_private_py_migrations``,
    the functions file in the transaction of the last of them."""
    numbers = files.py_revisions()
    if not numbers:
        return []
    done = yield from protected(_py_migrations_done(schema))
    # Every number not recorded yet, in order (a lower number added later still applies).
    pending = [n for n in numbers if n not in done]
    applied: list[int] = []
    for number in pending:
        with_functions = number == pending[-1]
        if (yield from transaction(_py_migration_steps(schema, files, number, with_functions))):
            applied.append(number)
            logger.debug("applied Python-only migration %d to %s", number, schema)
    return applied


def _py_migrations_done(schema: str) -> Plan[set[int]]:
    try:
        rows = yield from query(compose(migration_sql.PY_MIGRATIONS_RECORDED, schema))
    except pg_errors.UndefinedTable:
        return set()
    return {int(row[0]) for row in rows}


def _py_migration_steps(
    schema: str, files: MigrationFiles, number: int, with_functions: bool
) -> Plan[bool]:
    """One Python revision; with ``with_functions`` (the last pending one) the
    functions file too, after it, so that the functions and the tables they
    read are committed together. A revision another migrator recorded first is
    skipped with its functions: whoever applied it applied them."""
    yield from _lock(schema)
    yield from _script(files.read("py/record.sql"), schema)
    if (yield from _exists(compose(migration_sql.PY_MIGRATION_RECORDED, schema), id=number)):
        return False
    yield from execute(compose(migration_sql.RECORD_PY_MIGRATION, schema), {"id": number})
    yield from _script(files.read(f"py/{number:06d}.sql"), schema)
    if with_functions:
        yield from _script(files.py_functions(), schema)
    return True
