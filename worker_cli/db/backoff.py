"""One backoff policy for every loop that retries database work.

A loop counts its consecutive failures and asks its :class:`Backoff` how long
to wait before the next attempt; a success resets the count. The fetcher, the
completer (through :func:`retry_until_done`), the listener, the heartbeat and
cron all wait this way, each with the delays that suit what it retries.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psycopg

__all__ = ["CRON", "DEFAULT", "RECONNECT", "Backoff", "one_line", "retry_until_done"]


@dataclass(frozen=True)
class Backoff:
    """Growing delays: the n-th consecutive failure waits ``delays[n-1]``
    seconds (the last delay repeats), scaled by a random factor within
    ``1 ± jitter`` so that many workers cut off at once do not come back at
    the same instant."""

    delays: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
    jitter: float = 0.0

    def delay(self, failures: int) -> float:
        """Seconds to wait after ``failures`` consecutive failures (at least 1)."""
        base = self.delays[min(max(failures, 1), len(self.delays)) - 1]
        if self.jitter:
            base *= 1 + self.jitter * (2 * random.random() - 1)
        return base


#: Fetching, writing results, heartbeats: short outages are the common case.
DEFAULT = Backoff()
#: Re-opening the LISTEN connection: up to 30 s, spread out.
RECONNECT = Backoff((0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0), jitter=0.5)
#: Scheduling cron jobs: a minute has time.
CRON = Backoff((0.5, 1.0, 2.0, 5.0, 10.0, 30.0))


def one_line(error: BaseException) -> str:
    """An error's message on one line (for log lines); never raises."""
    try:
        text = str(error)
    except Exception:
        text = ""
    return " ".join(text.split()) or type(error).__name__


async def retry_until_done(
    what: str,
    action: Callable[..., Awaitable[Any]],
    *args: Any,
    logger: logging.Logger,
    backoff: Backoff = DEFAULT,
) -> None:
    """Run ``action(*args)`` until it succeeds; database errors are logged and retried.

    For work that must not be lost to a passing outage (recording job results,
    scheduling cron jobs). Cancelling the caller stops the retries.
    """
    for failures in itertools.count(1):
        try:
            await action(*args)
            return
        except psycopg.Error as exc:
            delay = backoff.delay(failures)
            logger.error(
                "Failed to %s (attempt %d, retrying in %.2fs): %s",
                what,
                failures,
                delay,
                one_line(exc),
            )
            await asyncio.sleep(delay)
