"""The connection a block holds, which the pool's calls inside the block use too.

``helpers.with_pg_client()`` and :meth:`WorkerUtils.holding_connection` take a
connection for their block and record it in a context variable; every call
through :func:`pool_connection` on the same pool, in the same asyncio task (or
a task spawned from it), gets that connection instead of a second one, and so
joins any transaction open on it. :func:`sync_holding_connection` and
:func:`sync_pool_connection` do the same for a ``psycopg_pool.ConnectionPool``
(:meth:`SyncWorkerUtils.holding_connection`), per thread.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

__all__ = [
    "holding_connection",
    "pool_connection",
    "sync_holding_connection",
    "sync_pool_connection",
]


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


@asynccontextmanager
async def pool_connection(
    pool: AsyncConnectionPool[Any],
) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A connection from ``pool``; inside :func:`holding_connection` on the same
    pool (the same asyncio task), the connection held there. Taking a second
    one could wait forever: tasks holding connections can exhaust the pool."""
    held = _held_connection.get(None)
    if held is not None and held.active and held.pool is pool:
        assert isinstance(held.conn, psycopg.AsyncConnection)
        yield held.conn
        return
    async with pool.connection() as conn:
        yield conn


@asynccontextmanager
async def holding_connection(
    pool: AsyncConnectionPool[Any],
) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A connection for the block, which :func:`pool_connection` on this pool
    gives to the calls inside it (so they also join any transaction open on it)."""
    async with pool_connection(pool) as conn:
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
def sync_holding_connection(pool: ConnectionPool[Any]) -> Iterator[psycopg.Connection[Any]]:
    """:func:`holding_connection` for a sync pool."""
    with sync_pool_connection(pool) as conn:
        held = _Held(pool, conn)
        token = _held_connection.set(held)
        try:
            yield conn
        finally:
            held.active = False
            _held_connection.reset(token)
