"""What is installed in the schema, and what to say when it is not."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from . import statements
from .errors import SchemaNotInstalledError

__all__ = ["autocommit", "schema_required", "unique_installed"]

# What PostgreSQL says when the schema, or one of its objects, is not there.
_SCHEMA_MISSING = (
    pg_errors.UndefinedFunction,
    pg_errors.UndefinedTable,
    pg_errors.InvalidSchemaName,
)


@contextmanager
def schema_required(schema: str) -> Iterator[None]:
    """Errors of the block that mean "no such schema, table or function" become
    a :class:`SchemaNotInstalledError` saying how to install it."""
    try:
        yield
    except _SCHEMA_MISSING as exc:
        raise SchemaNotInstalledError(
            f"the graphile-worker schema {schema!r} is not installed in this database "
            f"({exc.diag.message_primary}); run `graphile-worker --schema-only` or "
            "`await utils.migrate()` first"
        ) from exc


async def unique_installed(conn: psycopg.AsyncConnection[Any], schema: str) -> bool:
    """Whether ``schema`` has the unique-jobs table (Python migration 1)."""
    cur = await conn.execute(
        statements.compose(statements.unique_tables_installed, schema), {"schema": schema}
    )
    row = await cur.fetchone()
    return bool(row and row[0])


@asynccontextmanager
async def autocommit(conn: psycopg.AsyncConnection[Any]) -> AsyncIterator[None]:
    """The block runs ``conn`` in autocommit mode; its previous mode is restored
    after, so a pooled connection goes back as it came (the worker's pool is
    in autocommit, an application's may not be)."""
    previous = conn.autocommit
    if not previous:
        await conn.set_autocommit(True)
    try:
        yield
    finally:
        if conn.autocommit != previous and not conn.closed and not conn.broken:
            await conn.set_autocommit(previous)
