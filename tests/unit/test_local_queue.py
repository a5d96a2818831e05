"""The local queue (order, takes from slots and task threads), its sizing rule
and rate estimate, without a database."""

from __future__ import annotations

import asyncio
import math
import sys
import threading
from datetime import UTC, datetime

import pytest

from worker_cli.config.options import WorkerOptions
from worker_cli.jobs.job import Job
from worker_cli.observe.events import Events
from worker_cli.worker.pipeline.fetcher import Fetcher, FetchSettings
from worker_cli.worker.pipeline.local_queue import LocalQueue, Rate, plan_fetch
from worker_cli.worker.pool_state import PoolState

pytestmark = pytest.mark.unit


def plan(**kwargs: float) -> tuple[int, int]:
    args: dict[str, float] = {
        "concurrency": 10,
        "size": 200,
        "horizon": 0.05,
        "rate": 0.0,
        "running": 0,
        "buffered": 0,
    }
    args.update(kwargs)
    result = plan_fetch(**args)  # type: ignore[arg-type]
    return result.count, result.refill_below


def test_an_idle_pool_with_no_history_fetches_for_its_idle_slots_only() -> None:
    assert plan() == (10, 10)
    assert plan(running=4) == (6, 10)


def test_the_target_follows_the_rate_within_the_size() -> None:
    # 2,000 jobs/s x 50 ms = 100 jobs ahead, plus the idle slots.
    assert plan(rate=2000) == (110, 50)
    # Capped by the size of the local queue.
    assert plan(rate=1_000_000) == (210, 100)
    # Slow jobs are not hoarded: 10 jobs/s x 50 ms rounds up to 1.
    assert plan(rate=10, running=10) == (1, 10)


def test_nothing_is_fetched_while_the_buffer_covers_idle_slots_and_half_the_target() -> None:
    assert plan(rate=2000, running=10, buffered=51) == (0, 50)
    # At half the target or below, it is topped up to the target.
    assert plan(rate=2000, running=10, buffered=50) == (50, 50)
    # Idle slots that the buffer does not cover are always filled.
    assert plan(rate=2000, running=0, buffered=5) == (105, 50)


def test_a_size_of_zero_fetches_only_for_idle_slots() -> None:
    assert plan(size=0, rate=1_000_000, running=7) == (3, 10)
    assert plan(size=0, rate=1_000_000, running=10) == (0, 10)


def test_an_infinite_horizon_keeps_the_queue_full() -> None:
    assert plan(horizon=math.inf, running=10, buffered=100) == (100, 100)
    assert plan(horizon=math.inf, running=10, buffered=101) == (0, 100)


@pytest.mark.parametrize(
    ("rate", "at_least"),
    [
        # One of 16 processes draining 50,000 jobs a second finishes about
        # 3,000 a second itself: over a thousand a fetch, not the few dozen
        # that made such a fleet drain at 0.67x the rate of the best count
        # (a 50 ms horizon), nor the ~600 of 200 ms (0.86-0.89x).
        (3_000, 1_200),
        # One process draining 60,000 a second: thousands a fetch (a fetch of
        # 500, sent when 500 were left, left it waiting: 0.79x the rate).
        (60_000, 4_000),
    ],
)
def test_by_default_a_busy_pool_fetches_in_large_batches(rate: float, at_least: int) -> None:
    """Each fetch is a statement and a commit: with the default horizon and
    size, a pool finishing jobs quickly fetches many at a time
    (docs/performance.md, "Fetching ahead")."""
    defaults = WorkerOptions()
    count, refill_below = plan(
        size=defaults.local_queue_size, horizon=defaults.local_queue_horizon, rate=rate
    )
    assert count >= at_least
    # Refilled once half of it is used: each later fetch brings about as many.
    assert refill_below >= at_least // 2


def test_the_rate_is_an_average_that_follows_the_count() -> None:
    now = [0.0]
    rate = Rate(clock=lambda: now[0])
    assert rate.per_second(0) == 0
    now[0] = 0.05  # one time constant: 100 jobs in 50 ms is 2,000/s
    assert rate.per_second(100) == pytest.approx(2000 * (1 - math.exp(-1)))
    for _ in range(20):  # steady 2,000/s
        now[0] += 0.05
        count = round(now[0] * 2000)
        value = rate.per_second(count)
    assert value == pytest.approx(2000, rel=0.01)
    now[0] += 1.0  # a second with nothing done: the rate decays to ~0
    assert rate.per_second(count) < 1


def _job(id_: int, priority: int, run_at: float) -> Job:
    values = dict.fromkeys(Job._fields)
    values.update(
        id=id_,
        priority=priority,
        run_at=datetime.fromtimestamp(run_at, UTC),
        task_identifier="t",
    )
    return Job(**values)  # type: ignore[arg-type]


async def test_slots_take_the_highest_priority_then_the_oldest_then_markers_last() -> None:
    queue = LocalQueue()
    queue.put([_job(1, 5, 100), _job(2, 0, 200), _job(3, 0, 100), _job(4, 0, 100)])
    queue.end_slots(2)
    taken = [queue.take_nowait() for _ in range(6)]
    assert [job.id if job else None for job in taken] == [3, 4, 2, 1, None, None]
    with pytest.raises(asyncio.QueueEmpty):
        queue.take_nowait()


async def test_draining_returns_the_unstarted_jobs_and_keeps_the_markers_out() -> None:
    queue = LocalQueue()
    queue.put([_job(1, 0, 1), _job(2, 0, 2)])
    queue.end_slots(1)
    assert sorted(job.id for job in queue.drain()) == [1, 2]
    assert len(queue) == 0


def _plain_job(id_: int, task: str) -> Job:
    job = _job(id_, 0, 100 + id_)
    return job._replace(task_identifier=task)


async def test_a_task_thread_takes_only_a_plain_job_at_the_head() -> None:
    queue = LocalQueue()
    queue.put([_plain_job(1, "plain"), _plain_job(2, "async"), _plain_job(3, "plain")])
    queue.end_slots(1)
    taken = queue.take_plain({"plain"})
    assert taken is not None and taken.id == 1
    # The head is an async job: the thread leaves it (and what follows) to a slot.
    assert queue.take_plain({"plain"}) is None
    assert len(queue) == 3
    assert [queue.take_nowait() for _ in range(2)] == [
        _plain_job(2, "async"),
        _plain_job(3, "plain"),
    ]
    # A stop marker is never taken by a thread.
    assert queue.take_plain({"plain"}) is None
    assert queue.take_nowait() is None


async def test_threads_and_slots_taking_at_once_take_each_job_exactly_once() -> None:
    queue = LocalQueue()
    count = 20_000
    queue.put([_plain_job(n, "plain") for n in range(count)])
    taken: list[list[int]] = [[] for _ in range(4)]
    start = threading.Barrier(len(taken) + 1)

    def thread_takes(into: list[int]) -> None:
        start.wait()
        while (job := queue.take_plain({"plain"})) is not None:
            into.append(job.id)

    threads = [threading.Thread(target=thread_takes, args=(into,)) for into in taken]
    for thread in threads:
        thread.start()
    # Switch threads as often as possible, so that a take that is not atomic shows.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    start.wait()
    by_loop = []
    while True:
        try:
            job = queue.take_nowait()
        except asyncio.QueueEmpty:
            break
        assert job is not None
        by_loop.append(job.id)
    for thread in threads:
        thread.join()
    sys.setswitchinterval(interval)
    everything = by_loop + [id_ for into in taken for id_ in into]
    assert sorted(everything) == list(range(count))


async def test_a_slot_woken_for_a_job_a_thread_took_waits_for_the_next() -> None:
    queue = LocalQueue()
    waiting = asyncio.ensure_future(queue.take())
    await asyncio.sleep(0)
    queue.put([_plain_job(1, "plain")])
    assert queue.take_plain({"plain"}) is not None  # before the slot runs
    await asyncio.sleep(0)
    assert not waiting.done()
    queue.put([_plain_job(2, "async")])
    job = await asyncio.wait_for(waiting, 1)
    assert job is not None and job.id == 2


async def test_a_cancelled_waiter_passes_its_wake_up_on() -> None:
    queue = LocalQueue()
    first = asyncio.ensure_future(queue.take())
    second = asyncio.ensure_future(queue.take())
    await asyncio.sleep(0)
    queue.put([_plain_job(1, "async")])  # wakes `first`...
    first.cancel()  # ...which is cancelled before it runs
    job = await asyncio.wait_for(second, 1)
    assert job is not None and job.id == 1


class _HeldFetch(Fetcher):
    """A fetcher whose fetch waits until released, then finds nothing."""

    def __init__(self) -> None:
        super().__init__(
            None,  # type: ignore[arg-type]  # no connection: fetch is replaced
            FetchSettings("graphile_worker", 10, 200, 0.05),
            tasks=["noop"],
            state=PoolState("pool-test", Events()),
            running=lambda: 0,
            done=lambda: 0,
            owner=None,
            on_unreadable=lambda unreadable: None,
        )
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def fetch(self, limit: int) -> int:
        self.started.set()
        await self.release.wait()
        return 0


async def test_a_slot_is_asked_to_yield_for_the_fetcher_only_between_fetches() -> None:
    """While a fetch is in flight, a slot that finds the queue short need not
    yield: the fetcher plans its next fetch when this one returns."""
    fetcher = _HeldFetch()
    running = asyncio.ensure_future(fetcher.run())
    assert fetcher.wake()  # idle: the fetch starts when the loop runs it
    await asyncio.wait_for(fetcher.started.wait(), 1)
    assert not fetcher.wake()  # in flight
    fetcher.release.set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert fetcher.exhausted
    assert fetcher.wake()  # between fetches again
    fetcher.stop()
    await asyncio.wait_for(running, 1)
