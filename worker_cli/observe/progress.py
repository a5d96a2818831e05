"""The progress line of a worker draining its queue (``--once``).

Every ``interval`` seconds: jobs this pool has run to an outcome, the rate
over the last interval, and the due jobs of its tasks still waiting (one
``count(*)`` on the jobs' main index, capped at :data:`REMAINING_CAP` rows so
a huge queue costs at most that much per line). When the pool ends, a last
line gives the total and the average rate. A pool that drained its queue
ends with one more line when pauses hold due jobs of its tasks
(:func:`log_held_by_pauses`): "Done: 0 jobs" alone would not say why they
did not run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from ..sql import compose
from ..sql import status as status_sql

if TYPE_CHECKING:
    from .pool_view import ObservedPool

__all__ = ["REMAINING_CAP", "ProgressReporter", "log_held_by_pauses"]

logger = logging.getLogger("graphile_worker.progress")

#: The remaining count stops at this many jobs ("1,000,000+ remaining").
REMAINING_CAP = 1_000_000


class ProgressReporter:
    """Logs the progress of ``pool`` every ``interval`` seconds until :meth:`finish`."""

    def __init__(self, pool: ObservedPool, interval: float) -> None:
        self.pool = pool
        self.interval = interval
        self._started = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._started = time.monotonic()
        self._task = asyncio.create_task(self._loop(), name=f"{self.pool.id}-progress")

    def finish(self, pool_task: asyncio.Task[None] | None = None) -> None:
        """Stop reporting and log the total; a done callback of the pool's task
        (nothing is logged if that task failed: its error says enough)."""
        if self._task is not None:
            self._task.cancel()
        if pool_task is not None and (pool_task.cancelled() or pool_task.exception()):
            return
        elapsed = time.monotonic() - self._started
        done = self.pool.jobs_done
        logger.info(
            "Done: %s jobs in %.2fs (%s/s)",
            f"{done:,}",
            elapsed,
            _rate(done / elapsed if elapsed > 0 else 0.0),
            extra={
                "pool_id": self.pool.id,
                "jobs_done": done,
                "elapsed_s": round(elapsed, 3),
                "jobs_per_second": round(done / elapsed, 1) if elapsed > 0 else 0.0,
            },
        )

    async def _loop(self) -> None:
        last_at, last_done = self._started, 0
        while True:
            await asyncio.sleep(self.interval)
            if self.pool.utils is None:
                # Not running (still starting, or closed and about to log its
                # total): a line then would have nothing to count with.
                continue
            remaining = await self._remaining()
            now, done = time.monotonic(), self.pool.jobs_done
            rate = (done - last_done) / (now - last_at)
            last_at, last_done = now, done
            extra = {
                "pool_id": self.pool.id,
                "jobs_done": done,
                "jobs_per_second": round(rate, 1),
                "jobs_remaining": remaining,
            }
            if remaining is None:
                logger.info("Progress: %s jobs done (%s/s)", f"{done:,}", _rate(rate), extra=extra)
                continue
            shown = f"{REMAINING_CAP:,}+" if remaining >= REMAINING_CAP else f"{remaining:,}"
            logger.info(
                "Progress: %s jobs done (%s/s), %s remaining",
                f"{done:,}",
                _rate(rate),
                shown,
                extra=extra,
            )

    async def _remaining(self) -> int | None:
        """Due, unlocked jobs of the pool's tasks (None if the count failed)."""
        utils = self.pool.utils
        if utils is None:
            return None
        try:
            async with utils.pool.connection() as conn:
                cur = await conn.execute(
                    compose(status_sql.PROGRESS_REMAINING, self.pool.options.schema),
                    {"identifiers": list(self.pool.tasks), "cap": REMAINING_CAP},
                )
                row = await cur.fetchone()
        except psycopg.Error as exc:
            logger.warning("Progress: could not count the remaining jobs: %s", exc)
            return None
        return int(row[0]) if row else None


async def log_held_by_pauses(
    pool: AsyncConnectionPool[Any], schema: str, tasks: Sequence[str], pool_id: str
) -> None:
    """Log, as a warning, how many due jobs of ``tasks`` a pause holds and
    which pauses (nothing when none does; a failed count is logged and
    otherwise ignored)."""
    try:
        async with pool.connection() as conn:
            cur = await conn.execute(
                compose(status_sql.HELD_BY_PAUSES, schema), {"identifiers": list(tasks)}
            )
            held = [(str(by), int(jobs)) for by, jobs in await cur.fetchall()]
    except psycopg.Error as exc:
        logger.warning("Could not count the jobs held by pauses: %s", exc)
        return
    if not held:
        return
    total = sum(jobs for _by, jobs in held)
    logger.warning(
        "Left %s due job%s held by pauses: %s (they run once resumed: "
        "`graphile-worker pauses` lists them)",
        f"{total:,}",
        "" if total == 1 else "s",
        ", ".join(f"{by} ({jobs:,})" for by, jobs in held),
        extra={"pool_id": pool_id, "jobs_held": total, "held_by": dict(held)},
    )


def _rate(per_second: float) -> str:
    return f"{per_second:,.1f}" if per_second < 100 else f"{per_second:,.0f}"
