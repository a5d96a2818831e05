"""``helpers.limit(name, partition=None)``: limit an operation inside a task.

A task that calls a payment API in its body limits the *calls*, not only
its jobs::

    async def task(payload, helpers):
        async with helpers.limit("stripe", partition=payload["account_id"]):
            await charge(payload)

The limit is stored like any other (``set_limit(Limit(...),
operation="stripe")``): at most ``max_running`` jobs inside the block at
once, and at most ``max_starts`` entries in any window of ``per``, across
every Python worker (per ``partition`` value). When the limit is full, the
block is not entered: :class:`~worker_cli.tasks.retry_policy.Snooze` is raised, so
the job runs again when the limit may let it (no attempt spent), from the
start of the task. A plain ``def`` task uses ``with`` instead of ``async
with`` (in an ``async def`` task that form would wait for the event loop on
the loop's own thread: it raises at once instead). The slot is held by the
job (its id) until the block ends, or until the job's worker is declared
dead. Blocks of one operation and partition nested in one job (a task's
block around a client that takes the same limit) hold one slot and count
one start: the outermost block takes it and releases it.

The partition is ``str(partition)``; the database keys a long one by its
start and a hash (``py_limit_key``), and one PostgreSQL cannot hold as text
(a NUL, a lone surrogate) by a hash of it, so any value has its own partition.
"""

from __future__ import annotations

import asyncio
import hashlib
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError
from ..sql import compose
from ..sql import limits as limits_sql
from .retry_policy import Snooze

if TYPE_CHECKING:
    import psycopg

    from ..client.worker_utils import WorkerUtils

__all__ = ["Holds", "OperationLimit", "partition_key", "refuse_on_loop"]

#: The marker of a hashed partition key (``py_limit_key`` in
#: migrations/py/000020.sql).
_HASHED = "...sha256:"


def partition_key(partition: Any) -> str | None:
    """The partition as sent to the database: ``str(partition)``, or, when
    PostgreSQL cannot hold that as text (a NUL, a lone surrogate), the marker
    and the SHA-256 of its UTF-8 (surrogates passed through); the database
    hashes that again, as any value holding the marker."""
    if partition is None:
        return None
    text = str(partition)
    try:
        text.encode("utf-8")  # a lone surrogate raises
    except UnicodeEncodeError:
        pass
    else:
        if "\x00" not in text:
            return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{_HASHED}{digest}"


def refuse_on_loop(loop: asyncio.AbstractEventLoop, message: str) -> None:
    """Raise ``RuntimeError(message)`` when called on ``loop``'s own thread
    while it runs: waiting there for the loop would wait for ever."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        return
    if running is loop:
        raise RuntimeError(message)


@dataclass
class Holds:
    """One job's holds of operation limits: how many blocks of each
    (name, partition) are open, and a lock per key that orders its takes and
    releases (all on the event loop)."""

    depth: dict[tuple[str, str | None], int] = field(default_factory=dict)
    locks: dict[tuple[str, str | None], asyncio.Lock] = field(default_factory=dict)


class OperationLimit:
    """The block of one job under an operation limit (see the module)."""

    def __init__(
        self,
        utils: WorkerUtils,
        loop: asyncio.AbstractEventLoop,
        *,
        name: str,
        partition: Any,
        holder: int,
        holds: Holds | None = None,
    ) -> None:
        if not isinstance(name, str) or not 1 <= len(name) <= 128:
            raise ValueError(f"helpers.limit: the name is {name!r}; give 1 to 128 characters")
        self._utils = utils
        self._loop = loop
        key = partition_key(partition)
        self._params = {"name": name, "partition": key, "holder": holder}
        self._key = (name, key)
        self._holds = holds if holds is not None else Holds()

    async def __aenter__(self) -> None:
        holds, key = self._holds, self._key
        lock = holds.locks.setdefault(key, asyncio.Lock())
        async with lock:
            depth = holds.depth.get(key, 0)
            if depth == 0:
                await self._acquire()
            holds.depth[key] = depth + 1

    def _own_connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        """A connection of the slot's own, committed at once: one of the
        worker's pool. Under the testing helpers (``run_jobs``: utilities on
        one given connection) that connection, which commits at once on its
        own session and joins the caller's transaction on a caller's."""
        try:
            pool = self._utils.pool
        except ConfigurationError:
            return self._utils.connection()
        return pool.connection()

    async def _acquire(self) -> None:
        statement = compose(limits_sql.ACQUIRE_OPERATION, self._utils.schema)
        async with self._own_connection() as conn:
            cur = await conn.execute(statement, self._params)
            row = await cur.fetchone()
        wait = None if row is None else row[0]
        if wait is None:
            return
        name = self._params["name"]
        if wait < 0:
            raise LookupError(
                f"helpers.limit: no limit named {name!r}; set one with "
                f"set_limit(Limit(...), operation={name!r})"
            )
        raise Snooze(max(wait, 0.001))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        holds, key = self._holds, self._key
        async with holds.locks[key]:
            depth = holds.depth.pop(key) - 1
            if depth:
                holds.depth[key] = depth
                return
            statement = compose(limits_sql.RELEASE_OPERATION, self._utils.schema)
            async with self._own_connection() as conn:
                await conn.execute(statement, self._params)

    def __enter__(self) -> None:
        refuse_on_loop(
            self._loop,
            "helpers.limit: 'with helpers.limit(...)' waits for the worker's event loop, "
            "and this is that loop's own thread (an async def task); "
            "write 'async with helpers.limit(...)'",
        )
        asyncio.run_coroutine_threadsafe(self.__aenter__(), self._loop).result()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        asyncio.run_coroutine_threadsafe(
            self.__aexit__(exc_type, exc, traceback), self._loop
        ).result()
