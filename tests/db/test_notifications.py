"""A LISTENing connection's notifications (worker_cli/db/notifications.py):
what the pools' listener and ``wait_for_job``'s listener read.

Each notification arrives once, in order, whether it came with a statement's
answer (psycopg keeps it aside) or on its own; a lost connection raises; and
an idle listener does not turn the event loop: psycopg's ``notifies()``
wakes it ten times a second, which every idle pool of a fleet paid.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

import psycopg
import pytest

from worker_cli.db.notifications import notifications

pytestmark = pytest.mark.db

T = TypeVar("T")


class CountingSelector(selectors.DefaultSelector):
    """Counts the event loop's turns: each turn selects once."""

    turns = 0

    def select(self, timeout: float | None = None) -> list[Any]:
        self.turns += 1
        return super().select(timeout)


def run(coroutine: Coroutine[Any, Any, T], selector: selectors.BaseSelector | None = None) -> T:
    loop = asyncio.SelectorEventLoop(selector)
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.close()


async def listening(db: str) -> psycopg.AsyncConnection[Any]:
    conn = await psycopg.AsyncConnection.connect(db, autocommit=True)
    await conn.execute("listen news")
    return conn


def notify(db: str, *payloads: str) -> None:
    """Send ``payloads`` on ``news`` in one transaction (they arrive together)."""
    with psycopg.connect(db) as sender:
        for payload in payloads:
            sender.execute("select pg_notify('news', %s)", (payload,))


def test_each_notification_arrives_once_in_order(db: str) -> None:
    async def main() -> list[str]:
        conn = await listening(db)
        async with conn:
            # Arrives with the next statement's answer: psycopg keeps it aside.
            await asyncio.to_thread(notify, db, "early")
            await conn.execute("select 1")
            received: list[str] = []
            reading = notifications(conn)
            received.append((await anext(reading)).payload)
            # Several in one packet, then one on its own while we wait.
            await asyncio.to_thread(notify, db, "a", "b", "c")
            for _ in range(3):
                received.append((await anext(reading)).payload)
            sending = asyncio.create_task(asyncio.to_thread(notify, db, "late"))
            received.append((await asyncio.wait_for(anext(reading), 10)).payload)
            await sending
            await reading.aclose()
            return received

    assert run(main()) == ["early", "a", "b", "c", "late"]


def test_a_lost_connection_raises(db: str) -> None:
    async def main() -> None:
        conn = await listening(db)
        async with conn:
            pid = conn.info.backend_pid
            reading = notifications(conn)
            waiting = asyncio.ensure_future(anext(reading))
            await asyncio.sleep(0.05)
            assert not waiting.done()
            with psycopg.connect(db, autocommit=True) as admin:
                admin.execute("select pg_terminate_backend(%s)", (pid,))
            with pytest.raises(psycopg.OperationalError):
                await asyncio.wait_for(waiting, 10)

    run(main())


def test_an_idle_listener_does_not_turn_the_loop(db: str) -> None:
    """Over a second with nothing arriving, the loop turns a few times (the
    test's own sleep), not ten times more (psycopg's 0.1 s steps)."""
    selector = CountingSelector()

    async def main() -> int:
        conn = await listening(db)
        async with conn:
            reading = asyncio.ensure_future(anext(notifications(conn)))
            await asyncio.sleep(0.05)  # waiting
            before = selector.turns
            await asyncio.sleep(1.0)
            turns = selector.turns - before
            assert not reading.done()
            reading.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reading
            return turns

    assert run(main(), selector) <= 3
