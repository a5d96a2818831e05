"""Running cron in a test: a fake clock, a pool with a crontab, the cron jobs it added."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from dbhelpers import rows, value
from psycopg_pool import AsyncConnectionPool

from worker_cli.worker.background.cron_scheduler import CronScheduler


class FakeClock:
    """Time moves only when the test says so; ``early`` makes the next sleep return at once."""

    def __init__(self, now: datetime) -> None:
        self.current = now
        self.early = 0
        self._moved = asyncio.Condition()
        self._wake_ups: list[datetime] = []  # one per sleeper: when it is to wake

    def now(self) -> datetime:
        return self.current

    async def sleep(self, seconds: float) -> None:
        if self.early:
            self.early -= 1
            await asyncio.sleep(0)
            return
        target = self.current + timedelta(seconds=seconds)
        async with self._moved:
            self._wake_ups.append(target)
            self._moved.notify_all()
            try:
                await self._moved.wait_for(lambda: self.current >= target)
            finally:
                self._wake_ups.remove(target)

    async def advance(self, delta: timedelta) -> None:
        async with self._moved:
            self.current += delta
            self._moved.notify_all()

    async def wait_for_sleepers(self, count: int) -> None:
        """Until ``count`` callers sleep until a later time (only ``advance`` wakes them)."""
        async with self._moved:
            await self._moved.wait_for(
                lambda: sum(t > self.current for t in self._wake_ups) >= count
            )


@pytest.fixture
async def pool(db: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    async with AsyncConnectionPool(db, min_size=1, max_size=4, kwargs={"autocommit": True}) as p:
        yield p


def cron_jobs(db: str) -> list[dict[str, Any]]:
    return rows(
        db,
        "select id, task_identifier as task, run_at, queue_name, max_attempts, priority, "
        "(select payload from graphile_worker._private_jobs p where p.id = j.id) as payload "
        "from graphile_worker.jobs j order by run_at, id",
    )


async def wait_for_jobs(db: str, count: int, within: float = 10) -> None:
    deadline = time.monotonic() + within
    while value(db, "select count(*) from graphile_worker._private_jobs") < count:
        assert time.monotonic() < deadline, f"expected {count} jobs, have {cron_jobs(db)}"
        await asyncio.sleep(0.02)


async def settle(clock: FakeClock, *schedulers: asyncio.Task[None], within: float = 10) -> None:
    """Until every scheduler has done all it will do (rightly or wrongly) at the clock's
    current time: each is then asleep on ``clock`` until a later time, and only
    ``clock.advance`` can make it act again."""
    try:
        async with asyncio.timeout(within):
            await clock.wait_for_sleepers(len(schedulers))
    except TimeoutError:
        stopped = [t.exception() for t in schedulers if t.done()]
        raise AssertionError(f"the schedulers did not settle; stopped: {stopped}") from None


def start(scheduler: CronScheduler) -> asyncio.Task[None]:
    return asyncio.create_task(scheduler.run())


async def stop(*tasks: asyncio.Task[None]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
