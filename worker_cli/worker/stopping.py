"""Waiting during a shutdown, bounded once the stop is forced."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from ..config.options import WorkerOptions

if TYPE_CHECKING:
    from .pipeline.slots import Slots

__all__ = [
    "cancel_and_wait",
    "log_stuck",
    "log_unwritten",
    "report_left_behind",
    "wait_for_running",
    "wait_until_forced",
]

logger = logging.getLogger("graphile_worker")

#: Seconds an ``async def`` job may run on after its ``abort_signal`` is set,
#: before the graceful stop cancels it and gives it back.
ABORT_GRACE = 1.0


async def wait_until_forced(
    awaitable: asyncio.Future[Any], forced: asyncio.Event, *, within: float | None = None
) -> bool:
    """Wait until ``awaitable`` is done, ``forced`` is set or ``within``
    seconds have passed, whichever comes first; True if it is done."""
    forced_wait = asyncio.ensure_future(forced.wait())
    try:
        await asyncio.wait(
            {awaitable, forced_wait}, timeout=within, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        forced_wait.cancel()
    return awaitable.done()


async def wait_for_running(
    slots: Slots,
    tasks: Sequence[asyncio.Task[None]],
    forced: asyncio.Event,
    graceful_timeout: float,
    pool_id: str,
) -> None:
    """Let the running jobs finish (``tasks`` are the slots'); after
    ``graceful_timeout`` set their ``abort_signal``, and :data:`ABORT_GRACE`
    later cancel the ``async def`` ones still running and give them back
    (:meth:`Slots.return_running`); once ``forced`` is set they are failed
    (:meth:`Slots.fail_running`)."""
    all_slots: asyncio.Future[Any] = asyncio.gather(*tasks)
    if slots.running:
        done = await wait_until_forced(all_slots, forced, within=graceful_timeout)
        if not done and not forced.is_set():
            logger.warning(
                "Worker pool %s: %d job(s) still running after %.1fs; setting their abort_signal",
                pool_id,
                slots.running,
                graceful_timeout,
            )
            slots.abort.set()
            done = await wait_until_forced(all_slots, forced, within=ABORT_GRACE)
            if not done and not forced.is_set() and (count := slots.return_running()):
                logger.warning(
                    "Worker pool %s: cancelled %d async job(s) still running %.0fs after their "
                    "abort_signal; they are given back and run again",
                    pool_id,
                    count,
                    ABORT_GRACE,
                )
            await wait_until_forced(all_slots, forced)
        if forced.is_set():
            slots.fail_running()
    await all_slots


async def finish(
    tasks: Sequence[asyncio.Future[None]], forced: asyncio.Event, deadline: Callable[[], float]
) -> None:
    """Wait for ``tasks``; once a forced stop has begun (``forced``), only
    until ``deadline()`` (the loop's time), then cancel what is left (the
    database may be unreachable). Raises the first error of a task."""
    pending = [task for task in tasks if not task.done()]
    if pending:
        gathered = asyncio.gather(*pending, return_exceptions=True)
        if not await wait_until_forced(gathered, forced):
            remaining = deadline() - asyncio.get_running_loop().time()
            await asyncio.wait({gathered}, timeout=max(0.0, remaining))
        for task in pending:
            if not task.done():
                await cancel_and_wait(task)
    for task in tasks:
        if task.done() and not task.cancelled():
            task.result()  # raise its error


async def cancel_and_wait(task: asyncio.Future[Any], within: float = 2.0) -> None:
    """Cancel ``task`` and wait for it to end, cancelling again while it resists
    (psycopg answers a first cancellation by asking the server to cancel the
    query, and waits for that). Gives up after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not task.done():
        task.cancel()
        remaining = deadline - loop.time()
        if remaining <= 0:
            logger.warning("A shutdown step did not end when cancelled; left behind")
            return
        await asyncio.wait({task}, timeout=min(0.1, remaining))


def _released(pool_id: str, options: WorkerOptions) -> str:
    """When the jobs a stopped pool still holds are released."""
    return (
        f"once another worker declares this pool dead ({options.heartbeat_timeout:g}s "
        "after its last heartbeat)"
        if options.heartbeat_interval
        else "by force_unlock_workers(['" + pool_id + "']) or the 4-hour stale-lock sweep"
    )


def report_left_behind(
    pool_id: str,
    held: Collection[int],
    stuck_ids: Collection[int],
    lost_fetch: bool,
    options: WorkerOptions,
) -> list[int]:
    """As a pool closes: log the jobs it still holds, those left locked for
    being stuck (on_stuck="exit") apart; returns the others' ids (sorted)."""
    stuck = set(held).intersection(stuck_ids)
    if stuck:
        log_stuck(pool_id, sorted(stuck), options)
    unwritten = sorted(set(held) - stuck)
    if unwritten or lost_fetch:
        log_unwritten(pool_id, unwritten, lost_fetch, options)
    return unwritten


def log_stuck(pool_id: str, job_ids: Sequence[int], options: WorkerOptions) -> None:
    """After a stop for stuck jobs (on_stuck="exit"): they stay locked."""
    logger.warning(
        "Worker pool %s: stopped for job(s) stuck past their timeout (ids: %s), left locked "
        "by this pool: they run again %s, when this process (and their thread) is gone",
        pool_id,
        ", ".join(map(str, job_ids)),
        _released(pool_id, options),
    )


def log_unwritten(
    pool_id: str, job_ids: Sequence[int], lost_fetch: bool, options: WorkerOptions
) -> None:
    """After a forced stop: name the jobs whose results (or return) could not
    be written; they stay locked by the pool until released."""
    release = _released(pool_id, options)
    lost = (
        "; a fetch was interrupted too, and the jobs it may have locked stay locked as well"
        if lost_fetch
        else ""
    )
    logger.error(
        "Worker pool %s: stopped without writing back %d job(s) (ids: %s)%s. Unless a "
        "write still in flight lands, they stay locked by this pool and will run again "
        "%s: a job runs at least once, and these may already have run.",
        pool_id,
        len(job_ids),
        ", ".join(map(str, job_ids)) or "none",
        lost,
        release,
    )
