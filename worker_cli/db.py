"""How the package connects to PostgreSQL: one place for connection settings."""

from __future__ import annotations

import os
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from .errors import DatabaseConnectionError

__all__ = ["WORKER_CONNECTION_DEFAULTS", "check_connection", "connect", "worker_conninfo"]


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
