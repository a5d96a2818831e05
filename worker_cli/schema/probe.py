"""What is installed in the schema, and what to say when it is not."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from psycopg import errors as pg_errors

from ..db.plan import Plan, query
from ..errors import SchemaNotInstalledError
from ..sql import compose
from ..sql import jobs as jobs_sql

__all__ = ["schema_required", "unique_installed"]

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
            "`utils.migrate()` first"
        ) from exc


def unique_installed(schema: str) -> Plan[bool]:
    """Whether ``schema`` has the unique-jobs table (Python migration 1)."""
    rows = yield from query(compose(jobs_sql.UNIQUE_TABLES_INSTALLED, schema), {"schema": schema})
    return bool(rows and rows[0][0])
