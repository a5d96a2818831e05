"""A job whose lock the pool lost while running it is not run a second time
at once when a fetch returns it (worker_cli/worker/pipeline/already_held.py).

The lock is lost here by hand, as a failover to an asynchronous standby that
had not received the fetch loses it (tests/system/test_failover.py), or another
pool declaring this one dead releases it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from dbhelpers import rows, value
from workers import until, worker

from worker_cli import Helpers, WorkerUtils

pytestmark = pytest.mark.db


async def test_a_running_job_fetched_again_is_not_run_twice(
    utils: WorkerUtils, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    starts: list[int] = []
    release = asyncio.Event()
    others: list[int] = []

    async def hold(payload: Any, helpers: Helpers) -> None:
        starts.append(helpers.job.id)
        await release.wait()

    async def other(payload: Any, helpers: Helpers) -> None:
        others.append(helpers.job.id)

    caplog.set_level(logging.WARNING, logger="graphile_worker")
    async with worker(db, {"hold": hold, "other": other}, concurrency=3) as runner:
        held = await utils.add_job("hold", {})
        await until(lambda: starts == [held.id], what="the job to start")
        # Its lock is lost: the row is free again, attempts left.
        rows(
            db,
            "update graphile_worker._private_jobs set locked_at = null, locked_by = null"
            " where id = %s returning 1",
            (held.id,),
        )
        nudge = await utils.add_job("other", {})  # its notification makes the pool fetch
        await until(lambda: others == [nudge.id], what="the other job to run")
        assert starts == [held.id]  # fetched again, not started again
        assert (
            value(
                db, "select locked_by from graphile_worker._private_jobs where id = %s", (held.id,)
            )
            == runner.pool.id
        )
        release.set()
        await until(
            lambda: value(db, "select count(*) from graphile_worker._private_jobs") == 0,
            what="the job to be written back",
        )
    assert starts == [held.id]
    assert f"fetched job(s) {held.id} again while running or queueing them" in caplog.text
