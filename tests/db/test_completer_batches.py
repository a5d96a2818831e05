"""The completer writes at most WRITE_AT_MOST results a statement, however
many came in while the previous batch was being written.

A fast drain can finish more than 1,000 jobs during one write. Written as one
batch, their successes made the history's expiry ledger refuse its row (1,000
ids at most), and the writer fell back to halving the batch: the whole batch's
work done, rolled back and done again. With a local queue of 1,000 that was a
third of a drain's PostgreSQL time (README, "Many named queues").
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from dbhelpers import rows, value
from psycopg_pool import AsyncConnectionPool

from worker_cli import WorkerUtils
from worker_cli.observe.events import Events
from worker_cli.worker.pipeline.completer import WRITE_AT_MOST, Completer
from worker_cli.worker.pipeline.outcome import Failure
from worker_cli.worker.pipeline.result_writer import HistorySettings
from worker_cli.worker.pool_state import PoolState

pytestmark = pytest.mark.db

POOL = "pool-batches"


@pytest.mark.parametrize("history", [False, True], ids=["history off", "history on"])
async def test_results_waiting_beyond_a_batch_are_written_in_bounded_batches(
    utils: WorkerUtils, db: str, history: bool
) -> None:
    specs: list[dict[str, Any]] = [{"identifier": "t", "payload": {"n": n}} for n in range(2_150)]
    jobs = await utils.add_jobs(specs)
    rows(
        db,
        "update graphile_worker._private_jobs set locked_by = %s, locked_at = now(),"
        " attempts = 1 returning 1",
        (POOL,),
    )
    settings = HistorySettings(keep_succeeded=timedelta(days=1)) if history else None
    async with AsyncConnectionPool(db, min_size=1, max_size=2, open=False) as pool:
        completer = Completer(
            pool,
            schema="graphile_worker",
            state=PoolState(POOL, Events(), held={job.id for job in jobs}),
            batch_delay=0.002,
            pool_idle=lambda: False,
            on_written=lambda: None,
            history=settings,
        )
        statements: list[int] = []
        write = completer.writer.write

        async def counted(succeeded: Any, failed: list[Failure]) -> None:
            statements.append(len(succeeded) + len(failed))
            await write(succeeded, failed)

        completer.writer.write = counted  # type: ignore[method-assign]
        # All of them came in while a batch was being written.
        for job in jobs[:2_000]:
            completer.succeeded(job, "worker-1")
        for job in jobs[2_000:]:
            completer.failed(Failure(job, "worker-1", RuntimeError("boom"), "boom"))
        completer.close()
        await completer.run()
    # Three statements, none refused and split.
    assert statements == [WRITE_AT_MOST, WRITE_AT_MOST, 150]
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 150  # to retry
    unlocked = "select count(*) from graphile_worker._private_jobs where locked_at is null"
    assert value(db, unlocked) == 150
    if history:
        assert value(db, "select count(*) from graphile_worker._private_py_job_history") == 2_000
        # Each statement's ledger row lists its 1,000 ids (8 kB), stored without
        # the compression PostgreSQL tries on values over 2 kB (py/000019.sql:
        # compressing each list cost a tenth of what history costs a drain).
        # (The stored size, not pg_column_compression: that needs PostgreSQL 14.)
        ledger = rows(
            db,
            "select cardinality(job_ids) as ids,"
            " pg_column_size(job_ids) >= 8 * cardinality(job_ids) as uncompressed"
            " from graphile_worker._private_py_job_history_expiry",
        )
        assert ledger == [{"ids": WRITE_AT_MOST, "uncompressed": True}] * 2
