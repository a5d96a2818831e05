"""The local queue: jobs this pool has locked and not started yet.

The fetcher fills it and the slots take from it, highest priority first. How
much to fetch ahead is :func:`plan_fetch`: the idle slots, plus about
``horizon`` seconds of work at the rate jobs are finishing, at most ``size``
ahead. Fast jobs are then fetched hundreds at a time; slow ones are not
hoarded, so other workers can take them. The rate is :class:`Rate`.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import math
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ...jobs.job import Job

__all__ = ["FetchPlan", "Gate", "LocalQueue", "Rate", "Refill", "plan_fetch"]


@dataclass(frozen=True, slots=True)
class FetchPlan:
    """What the fetcher should do now."""

    #: Jobs to fetch now (0: none).
    count: int
    #: Wake the fetcher again once the local queue is this short.
    refill_below: int


def plan_fetch(
    *,
    concurrency: int,
    size: int,
    horizon: float,
    rate: float,
    running: int,
    buffered: int,
) -> FetchPlan:
    """How many jobs to fetch, given ``running`` jobs, ``buffered`` waiting
    locally and ``rate`` jobs finishing per second.

    The target held ahead is ``rate * horizon`` jobs, at most ``size``
    (``horizon`` infinite: always ``size``). Nothing is fetched while the
    buffer covers the idle slots and more than half the target; otherwise the
    fetch fills the idle slots and the target.
    """
    target = size if math.isinf(horizon) else min(size, math.ceil(rate * horizon))
    refill_below = max(concurrency, target // 2)
    idle = concurrency - running
    if buffered >= idle and buffered > target // 2:
        return FetchPlan(0, refill_below)
    return FetchPlan(max(0, idle + target - buffered), refill_below)


class Gate(Protocol):
    """Decides whether a queued job may start now (see :mod:`.leases`)."""

    def start(self, job: Job) -> bool:
        """Whether ``job`` may start now (it then counts as started)."""

    def forget(self, jobs: Iterable[Job]) -> None:
        """These jobs left the queue without starting."""


class Refill(Protocol):
    """What the slots and task threads need of the fetcher."""

    #: The last fetch found fewer jobs than it asked for (waking it is useless
    #: until something new is announced).
    exhausted: bool
    #: Wake the fetcher once the local queue is this short.
    refill_below: int

    def wake(self) -> bool:
        """Fetch again if the local queue wants more. Returns whether the
        fetcher is between fetches: it then needs the event loop to start one
        (the caller should yield soon). While a fetch is in flight, the
        fetcher plans the next one when it returns."""


class Rate:
    """Events per second: an exponentially weighted average of a running count,
    sampled whenever the rate is read (the events since the last reading count
    as spread evenly over the time since).

    The time constant is short (50 ms, a tenth of the default horizon) so
    that fetching ahead ramps up within a few fetches when a backlog appears:
    the target (rate x horizon) then follows the jobs done so far, roughly
    doubling fetch after fetch. With 1 s it took ~10,000 jobs to reach a local
    queue of 500.
    """

    TAU = 0.05

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._value = 0.0
        self._count = 0
        self._at = clock()

    def per_second(self, count: int) -> float:
        """The rate, given the running count now."""
        now = self._clock()
        elapsed = now - self._at
        if elapsed > 0:
            kept = math.exp(-elapsed / self.TAU)
            self._value = self._value * kept + (count - self._count) / elapsed * (1 - kept)
            self._count, self._at = count, now
        return self._value


class LocalQueue:
    """Fetched jobs waiting for a slot, in the order the database gives them
    (priority, then run_at, then id), and the "stop" markers that end slots.

    The event loop puts jobs and markers in; slots take them out, and so do
    the task threads (:meth:`take_plain`, from any thread): every change to
    the heap is made under a lock. A slot woken for a job that a thread took
    first simply waits again.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, float, int, Job | None]] = []
        self._lock = threading.Lock()
        #: Whether a job may start now (the pool's :class:`~.leases.Leases`);
        #: one it refuses waits aside (not counted in ``len``) until
        #: :meth:`release` for its task.
        self.gate: Gate | None = None
        self._aside: dict[str, list[tuple[float, float, int, Job | None]]] = {}
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._markers = itertools.count()

    def __len__(self) -> int:
        """The jobs that may start when a slot is free (not those waiting aside)."""
        return len(self._heap)

    def _pop(self) -> tuple[bool, Job | None]:
        """Under the lock: the next job the gate lets start, the ones it
        refuses set aside; (False, None) when there is none."""
        heap, gate = self._heap, self.gate
        while heap:
            entry = heapq.heappop(heap)
            job = entry[3]
            if job is None or gate is None or gate.start(job):
                return True, job
            self._aside.setdefault(job.task_identifier, []).append(entry)
        return False, None

    def release(self, task: str) -> None:
        """A job of ``task`` ended (event loop only): its jobs waiting aside
        may start now."""
        with self._lock:
            entries = self._aside.pop(task, None)
            if entries:
                for entry in entries:
                    heapq.heappush(self._heap, entry)
        for _ in entries or ():
            self._wake_one()

    def put(self, jobs: Sequence[Job], *, first: bool = False) -> None:
        """Queue fetched jobs (event loop only); ``first``: ahead of every other
        job (jobs a limit let start, which must start at once)."""
        with self._lock:
            for job in jobs:
                rank = -math.inf if first else job.priority
                heapq.heappush(self._heap, (rank, job.run_at.timestamp(), job.id, job))
        for _ in jobs:
            self._wake_one()

    async def take(self) -> Job | None:
        """The next job, waiting for one; None tells the slot to stop."""
        while True:
            with self._lock:
                found, job = self._pop()
                if found:
                    return job
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # the wake-up it got goes to another slot
                else:
                    self._waiters.remove(waiter)
                raise

    def take_nowait(self) -> Job | None:
        """The next job without waiting (raises ``asyncio.QueueEmpty``)."""
        with self._lock:
            found, job = self._pop()
            if not found:
                raise asyncio.QueueEmpty
            return job

    def runs_short(self, refill: Refill) -> bool:
        """Whether to wake the fetcher: the queue is at or below its refill
        threshold, and the last fetch did not find the database short."""
        return not refill.exhausted and len(self._heap) <= refill.refill_below

    def take_plain(self, identifiers: Collection[str]) -> Job | None:
        """From any thread: the next job if it is one of ``identifiers`` (a
        task thread takes only the plain tasks it can run); otherwise, or at a
        stop marker, None and the queue is unchanged."""
        with self._lock:
            gate = self.gate
            while self._heap:
                entry = self._heap[0]
                job = entry[3]
                if job is None or job.task_identifier not in identifiers:
                    return None
                heapq.heappop(self._heap)
                if gate is None or gate.start(job):
                    return job
                self._aside.setdefault(job.task_identifier, []).append(entry)
        return None

    def job_ids(self) -> set[int]:
        """The ids of the queued jobs (any thread)."""
        with self._lock:
            return {entry[2] for entry in self._entries() if entry[3] is not None}

    def _entries(self) -> list[tuple[float, float, int, Job | None]]:
        """Under the lock: every queued entry, those waiting aside too."""
        if not self._aside:
            return self._heap
        return self._heap + [entry for entries in self._aside.values() for entry in entries]

    def first_count(self) -> int:
        """How many queued jobs were put ``first`` and have not started."""
        with self._lock:
            return sum(1 for entry in self._heap if entry[0] == -math.inf)

    def remove_where(self, covered: Callable[[Job], bool]) -> list[Job]:
        """Take out the queued jobs ``covered`` selects (event loop only)."""
        with self._lock:
            entries = self._entries()
            taken = [entry[3] for entry in entries if entry[3] is not None and covered(entry[3])]
            if taken:
                self._heap = [e for e in entries if e[3] is None or not covered(e[3])]
                self._aside = {}
                heapq.heapify(self._heap)
        if taken and self.gate is not None:
            self.gate.forget(taken)
        return taken

    def drain(self) -> list[Job]:
        """Remove and return every job not started yet (stop markers are dropped)."""
        with self._lock:
            entries, self._heap, self._aside = self._entries(), [], {}
        jobs = [entry[3] for entry in sorted(entries) if entry[3] is not None]
        if jobs and self.gate is not None:
            self.gate.forget(jobs)
        return jobs

    def end_slots(self, count: int) -> None:
        """Make the next ``count`` takes return None (after every queued job)."""
        with self._lock:
            for _ in range(count):
                heapq.heappush(self._heap, (math.inf, next(self._markers), 0, None))
        for _ in range(count):
            self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
