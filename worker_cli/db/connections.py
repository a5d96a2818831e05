"""How the package connects to PostgreSQL: one place for connection settings."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool

from ..errors import DatabaseConnectionError
from .backoff import one_line
from .held_connection import own_pool

if TYPE_CHECKING:
    from ..config.options import WorkerOptions

__all__ = [
    "WORKER_CONNECTION_DEFAULTS",
    "WorkerConnections",
    "check_connection",
    "check_connection_sync",
    "connect",
    "connect_sync",
    "worker_conninfo",
]


async def connect(conninfo: str, *, autocommit: bool = False) -> psycopg.AsyncConnection[Any]:
    """Open one connection; failures raise DatabaseConnectionError with libpq's reason."""
    with _connect_errors():
        return await psycopg.AsyncConnection.connect(
            worker_conninfo(conninfo), autocommit=autocommit
        )


def connect_sync(conninfo: str, *, autocommit: bool = False) -> psycopg.Connection[Any]:
    """:func:`connect`, blocking (for the sync WorkerUtils)."""
    with _connect_errors():
        return psycopg.Connection.connect(worker_conninfo(conninfo), autocommit=autocommit)


@contextmanager
def _connect_errors() -> Iterator[None]:
    """Connection failures become DatabaseConnectionError with libpq's reason."""
    try:
        yield
    except psycopg.OperationalError as exc:
        reason = one_line(exc)
        raise DatabaseConnectionError(f"could not connect to the database: {reason}") from None
    except psycopg.ProgrammingError as exc:  # a malformed connection string
        raise DatabaseConnectionError(f"invalid connection string: {exc}") from None


async def check_connection(conninfo: str) -> None:
    """Connect once, so a bad address or password fails now rather than as a
    pool timeout much later."""
    conn = await connect(conninfo)
    await conn.close()


def check_connection_sync(conninfo: str) -> None:
    """:func:`check_connection`, blocking."""
    connect_sync(conninfo).close()


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


def worker_conninfo(conninfo: str, application_name: str | None = None) -> str:
    """``conninfo`` with the worker's connection settings added where it (or
    the libpq variable) sets none: :data:`WORKER_CONNECTION_DEFAULTS`, and
    ``application_name`` if given (naming the pool and the connection's role
    in ``pg_stat_activity``)."""
    params: dict[str, Any] = conninfo_to_dict(conninfo)
    for name, (default, variable) in WORKER_CONNECTION_DEFAULTS.items():
        if name not in params and not (variable and os.environ.get(variable)):
            params[name] = default
    if application_name and "application_name" not in params and not os.environ.get("PGAPPNAME"):
        params["application_name"] = application_name
    return make_conninfo(**params)


@dataclass(frozen=True)
class WorkerConnections:
    """The settings of every connection one worker pool opens: its pool, the
    fetcher, the LISTEN connection and the heartbeat.

    Each gets :data:`WORKER_CONNECTION_DEFAULTS`, autocommit, an
    ``application_name`` naming the pool and the connection's role (so a DBA
    can tell them apart in ``pg_stat_activity``), and no server-side prepared
    statements when ``no_prepared_statements`` is set (pgBouncer in
    transaction mode).
    """

    conninfo: str
    pool_id: str
    no_prepared_statements: bool = False
    #: The connection string of the LISTEN and heartbeat connections
    #: (``--listen-url``), if any.
    listen_conninfo: str | None = None

    @classmethod
    def of(cls, options: WorkerOptions, conninfo: str, pool_id: str) -> WorkerConnections:
        """The connections of pool ``pool_id`` run with ``options``."""
        return cls(conninfo, pool_id, options.no_prepared_statements, options.listen_url)

    def conninfo_for(self, role: str) -> str:
        """The connection string of the connection playing ``role``
        (``pool``, ``fetch``, ``listen``, ``heartbeat``). ``listen`` and
        ``heartbeat`` go to ``listen_conninfo`` when it is set: each needs a
        session of its own (LISTEN; the heartbeat's session sign), which a
        pooler in transaction mode does not give."""
        conninfo = self.conninfo
        if role in ("listen", "heartbeat") and self.listen_conninfo is not None:
            conninfo = self.listen_conninfo
        return worker_conninfo(conninfo, f"graphile-worker {self.pool_id} {role}")

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``connect()`` for every such connection."""
        if self.no_prepared_statements:
            return {"autocommit": True, "prepare_threshold": None}
        return {"autocommit": True}

    async def connect(self, role: str) -> psycopg.AsyncConnection[Any]:
        """Open one connection for ``role``; libpq's errors propagate."""
        return await psycopg.AsyncConnection.connect(self.conninfo_for(role), **self.kwargs())

    def connect_sync(self, role: str) -> psycopg.Connection[Any]:
        """The same, blocking (the heartbeat's thread)."""
        return psycopg.Connection.connect(self.conninfo_for(role), **self.kwargs())

    def pool(self, *, min_size: int, max_size: int) -> AsyncConnectionPool[Any]:
        """The pool's connection pool (not yet open), for tasks and results. A
        connection lent to a task goes back to it reset (see
        :mod:`.held_connection`)."""
        return own_pool(
            AsyncConnectionPool(
                self.conninfo_for("pool"),
                min_size=min_size,
                max_size=max_size,
                kwargs=self.kwargs(),
                open=False,
                name=self.pool_id,
            )
        )
