"""A written success unlocks a named queue only for a job whose row the pool
still held.

After a failover to a standby that had not received a fetch, the pool may
write the success of a job whose row is free on the new primary, while it
holds the same named queue for another of its jobs (tests/system/test_failover.py,
asynchronous replication). Unlocking the queue then would let another job of
the queue start beside the one still running.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from dbhelpers import rows, value
from psycopg_pool import AsyncConnectionPool

from worker_cli import WorkerUtils
from worker_cli.worker.pipeline.result_writer import HistorySettings, ResultWriter

pytestmark = pytest.mark.db

POOL = "pool-holding-q"


def queue_holder(db: str) -> str | None:
    holder = value(db, "select locked_by from graphile_worker._private_job_queues")
    return None if holder is None else str(holder)


@pytest.mark.parametrize("history", [False, True], ids=["history off", "history on"])
async def test_a_success_unlocks_the_queue_only_of_a_job_the_pool_held(
    utils: WorkerUtils, db: str, history: bool
) -> None:
    running = await utils.add_job("t", {}, queue_name="q")  # the pool holds q for it
    lost = await utils.add_job("t", {}, queue_name="q")  # its fetch was lost: row free
    rows(
        db,
        "update graphile_worker._private_jobs set locked_by = %s, locked_at = now(),"
        " attempts = 1 where id = %s returning 1",
        (POOL, running.id),
    )
    rows(
        db,
        "update graphile_worker._private_job_queues set locked_by = %s, locked_at = now()"
        " returning 1",
        (POOL,),
    )
    settings = HistorySettings(keep_succeeded=timedelta(days=1)) if history else None
    async with AsyncConnectionPool(db, min_size=1, max_size=1, open=False) as pool:
        writer = ResultWriter(pool, schema="graphile_worker", pool_id=POOL, history=settings)
        await writer.write([(lost, "worker-1")], [])
        assert queue_holder(db) == POOL  # still held for the running job
        assert value(db, "select count(*) from graphile_worker._private_jobs") == 1
        await writer.write([(running, "worker-1")], [])
    assert queue_holder(db) is None
    if history:
        rows(db, "delete from graphile_worker._private_py_job_history_expiry returning 1")
        rows(db, "delete from graphile_worker._private_py_job_history returning 1")
