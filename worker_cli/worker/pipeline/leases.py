"""Leases: a pool's share of a concurrency limit's slots, held in the database.

A task whose limit is ``max_running`` only (no ``partition_by``, no
``max_starts``) need not cost a round trip per start. The pool leases some
of the limit's slots (``py_fetch_leased_jobs``, migrations/py/000028.sql:
counted as running by every other fetch, gone with the pool's heartbeat row
when it dies), fetches that task's jobs ahead like any other's, and starts
them locally while it runs fewer than its lease's *target*. A job fetched
under a lease that cannot start now waits aside in the local queue
(:meth:`~.local_queue.LocalQueue.release` puts it back when a job of its task
ends).

What the pool may run (the target) never exceeds its slots in the database:
the fetch sends what the pool may be running by the time it commits
(:meth:`Leases.asks`), the database keeps at least that many slots, and a
target that shrinks is followed by the slots at the next fetch. A changed
limit ends the leases (``py_set_limit``): told by the control notification,
the pool runs no more than it runs now (:meth:`Leases.suspend`) and gives
back the jobs it fetched under the old lease and has not started, until its
next fetch leases again.

Every method may be called from any thread (task threads start plain jobs).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence

from ...jobs.job import Job

__all__ = ["Leases"]


class Leases:
    """This pool's leases and the jobs it runs and holds under them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: The tasks whose jobs are fetched under a lease.
        self.tasks: frozenset[str] = frozenset()
        self._target: dict[str, int] = {}
        self._running: dict[str, int] = {}
        #: Jobs fetched under a lease and not started: their tasks by id.
        self._waiting: dict[int, str] = {}
        #: Jobs started under a lease and not ended.
        self._started: set[int] = set()
        #: Bumped by :meth:`suspend`: a fetch in flight meanwhile was answered
        #: for leases that may have ended.
        self._generation = 0

    @property
    def generation(self) -> int:
        return self._generation

    def start(self, job: Job) -> bool:
        """Whether ``job`` may start now; if so, it counts as running under
        its lease until :meth:`ended`. A job not fetched under a lease always may."""
        if job.id not in self._waiting:
            return True
        with self._lock:
            if job.id not in self._waiting:
                return True
            task = job.task_identifier
            running = self._running.get(task, 0)
            if running >= self._target.get(task, 0):
                return False
            self._running[task] = running + 1
            del self._waiting[job.id]
            self._started.add(job.id)
            return True

    def ended(self, job: Job) -> bool:
        """``job`` ended; whether it had started under a lease (a job of its
        task waiting aside may start now)."""
        if job.id not in self._started:
            return False
        with self._lock:
            if job.id not in self._started:
                return False
            self._started.discard(job.id)
            task = job.task_identifier
            self._running[task] = self._running.get(task, 1) - 1
            return True

    def fetched(self, jobs: Iterable[Job]) -> None:
        """These jobs were fetched under a lease."""
        with self._lock:
            self._waiting.update((job.id, job.task_identifier) for job in jobs)

    def waiting(self, job: Job) -> bool:
        """Whether ``job`` was fetched under a lease and has not started."""
        return job.id in self._waiting

    def forget(self, jobs: Iterable[Job]) -> None:
        """These jobs leave the pool without starting (given back, removed)."""
        with self._lock:
            for job in jobs:
                self._waiting.pop(job.id, None)

    def asks(self, tasks: Sequence[str]) -> tuple[list[int], list[int], list[int]]:
        """For each task: what this pool may run from now until a fetch
        commits (holding), runs now, and has fetched and not started."""
        with self._lock:
            queued = Counter(self._waiting.values())
            holding = [max(self._target.get(t, 0), self._running.get(t, 0)) for t in tasks]
            running = [self._running.get(t, 0) for t in tasks]
            return holding, running, [queued.get(t, 0) for t in tasks]

    def grant(self, targets: Mapping[str, int], generation: int) -> set[str]:
        """A fetch that started at ``generation`` read back these targets (a
        task without one: none). Returns the tasks whose target grew."""
        with self._lock:
            grew: set[str] = set()
            for task in self.tasks | self._target.keys():
                new = targets.get(task, 0)
                if generation != self._generation:
                    # Suspended meanwhile: no more than now, until the next fetch.
                    new = min(new, self._target.get(task, 0))
                if new > self._target.get(task, 0):
                    grew.add(task)
                self._target[task] = new
            return grew

    def suspend(self) -> None:
        """A limit changed: run no more than now under any lease until the
        next fetch leases again."""
        with self._lock:
            self._generation += 1
            for task in self._target:
                self._target[task] = min(self._target[task], self._running.get(task, 0))

    def set_tasks(self, tasks: Collection[str]) -> None:
        """The tasks fetched under leases from now on."""
        self.tasks = frozenset(tasks)
