"""The wait loop of ``wait_for_job`` on asyncio: :func:`wait_async`.

LISTEN, register, read; then read again on each notification naming the job,
at each safety poll and after the listener reconnects (the rules, the
decisions of a wait and both listeners: :mod:`.job_waiting`).
:mod:`.sync_waiting` (``wait_blocking``) is generated from
:mod:`.async_waiting` by ``tools/async_to_sync.py``.
"""

from __future__ import annotations

import asyncio  # async-only
import logging
from contextlib import suppress
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from ..db.backoff import one_line
from ..db.drivers import autocommit_mode_async, run_plan_async
from ..jobs.job_state import JobResult
from .job_waiting import AsyncWaitListener, Waiting
from .utils_plans import UtilsPlans

__all__ = ["AsyncWaitListener", "wait_async"]

logger = logging.getLogger("graphile_worker")


async def wait_async(
    pool: AsyncConnectionPool[Any],
    plans: UtilsPlans,
    listener: AsyncWaitListener,
    waiting: Waiting,
) -> JobResult:
    """``WorkerUtils.wait_for_job``: LISTEN, register, read; then read again
    on each notification naming the job, and at each safety poll. The
    listener serves every waiter of one utilities object."""
    job_id = waiting.job_id
    async with listener.watch(job_id) as wake:
        await listener.ready(waiting.remaining())
        registered = False
        while True:
            wake.clear()  # before reading: a notification from now on wakes the wait
            record = None
            try:
                async with (
                    pool.connection(waiting.read_timeout()) as conn,
                    autocommit_mode_async(conn),
                ):
                    plan = plans.wait_step(job_id, register=not registered)
                    registered, record = await run_plan_async(conn, plan)
            except psycopg.OperationalError as exc:  # an outage: read again later
                logger.debug("Waiting for job %d: could not read it: %s", job_id, one_line(exc))
            decision = waiting.next(record)
            if isinstance(decision, JobResult):
                return decision
            with suppress(TimeoutError):  # sync: wake.wait(decision)
                await asyncio.wait_for(wake.wait(), decision)  # async-only
