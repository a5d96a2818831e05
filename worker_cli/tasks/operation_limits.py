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
block is not entered: :class:`~worker_cli.tasks.retry.Snooze` is raised, so
the job runs again when the limit may let it (no attempt spent), from the
start of the task. A plain ``def`` task uses ``with`` instead of ``async
with``. The slot is held by the job (its id) until the block ends, or until
the job's worker is declared dead.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ..schema import limits, statements
from .retry import Snooze

if TYPE_CHECKING:
    from ..jobs.worker_utils import WorkerUtils

__all__ = ["OperationLimit"]


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
    ) -> None:
        if not isinstance(name, str) or not 1 <= len(name) <= 128:
            raise ValueError(f"helpers.limit: the name is {name!r}; give 1 to 128 characters")
        self._utils = utils
        self._loop = loop
        self._params = {
            "name": name,
            "partition": None if partition is None else str(partition),
            "holder": holder,
        }

    async def __aenter__(self) -> None:
        statement = statements.compose(limits.acquire, self._utils.schema)
        async with self._utils.pool.connection() as conn:  # its own: committed at once
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
        statement = statements.compose(limits.release, self._utils.schema)
        async with self._utils.pool.connection() as conn:  # its own: committed at once
            await conn.execute(statement, self._params)

    def __enter__(self) -> None:
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
