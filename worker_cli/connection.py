"""Where the database connection comes from.

The order matches graphile-worker (Node): an explicit connection string, else
``DATABASE_URL``, else the libpq ``PG*`` environment variables. A ``.env`` file
in the working directory is read first (without overriding the environment).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psycopg
from dotenv import load_dotenv
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from .errors import ConfigurationError, DatabaseConnectionError

__all__ = [
    "DEFAULT_SCHEMA",
    "check_connection",
    "connect",
    "load_dotenv_file",
    "resolve_connection_string",
    "resolve_schema",
    "worker_conninfo",
]

DEFAULT_SCHEMA = "graphile_worker"

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


def resolve_schema(schema: str | None = None) -> str:
    """Return the schema name: the argument, ``GRAPHILE_WORKER_SCHEMA``, or the default."""
    name = schema or os.environ.get("GRAPHILE_WORKER_SCHEMA") or DEFAULT_SCHEMA
    if len(name.encode()) > 63:
        raise ConfigurationError(f"schema name {name!r} is longer than PostgreSQL's 63-byte limit")
    return name


async def connect(conninfo: str, *, autocommit: bool = False) -> psycopg.AsyncConnection[Any]:
    """Open one connection; failures raise DatabaseConnectionError with libpq's reason."""
    try:
        return await psycopg.AsyncConnection.connect(
            conninfo, autocommit=autocommit, connect_timeout=10
        )
    except psycopg.OperationalError as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise DatabaseConnectionError(f"could not connect to the database: {reason}") from None
    except psycopg.ProgrammingError as exc:  # a malformed connection string
        raise DatabaseConnectionError(f"invalid connection string: {exc}") from None


async def check_connection(conninfo: str) -> None:
    """Connect once, so a bad address or password fails now rather than as a
    pool timeout much later."""
    conn = await connect(conninfo)
    await conn.close()


#: Settings of every connection a worker opens, unless the connection string
#: (or the matching libpq variable) sets them: a connect timeout, and TCP
#: keepalives and a user timeout so that a connection to a server that has
#: vanished (a network cut, a failover) fails within about a minute instead
#: of hanging for the system's default of up to two hours. Unix sockets ignore
#: the TCP settings.
WORKER_CONNECTION_DEFAULTS: dict[str, tuple[str, str | None]] = {
    # parameter: (value, the libpq environment variable that overrides it)
    "connect_timeout": ("10", "PGCONNECT_TIMEOUT"),
    "keepalives": ("1", None),
    "keepalives_idle": ("30", None),
    "keepalives_interval": ("10", None),
    "keepalives_count": ("3", None),
    "tcp_user_timeout": ("60000", None),
}


def worker_conninfo(conninfo: str, application_name: str) -> str:
    """``conninfo`` with the worker's connection settings added where it sets
    none: :data:`WORKER_CONNECTION_DEFAULTS`, and ``application_name`` (which
    names the pool and the connection's role in ``pg_stat_activity``)."""
    params: dict[str, Any] = conninfo_to_dict(conninfo)
    for name, (default, variable) in WORKER_CONNECTION_DEFAULTS.items():
        if name not in params and not (variable and os.environ.get(variable)):
            params[name] = default
    if "application_name" not in params and not os.environ.get("PGAPPNAME"):
        params["application_name"] = application_name
    return make_conninfo(**params)
