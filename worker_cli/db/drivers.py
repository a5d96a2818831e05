"""The two drivers that run plans (:mod:`worker_cli.db.plan`): the only I/O of WorkerUtils.

:func:`run_plan` runs a plan on a ``psycopg.Connection`` (blocking, no event
loop), :func:`run_plan_async` on a ``psycopg.AsyncConnection``. Both do the
same thing for each operation; they differ by ``await`` alone.

``joined=True`` marks the caller's own connection (``connection=``): its
transaction is joined, never committed or rolled back (a plan's transaction is
a savepoint inside it), its autocommit mode is never changed, and each cursor
reads the columns the package decodes with psycopg's own loaders, whatever
loaders the application registered on the connection (Django, for example,
loads ``jsonb`` as text and, without ``USE_TZ``, timestamps as naive ones).
Every cursor returns tuples, whatever the connection's row factory.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar, cast

import psycopg
from psycopg.abc import AdaptContext
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row
from psycopg.types.datetime import TimestamptzBinaryLoader, TimestamptzLoader
from psycopg.types.json import JsonbBinaryLoader, JsonbLoader

from ..sql import sessions as sessions_sql
from .plan import Fetch, Op, Plan, Query, Send, Sent, ServerVersion, Transaction
from .raw_json import read_payloads_raw
from .timestamps import read_timestamps_leniently

__all__ = ["autocommit_mode", "autocommit_mode_async", "run_plan", "run_plan_async"]

logger = logging.getLogger("graphile_worker")

T = TypeVar("T")

# Undo the block (the savepoint is released too, as psycopg does).
_ROLL_BACK_SAVEPOINT = (sessions_sql.ROLLBACK_TO_SAVEPOINT, sessions_sql.RELEASE_SAVEPOINT)

_IDLE = TransactionStatus.IDLE
_INERROR = TransactionStatus.INERROR


def run_plan(conn: psycopg.Connection[Any], plan: Plan[T], *, joined: bool = False) -> T:
    """Run ``plan`` on ``conn`` until it returns; its result."""
    result: Any = None
    error: Exception | None = None
    try:
        while True:
            try:
                op = plan.send(result) if error is None else plan.throw(error)
            except StopIteration as stop:
                return cast(T, stop.value)
            result = error = None
            try:
                result = _perform(conn, op, joined)
            except Exception as exc:  # raised in the plan, at its yield
                error = exc
    finally:
        plan.close()


async def run_plan_async(
    conn: psycopg.AsyncConnection[Any], plan: Plan[T], *, joined: bool = False
) -> T:
    """Run ``plan`` on ``conn`` until it returns; its result."""
    result: Any = None
    error: Exception | None = None
    try:
        while True:
            try:
                op = plan.send(result) if error is None else plan.throw(error)
            except StopIteration as stop:
                return cast(T, stop.value)
            result = error = None
            try:
                result = await _perform_async(conn, op, joined)
            except Exception as exc:  # raised in the plan, at its yield
                error = exc
    finally:
        plan.close()


def _perform(conn: psycopg.Connection[Any], op: Op, joined: bool) -> Any:
    if isinstance(op, Query):
        cur = _cursor(conn, op, joined)
        cur.execute(op.statement, op.params)
        return cur.fetchall() if op.rows else []
    if isinstance(op, Send):
        cur = _cursor(conn, op.query, joined)
        cur.execute(op.query.statement, op.query.params)
        return _SentCursor(cur)
    if isinstance(op, Fetch):
        return cast(_SentCursor, op.sent).cursor.fetchall()
    if isinstance(op, Transaction):
        with _transaction(conn, op, joined):
            if op.pipeline:
                with conn.pipeline():
                    return run_plan(conn, op.plan, joined=joined)
            return run_plan(conn, op.plan, joined=joined)
    if isinstance(op, ServerVersion):
        return conn.info.server_version
    raise TypeError(f"not a plan operation: {op!r}")  # pragma: no cover


async def _perform_async(conn: psycopg.AsyncConnection[Any], op: Op, joined: bool) -> Any:
    if isinstance(op, Query):
        cur = _cursor(conn, op, joined)
        await cur.execute(op.statement, op.params)
        return await cur.fetchall() if op.rows else []
    if isinstance(op, Send):
        cur = _cursor(conn, op.query, joined)
        await cur.execute(op.query.statement, op.query.params)
        return _SentCursor(cur)
    if isinstance(op, Fetch):
        return await cast(_SentCursor, op.sent).cursor.fetchall()
    if isinstance(op, Transaction):
        async with _transaction_async(conn, op, joined):
            if op.pipeline:
                async with conn.pipeline():
                    return await run_plan_async(conn, op.plan, joined=joined)
            return await run_plan_async(conn, op.plan, joined=joined)
    if isinstance(op, ServerVersion):
        return conn.info.server_version
    raise TypeError(f"not a plan operation: {op!r}")  # pragma: no cover


class _SentCursor(Sent):
    """What :class:`~worker_cli.db.plan.Send` gives a plan: the cursor to fetch from."""

    __slots__ = ("cursor",)

    def __init__(self, cursor: Any) -> None:
        self.cursor = cursor


def _cursor(conn: Any, query: Query, joined: bool) -> Any:
    """A cursor returning tuples, loading what the plans decode as they expect."""
    cur = conn.cursor(row_factory=tuple_row)
    if joined:
        _use_default_loaders(cur)
    if query.raw_payloads:
        read_payloads_raw(cur)
    if query.lenient_times:
        read_timestamps_leniently(cur)
    return cur


def _use_default_loaders(context: AdaptContext) -> None:
    """psycopg's own loaders for the types the plans decode (besides ``json``,
    see :func:`~worker_cli.db.raw_json.read_payloads_raw`), over any the caller's
    connection registered."""
    adapters = context.adapters
    adapters.register_loader("timestamptz", TimestamptzLoader)
    adapters.register_loader("timestamptz", TimestamptzBinaryLoader)
    adapters.register_loader("jsonb", JsonbLoader)
    adapters.register_loader("jsonb", JsonbBinaryLoader)


def _plain(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], op: Transaction) -> bool:
    """Whether ``op`` needs nothing around it: autocommit, no transaction open,
    and only an open transaction was to be protected."""
    return op.only_if_open and conn.autocommit and conn.info.transaction_status == _IDLE


def _savepoint_needed(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], joined: bool
) -> bool:
    """Whether a transaction on the caller's connection must be our savepoint
    (psycopg's ``transaction()`` would commit one it opened itself)."""
    return joined and (not conn.autocommit or conn.info.transaction_status != _IDLE)


def _undo_if_failed(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
) -> tuple[str, ...]:
    """How a savepoint block that ended without an error ends: released, or
    rolled back if a statement failed in it (the plan caught the error)."""
    if conn.info.transaction_status == _INERROR:
        return _ROLL_BACK_SAVEPOINT
    return (sessions_sql.RELEASE_SAVEPOINT,)


@contextmanager
def _transaction(conn: psycopg.Connection[Any], op: Transaction, joined: bool) -> Iterator[None]:
    if _plain(conn, op):
        yield
    elif _savepoint_needed(conn, joined):
        conn.execute(sessions_sql.SAVEPOINT)
        try:
            yield
        except BaseException:
            try:
                for statement in _ROLL_BACK_SAVEPOINT:
                    conn.execute(statement)
            except Exception as exc:  # the block's error matters more
                logger.warning("could not roll back to the savepoint: %s", exc)
            raise
        for statement in _undo_if_failed(conn):
            conn.execute(statement)
    else:
        with conn.transaction():
            yield
            if conn.info.transaction_status == _INERROR:
                raise psycopg.Rollback  # an error the plan caught: undo the block


@asynccontextmanager
async def _transaction_async(
    conn: psycopg.AsyncConnection[Any], op: Transaction, joined: bool
) -> AsyncIterator[None]:
    if _plain(conn, op):
        yield
    elif _savepoint_needed(conn, joined):
        await conn.execute(sessions_sql.SAVEPOINT)
        try:
            yield
        except BaseException:
            try:
                for statement in _ROLL_BACK_SAVEPOINT:
                    await conn.execute(statement)
            except Exception as exc:  # the block's error matters more
                logger.warning("could not roll back to the savepoint: %s", exc)
            raise
        for statement in _undo_if_failed(conn):
            await conn.execute(statement)
    else:
        async with conn.transaction():
            yield
            if conn.info.transaction_status == _INERROR:
                raise psycopg.Rollback  # an error the plan caught: undo the block


@contextmanager
def autocommit_mode(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """The block runs a connection of the package's own pool in autocommit
    mode; its previous mode is restored after, so it goes back to the pool as
    it came. Never used on the caller's connection."""
    previous = conn.autocommit
    if not previous:
        conn.set_autocommit(True)
    try:
        yield
    finally:
        if conn.autocommit != previous and not conn.closed and not conn.broken:
            conn.set_autocommit(previous)


@asynccontextmanager
async def autocommit_mode_async(conn: psycopg.AsyncConnection[Any]) -> AsyncIterator[None]:
    """:func:`autocommit_mode` for an ``AsyncConnection`` (the worker's pool is in
    autocommit mode already, an application's may not be)."""
    previous = conn.autocommit
    if not previous:
        await conn.set_autocommit(True)
    try:
        yield
    finally:
        if conn.autocommit != previous and not conn.closed and not conn.broken:
            await conn.set_autocommit(previous)
