"""Library entry points that run steps of the worker pipeline."""

from __future__ import annotations

from .connection import connect, load_dotenv_file, resolve_connection_string, resolve_schema
from .migrate import MigrationReport, migrate

__all__ = ["run_migrations"]


async def run_migrations(
    connection_string: str | None = None, *, schema: str | None = None
) -> MigrationReport:
    """Install or upgrade the schema and return what was done (``--schema-only``)."""
    load_dotenv_file()
    conninfo = resolve_connection_string(connection_string)
    schema_name = resolve_schema(schema)
    async with await connect(conninfo, autocommit=True) as conn:
        return await migrate(conn, schema_name)
