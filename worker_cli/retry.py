"""Retrying database work through an outage, with growing delays."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psycopg

__all__ = ["DELAYS", "retry_until_done"]

#: Seconds between attempts: the n-th failure waits DELAYS[n-1] (the last one repeats).
DELAYS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0)


async def retry_until_done(
    what: str,
    action: Callable[..., Awaitable[Any]],
    *args: Any,
    logger: logging.Logger,
    delays: Sequence[float] = DELAYS,
) -> None:
    """Run ``action(*args)`` until it succeeds; database errors are logged and retried.

    For work that must not be lost to a passing outage (recording job results,
    scheduling cron jobs). Cancelling the caller stops the retries.
    """
    for attempt in itertools.count(1):
        try:
            await action(*args)
            return
        except psycopg.Error as exc:
            delay = delays[min(attempt, len(delays)) - 1]
            logger.error(
                "Failed to %s (attempt %d, retrying in %.2fs): %s",
                what,
                attempt,
                delay,
                " ".join(str(exc).split()),
            )
            await asyncio.sleep(delay)
