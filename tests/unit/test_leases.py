"""A pool's leases of limits' slots (worker/pipeline/leases.py) as the local
queue's gate, without a database: a job fetched under a lease starts only
while its task runs fewer than the lease's target."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from worker_cli.jobs.job import Job
from worker_cli.worker.pipeline.leases import Leases
from worker_cli.worker.pipeline.local_queue import LocalQueue

pytestmark = pytest.mark.unit


def _job(id_: int, task: str = "lim") -> Job:
    values = dict.fromkeys(Job._fields)
    values.update(id=id_, priority=0, run_at=datetime.fromtimestamp(id_, UTC), task_identifier=task)
    return Job(**values)  # type: ignore[arg-type]


def _leased(target: int) -> tuple[Leases, LocalQueue]:
    leases, queue = Leases(), LocalQueue()
    leases.set_tasks({"lim"})
    leases.grant({("lim", ""): target}, leases.generation)
    queue.gate = leases
    return leases, queue


def test_a_leased_job_waits_aside_until_one_of_its_task_ends() -> None:
    leases, queue = _leased(1)
    a, b, other = _job(1), _job(2), _job(3, "free")
    leases.fetched([a, b])
    queue.put([a, b, other])
    assert queue.take_nowait() is a
    # b cannot start (1 of 1 running): aside, not counted; the free job can.
    assert queue.take_nowait() is other
    assert len(queue) == 0
    with pytest.raises(asyncio.QueueEmpty):
        queue.take_nowait()
    assert queue.job_ids() == {2}  # still held: its lock is refreshed, given back at a stop
    assert leases.ended(a)
    queue.release("lim")
    assert queue.take_nowait() is b
    assert leases.asks() == (["lim"], [""], [1], [1], [0])


def test_a_task_thread_sets_aside_what_it_may_not_start() -> None:
    leases, queue = _leased(1)
    a, b = _job(1), _job(2)
    leases.fetched([a, b])
    queue.put([a, b])
    assert queue.take_plain({"lim"}) is a
    assert queue.take_plain({"lim"}) is None
    assert [job.id for job in queue.drain()] == [2]  # aside jobs are given back too


def test_a_suspended_lease_runs_no_more_than_now_whatever_a_reply_in_flight_says() -> None:
    leases, queue = _leased(3)
    jobs = [_job(n) for n in range(1, 6)]
    leases.fetched(jobs)
    queue.put(jobs)
    assert queue.take_nowait() is jobs[0]
    generation = leases.generation  # a fetch leaves with this generation
    leases.suspend()  # a limit changed meanwhile: at most the 1 running
    leases.grant({("lim", ""): 5}, generation)  # the fetch's reply, read before the change
    with pytest.raises(asyncio.QueueEmpty):
        queue.take_nowait()
    leases.grant({("lim", ""): 2}, leases.generation)  # the next fetch's
    queue.release("lim")
    assert queue.take_nowait() is jobs[1]
    with pytest.raises(asyncio.QueueEmpty):
        queue.take_nowait()


def test_what_a_fetch_sends_holds_what_the_pool_may_run_until_it_commits() -> None:
    leases, queue = _leased(4)
    jobs = [_job(n) for n in range(1, 4)]
    leases.fetched(jobs)
    queue.put(jobs)
    queue.take_nowait()
    # Target 4, 1 running, 2 waiting: the database keeps at least 4 slots.
    assert leases.asks() == (["lim"], [""], [4], [1], [2])
    leases.suspend()
    assert leases.asks() == (["lim"], [""], [1], [1], [2])


def test_the_jobs_a_fetch_brings_may_start_before_its_answer_so_its_ask_holds_them() -> None:
    """A fetch's jobs reach the local queue before its lease's answer is
    granted, and start under the target until then: what the fetch sends
    keeps that many slots, though nothing waits when it asks."""
    leases, queue = _leased(4)
    generation = leases.generation
    assert leases.asks() == (["lim"], [""], [4], [0], [0])
    jobs = [_job(n) for n in range(1, 6)]
    leases.fetched(jobs)  # (before the answer)
    queue.put(jobs)
    assert [queue.take_nowait() for _ in range(4)] == jobs[:4]
    with pytest.raises(asyncio.QueueEmpty):
        queue.take_nowait()
    leases.grant({("lim", ""): 2}, generation)  # the answer: 2 from now on


def test_jobs_not_fetched_under_a_lease_are_never_held() -> None:
    leases, queue = _leased(0)
    job = _job(1)
    queue.put([job])
    assert queue.take_nowait() is job
    assert not leases.ended(job)


def test_jobs_taken_out_of_the_queue_no_longer_count_as_queued() -> None:
    leases, queue = _leased(1)
    jobs = [_job(n) for n in range(1, 4)]
    leases.fetched(jobs)
    queue.put(jobs)
    queue.take_nowait()
    assert leases.asks()[4] == [2]
    # A cancel or a pause takes queued jobs out; a stop drains the rest.
    queue.remove_where(lambda job: job.id == 2)
    assert leases.asks()[4] == [1]
    queue.drain()
    assert leases.asks()[4] == [0]


def test_a_partitioned_limits_job_waits_for_its_value_and_its_values_lease() -> None:
    leases, queue = Leases(), LocalQueue()
    leases.set_tasks({"lim"}, {"lim"})
    queue.gate = leases
    a, b, c = _job(1), _job(2), _job(3)
    leases.fetched([a, b, c])
    queue.put([a, b, c])
    with pytest.raises(asyncio.QueueEmpty):  # values not read yet: none starts
        queue.take_nowait()
    assert leases.unread() == [1, 2, 3]
    leases.partitions({1: "x", 2: "x", 3: "y"})
    leases.grant({("lim", "x"): 1, ("lim", "y"): 1}, leases.generation)
    queue.release("lim")
    assert queue.take_nowait() is a
    assert queue.take_nowait() is c  # b waits: its value "x" runs 1 of 1
    with pytest.raises(asyncio.QueueEmpty):
        queue.take_nowait()
    assert leases.asks() == (["lim", "lim"], ["x", "y"], [1, 1], [1, 1], [1, 0])
