"""Where the database connection comes from.

The order matches graphile-worker (Node): an explicit connection string, else
``DATABASE_URL``, else the libpq ``PG*`` environment variables. A ``.env`` file
in the working directory is read first (without overriding the environment).
:func:`resolve_database` does all three once, for an entry point.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dotenv import load_dotenv

from ..errors import ConfigurationError
from .options import WorkerOptions

__all__ = [
    "DEFAULT_SCHEMA",
    "DatabaseConfig",
    "load_dotenv_file",
    "resolve_connection_string",
    "resolve_database",
    "resolve_schema",
    "schema_name_problem",
]

DEFAULT_SCHEMA: str = WorkerOptions.schema

# The libpq variables that, when set, describe a server to connect to.
_LIBPQ_SERVER_VARIABLES = (
    "PGHOST",
    "PGHOSTADDR",
    "PGPORT",
    "PGDATABASE",
    "PGUSER",
    "PGSERVICE",
)

NO_CONNECTION_MESSAGE = (
    "No database to connect to: pass a connection string with -c/--connection "
    "(for example postgres://user:pass@host:5432/db), set DATABASE_URL, "
    "or set the libpq PG* variables (PGHOST, PGDATABASE, PGUSER, ...)."
)


def load_dotenv_file(directory: Path | None = None) -> None:
    """Load ``.env`` from ``directory`` (default: the working directory), if any."""
    path = (directory or Path.cwd()) / ".env"
    if path.is_file():
        load_dotenv(path, override=False)


def resolve_connection_string(connection_string: str | None = None) -> str:
    """Return the libpq connection string to use, or raise ConfigurationError.

    An empty string is returned when only ``PG*`` variables are set: libpq
    reads them itself.
    """
    if connection_string:
        return connection_string
    database_url = os.environ.get("DATABASE_URL")
    if database_url:
        return database_url
    if any(os.environ.get(name) for name in _LIBPQ_SERVER_VARIABLES):
        return ""
    raise ConfigurationError(NO_CONNECTION_MESSAGE)


def schema_name_problem(name: str) -> str | None:
    """What PostgreSQL would refuse (or silently change) in a schema name, or
    None if it is fine: an empty name, one over 63 bytes (it would be
    truncated), a NUL, or the prefix ``pg_`` (reserved for system schemas)."""
    if not name:
        return "a schema name must not be empty"
    if len(name.encode()) > 63:
        shown = repr(name) if len(name) <= 70 else f"{name[:70]!r}..."
        return f"schema name {shown} is longer than PostgreSQL's 63-byte limit"
    if "\x00" in name:
        return f"schema name {name!r} holds a NUL character"
    if name.startswith("pg_"):
        return f"schema name {name!r} starts with pg_, which PostgreSQL reserves for system schemas"
    return None


def resolve_schema(schema: str | None = None) -> str:
    """Return the schema name: the argument, ``GRAPHILE_WORKER_SCHEMA``, or the
    default; a name PostgreSQL would refuse raises ConfigurationError."""
    name = schema or os.environ.get("GRAPHILE_WORKER_SCHEMA") or DEFAULT_SCHEMA
    problem = schema_name_problem(name)
    if problem:
        raise ConfigurationError(problem)
    return name


@dataclass(frozen=True)
class DatabaseConfig:
    """The database an entry point works on, resolved once."""

    #: libpq connection string; empty when only the ``PG*`` variables are set.
    conninfo: str
    schema: str


def resolve_database(
    connection_string: str | None = None, schema: str | None = None
) -> DatabaseConfig:
    """Read ``.env``, then resolve the connection string and the schema."""
    load_dotenv_file()
    return DatabaseConfig(resolve_connection_string(connection_string), resolve_schema(schema))
