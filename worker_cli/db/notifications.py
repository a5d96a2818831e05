"""Reading a LISTENing connection's notifications without polling.

``AsyncConnection.notifies()`` waits in steps of 0.1 s (psycopg wakes to
let a Ctrl-C through): a connection that only listens turns the event loop
ten times a second while nothing arrives. Every pool listens all day, so
:func:`notifications` waits for the socket instead: the loop wakes when
something arrives, and only then.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import psycopg

__all__ = ["notifications"]


async def notifications(conn: psycopg.AsyncConnection[Any]) -> AsyncIterator[psycopg.Notify]:
    """The notifications of ``conn`` (which has LISTENed) as they arrive; never
    ends by itself.

    First those psycopg kept aside (they arrived with the LISTENs' answers),
    then, each time the socket has something to read, what came
    (``notifies(timeout=0)`` reads without waiting). Readiness is
    level-triggered: a notification that arrives between a read and the wait
    wakes the wait at once. A lost connection is readable too, and reading it
    raises :class:`psycopg.OperationalError`, as ``notifies()`` does.
    """
    loop = asyncio.get_running_loop()
    fileno = conn.fileno()
    while True:
        async for notify in conn.notifies(timeout=0):
            yield notify
        readable: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fileno, _settle, readable)
        try:
            await readable
        finally:
            loop.remove_reader(fileno)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
