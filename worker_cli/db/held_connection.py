"""The connections the package lends to code that is not its own, and the one a block holds.

``helpers.query()``, ``helpers.with_pg_client()`` and
:meth:`WorkerUtils.connection` / :meth:`WorkerUtils.holding_connection` lend a
connection of the pool to a task or an application (:func:`lent_connection`).
On a pool the package opened (:func:`own_pool`: the worker's, and the one
``make_worker_utils`` opens), the connection goes back reset: what the
borrower set (``SET``, ``SET ROLE``, ``SET SESSION AUTHORIZATION``, session
characteristics, a temporary table, a ``LISTEN``, a session advisory lock,
the connection's autocommit mode, row factory and other client settings) is
not seen by the next job, nor by the worker's own statements on the same
pool. That costs one round trip when the borrower is done; the package's own
uses of its pool (the worker's fetch, its result batches) pay nothing. A
connection whose reset fails is closed, and the pool replaces it. A pool
given to ``make_worker_utils(pool=...)`` and a connection given as
``connection=`` are the application's: they are left as they are.

``helpers.with_pg_client()`` and :meth:`WorkerUtils.holding_connection` take a
connection for their block and record it in a context variable; every call
through :func:`pool_connection` or :func:`lent_connection` on the same pool,
in the same asyncio task (or a task spawned from it), gets that connection
instead of a second one, and so joins any transaction open on it; it is reset
once, when the block ends. :func:`sync_holding_connection`,
:func:`sync_pool_connection` and :func:`sync_lent_connection` do the same for
a ``psycopg_pool.ConnectionPool`` (:meth:`SyncWorkerUtils.holding_connection`),
per thread.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from typing import Any, NamedTuple, TypeVar
from weakref import WeakSet

import psycopg
from psycopg import generators
from psycopg.pq import ExecStatus, TransactionStatus
from psycopg.pq.abc import PGresult
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from ..sql import sessions as sessions_sql
from .backoff import one_line

__all__ = [
    "holding_connection",
    "lent_connection",
    "own_pool",
    "pool_connection",
    "sync_holding_connection",
    "sync_lent_connection",
    "sync_pool_connection",
]

logger = logging.getLogger("graphile_worker")

P = TypeVar("P", AsyncConnectionPool[Any], ConnectionPool[Any])


def _check(results: list[PGresult]) -> None:
    """Raise the error of the reset, if a statement of it failed (the rest
    did not run)."""
    for result in results:
        if result.status not in (ExecStatus.COMMAND_OK, ExecStatus.TUPLES_OK):
            message = (result.error_message or b"").decode(errors="replace").strip()
            raise psycopg.OperationalError(message or f"the reset ended with {result.status!r}")


# Pools the package opened: their lent connections go back reset.
_owned: WeakSet[AsyncConnectionPool[Any] | ConnectionPool[Any]] = WeakSet()


def own_pool(pool: P) -> P:
    """Mark ``pool`` as opened by the package (its lent connections go back
    reset, see :func:`lent_connection`); returns it."""
    _owned.add(pool)
    return pool


class _Held:
    """A connection held by :func:`holding_connection`, with its pool, while the
    block runs. Tasks spawned inside the block inherit the context variable
    pointing here; once the block has ended (and the connection has gone back
    to the pool), ``active`` tells them not to use it."""

    __slots__ = ("active", "conn", "pool")

    def __init__(
        self,
        pool: AsyncConnectionPool[Any] | ConnectionPool[Any],
        conn: psycopg.AsyncConnection[Any] | psycopg.Connection[Any],
    ) -> None:
        self.pool = pool
        self.conn = conn
        self.active = True


#: The connection a task holds in ``helpers.with_pg_client()``.
_held_connection: ContextVar[_Held] = ContextVar("graphile_worker_held_connection")


class _Client(NamedTuple):
    """A connection's client-side settings when it was lent (the pool's)."""

    autocommit: bool
    isolation_level: psycopg.IsolationLevel | None
    read_only: bool | None
    deferrable: bool | None
    row_factory: Any
    cursor_factory: Any
    server_cursor_factory: Any
    prepare_threshold: int | None
    prepared_max: int | None

    @classmethod
    def of(cls, conn: psycopg.AsyncConnection[Any] | psycopg.Connection[Any]) -> _Client:
        return cls(
            conn.autocommit,
            conn.isolation_level,
            conn.read_only,
            conn.deferrable,
            conn.row_factory,
            conn.cursor_factory,
            conn.server_cursor_factory,
            conn.prepare_threshold,
            conn.prepared_max,
        )

    def restore_factories(
        self, conn: psycopg.AsyncConnection[Any] | psycopg.Connection[Any]
    ) -> None:
        """Put back what needs no transaction state (the rest: the facades)."""
        conn.row_factory = self.row_factory
        conn.cursor_factory = self.cursor_factory
        conn.server_cursor_factory = self.server_cursor_factory
        conn.prepare_threshold = self.prepare_threshold
        conn.prepared_max = self.prepared_max


def _warn_discarded(exc: BaseException) -> None:
    logger.warning(
        "A database connection lent to a task could not be reset; it is closed "
        "(the pool opens another): %s",
        one_line(exc),
    )


@asynccontextmanager
async def pool_connection(
    pool: AsyncConnectionPool[Any],
) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A connection from ``pool`` for the package's own statements; inside
    :func:`holding_connection` on the same pool (the same asyncio task), the
    connection held there. Taking a second one could wait forever: tasks
    holding connections can exhaust the pool."""
    held = _held_connection.get(None)
    if held is not None and held.active and held.pool is pool:
        assert isinstance(held.conn, psycopg.AsyncConnection)
        yield held.conn
        return
    async with pool.connection() as conn:
        yield conn


@asynccontextmanager
async def lent_connection(
    pool: AsyncConnectionPool[Any],
) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """:func:`pool_connection` for code that is not the package's: on a pool
    the package opened, the connection goes back to it reset (or closed, if
    the reset fails). As ``pool.connection()``, the block's transaction is
    committed, or rolled back if the block raises."""
    held = _held_connection.get(None)
    if held is not None and held.active and held.pool is pool:
        assert isinstance(held.conn, psycopg.AsyncConnection)
        yield held.conn
        return
    if pool not in _owned:
        async with pool.connection() as conn:
            yield conn
        return
    conn = await pool.getconn()
    client = _Client.of(conn)
    try:
        try:
            async with conn:  # commit, or roll back (a pool's connection stays open)
                yield conn
        finally:
            await _reset_async(conn, client)
    finally:
        await pool.putconn(conn)


async def reset_session(conn: psycopg.AsyncConnection[Any]) -> None:
    """Undo what a borrower left on ``conn``'s session
    (``sessions_sql.RESET_SESSION``), in one round trip; an error raises.
    Sent as it is, whatever the autocommit mode (a simple query of its own:
    its own implicit transaction): a cursor's execute costs a third more of
    the worker's time, for the same round trip."""
    async with conn.lock:
        conn.pgconn.send_query(sessions_sql.RESET_SESSION)
        results = await conn.wait(generators.execute(conn.pgconn))
    _check(results)


async def _reset_async(conn: psycopg.AsyncConnection[Any], client: _Client) -> None:
    if conn.closed:
        return  # the pool replaces it
    try:
        if conn.pgconn.transaction_status != TransactionStatus.IDLE:
            raise psycopg.InterfaceError("the connection is busy (a COPY or a query left running)")
        client.restore_factories(conn)
        if conn.autocommit != client.autocommit:
            await conn.set_autocommit(client.autocommit)
        if conn.isolation_level != client.isolation_level:
            await conn.set_isolation_level(client.isolation_level)
        if conn.read_only != client.read_only:
            await conn.set_read_only(client.read_only)
        if conn.deferrable != client.deferrable:
            await conn.set_deferrable(client.deferrable)
        await reset_session(conn)
    except BaseException as exc:
        await conn.close()
        if not isinstance(exc, Exception):
            raise  # cancelled while resetting: closed, never returned half reset
        _warn_discarded(exc)


@asynccontextmanager
async def holding_connection(
    pool: AsyncConnectionPool[Any],
) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A lent connection (:func:`lent_connection`) for the block, which
    :func:`pool_connection` and :func:`lent_connection` on this pool give to
    the calls inside it (so they also join any transaction open on it)."""
    async with lent_connection(pool) as conn:
        held = _Held(pool, conn)
        token = _held_connection.set(held)
        try:
            yield conn
        finally:
            held.active = False
            _held_connection.reset(token)


@contextmanager
def sync_pool_connection(pool: ConnectionPool[Any]) -> Iterator[psycopg.Connection[Any]]:
    """:func:`pool_connection` for a sync pool: inside
    :func:`sync_holding_connection` on the same pool (the same thread), the
    connection held there."""
    held = _held_connection.get(None)
    if held is not None and held.active and held.pool is pool:
        assert isinstance(held.conn, psycopg.Connection)
        yield held.conn
        return
    with pool.connection() as conn:
        yield conn


@contextmanager
def sync_lent_connection(pool: ConnectionPool[Any]) -> Iterator[psycopg.Connection[Any]]:
    """:func:`lent_connection` for a sync pool."""
    held = _held_connection.get(None)
    if held is not None and held.active and held.pool is pool:
        assert isinstance(held.conn, psycopg.Connection)
        yield held.conn
        return
    if pool not in _owned:
        with pool.connection() as conn:
            yield conn
        return
    conn = pool.getconn()
    client = _Client.of(conn)
    try:
        try:
            with conn:  # commit, or roll back (a pool's connection stays open)
                yield conn
        finally:
            _reset_sync(conn, client)
    finally:
        pool.putconn(conn)


def _reset_sync(conn: psycopg.Connection[Any], client: _Client) -> None:
    if conn.closed:
        return
    try:
        if conn.pgconn.transaction_status != TransactionStatus.IDLE:
            raise psycopg.InterfaceError("the connection is busy (a COPY or a query left running)")
        client.restore_factories(conn)
        conn.autocommit = client.autocommit
        conn.isolation_level = client.isolation_level
        conn.read_only = client.read_only
        conn.deferrable = client.deferrable
        with conn.lock:
            conn.pgconn.send_query(sessions_sql.RESET_SESSION)
            results = conn.wait(generators.execute(conn.pgconn))
        _check(results)
    except BaseException as exc:
        conn.close()
        if not isinstance(exc, Exception):
            raise
        _warn_discarded(exc)


@contextmanager
def sync_holding_connection(pool: ConnectionPool[Any]) -> Iterator[psycopg.Connection[Any]]:
    """:func:`holding_connection` for a sync pool."""
    with sync_lent_connection(pool) as conn:
        held = _Held(pool, conn)
        token = _held_connection.set(held)
        try:
            yield conn
        finally:
            held.active = False
            _held_connection.reset(token)
