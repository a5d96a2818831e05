"""Helpers for tests that run workers in-process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from worker_cli import Runner, run
from worker_cli.observe.events import Events


class Recorder:
    """Collects events with the time they happened."""

    def __init__(self, events: Events, *names: str) -> None:
        self.seen: list[tuple[str, float, dict[str, Any]]] = []
        self._changed = asyncio.Event()
        for name in names:
            events.on(name, self._record)

    def _record(self, data: dict[str, Any]) -> None:
        self.seen.append((data["event"], time.monotonic(), data))
        self._changed.set()

    def of(self, name: str) -> list[dict[str, Any]]:
        return [data for event, _, data in self.seen if event == name]

    async def wait_for(self, name: str, count: int = 1, within: float = 10.0) -> None:
        async with asyncio.timeout(within):
            while len(self.of(name)) < count:
                self._changed.clear()
                await self._changed.wait()


@asynccontextmanager
async def worker(db: str, tasks: dict[str, Any], **options: Any) -> AsyncIterator[Runner]:
    """A running worker for the duration of the block, stopped afterwards."""
    options.setdefault("no_handle_signals", True)
    runner = await run(db, task_list=tasks, **options)
    try:
        yield runner
    finally:
        await runner.stop()


async def until(condition: Any, within: float = 10.0, what: str = "the condition") -> None:
    """Poll ``condition()`` (a sync function, e.g. a database query) until true."""
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {within}s waiting for {what}"
        await asyncio.sleep(0.02)
