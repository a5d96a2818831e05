"""When the completer writes results at once instead of letting a batch grow."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from worker_cli.observe.events import Events
from worker_cli.worker.pipeline import completer as completer_module
from worker_cli.worker.pipeline.completer import WRITE_AT_MOST, Completer, write_now
from worker_cli.worker.pool_state import PoolState

pytestmark = pytest.mark.unit

BUSY = {"stopping": False, "named_queue_results": 0, "pool_idle": False, "pending": 5}


def test_a_busy_pool_lets_the_batch_grow() -> None:
    assert not write_now(**BUSY)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "change",
    [
        {"stopping": True},  # shutting down: nothing should wait
        {"named_queue_results": 1},  # the job's named queue stays locked until written
        {"pool_idle": True},  # nothing else will join the batch
        {"pending": WRITE_AT_MOST},  # a bounded statement, bounded loss in a crash
    ],
)
def test_each_reason_to_write_now(change: dict[str, object]) -> None:
    assert write_now(**{**BUSY, **change})  # type: ignore[arg-type]


def test_a_large_batch_is_written_only_from_the_limit() -> None:
    assert not write_now(**{**BUSY, "pending": WRITE_AT_MOST - 1})  # type: ignore[arg-type]


async def test_a_busy_batch_is_written_by_the_result_that_finds_it_old(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The batch's wait is ended by a result that comes after ``batch_delay``,
    not by a timer of its own (which would wake the event loop in the middle
    of the jobs' own waits); with no result, a timer ends it at twice the delay."""
    written: list[tuple[list[int], float]] = []
    wrote = asyncio.Event()

    async def write(succeeded: list[tuple[Any, str]], failed: list[Any]) -> None:
        written.append(([job.id for job, _ in succeeded], time.monotonic()))
        wrote.set()

    def completer_of(delay: float) -> Completer:
        completer = Completer(
            None,  # type: ignore[arg-type]  # (nothing reaches the database)
            schema="graphile_worker",
            state=PoolState("pool-rule", Events(), held=set()),
            batch_delay=delay,
            pool_idle=lambda: False,
            on_written=lambda: None,
        )
        completer.writer.write = write  # type: ignore[method-assign]
        return completer

    job = [SimpleNamespace(id=n, job_queue_id=None) for n in range(3)]
    # The batch's age on a clock of the test's (its timer, at twice a delay
    # of an hour, never fires here): a result ends the wait once it is old.
    now = [0.0]
    monkeypatch.setattr(completer_module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    completer = completer_of(3600.0)
    run = asyncio.create_task(completer.run())
    completer.succeeded(job[0], "w")  # type: ignore[arg-type]
    for _ in range(20):
        await asyncio.sleep(0)
    assert not written  # waiting for more
    now[0] = 3600.0  # past the delay: the next result ends the wait
    completer.succeeded(job[1], "w")  # type: ignore[arg-type]
    await asyncio.wait_for(wrote.wait(), 10)
    assert [ids for ids, _ in written] == [[0, 1]]
    completer.close()
    await run
    # No result after this one: the timer writes it, at twice the delay.
    monkeypatch.undo()
    delay = 0.05
    wrote.clear()
    completer = completer_of(delay)
    run = asyncio.create_task(completer.run())
    alone = time.monotonic()
    completer.succeeded(job[2], "w")  # type: ignore[arg-type]
    await asyncio.wait_for(wrote.wait(), 10)
    assert [ids for ids, _ in written] == [[0, 1], [2]]
    assert written[1][1] - alone >= 2 * delay * 0.9
    completer.close()
    await run
