"""Leases: a pool's share of a concurrency limit's slots, held in the database.

A task whose limit is ``max_running`` only (no ``max_starts``) need not cost
a round trip per start. The pool leases some of the limit's slots (of each
partition value, with ``partition_by``: a *key* is a limit and one of its
values, ``""`` without one) through ``py_fetch_leased_jobs``
(migrations/py/000028.sql: counted as running by every other fetch, gone
with the pool's heartbeat row when it dies), fetches that task's jobs ahead
like any other's, and starts them locally while it runs fewer than its
lease's *target*. A job fetched under a lease that cannot start now waits
aside in the local queue (:meth:`~.local_queue.LocalQueue.release` puts it
back when a job of its task ends, or when a lease grows); so does one whose
partition value is not read yet.

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
from collections.abc import Collection, Iterable, Mapping

from ...jobs.job import Job

__all__ = ["Key", "Leases"]

#: A limit's key: its task and one partition value ("" without partition_by).
Key = tuple[str, str]


class Leases:
    """This pool's leases and the jobs it runs and holds under them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: The tasks whose jobs are fetched under a lease.
        self.tasks: frozenset[str] = frozenset()
        #: Of those, the ones whose limit has partition_by.
        self.partitioned: frozenset[str] = frozenset()
        self._target: dict[Key, int] = {}
        self._running: dict[Key, int] = {}
        #: Jobs fetched under a lease and not started: their keys by id
        #: (partition None: not read yet; such a job waits).
        self._waiting: dict[int, tuple[str, str | None]] = {}
        #: Jobs started under a lease and not ended: their keys by id.
        self._started: dict[int, Key] = {}
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
            found = self._waiting.get(job.id)
            if found is None:
                return True
            task, part = found
            if part is None:
                return False
            key = (task, part)
            running = self._running.get(key, 0)
            if running >= self._target.get(key, 0):
                return False
            self._running[key] = running + 1
            del self._waiting[job.id]
            self._started[job.id] = key
            return True

    def ended(self, job: Job) -> bool:
        """``job`` ended; whether it had started under a lease (a job of its
        task waiting aside may start now)."""
        if job.id not in self._started:
            return False
        with self._lock:
            key = self._started.pop(job.id, None)
            if key is None:
                return False
            self._running[key] = self._running.get(key, 1) - 1
            return True

    def fetched(self, jobs: Iterable[Job]) -> None:
        """These jobs were fetched under a lease (the partition values of
        partitioned tasks' jobs come with :meth:`partitions`)."""
        with self._lock:
            partitioned = self.partitioned
            for job in jobs:
                task = job.task_identifier
                self._waiting[job.id] = (task, None if task in partitioned else "")

    def partitions(self, values: Mapping[int, str]) -> None:
        """The partition values of jobs fetched under a lease, by job id."""
        with self._lock:
            for job_id, part in values.items():
                found = self._waiting.get(job_id)
                if found is not None:
                    self._waiting[job_id] = (found[0], part)

    def unread(self) -> list[int]:
        """The jobs fetched under a lease whose partition value is not read."""
        with self._lock:
            return [job_id for job_id, (_, part) in self._waiting.items() if part is None]

    def waiting(self, job: Job) -> bool:
        """Whether ``job`` was fetched under a lease and has not started."""
        return job.id in self._waiting

    def forget(self, jobs: Iterable[Job]) -> None:
        """These jobs leave the pool without starting (given back, removed)."""
        with self._lock:
            for job in jobs:
                self._waiting.pop(job.id, None)

    def asks(self) -> tuple[list[str], list[str], list[int], list[int], list[int]]:
        """For each key this pool leases or holds jobs of (its task, its
        partition value): what this pool may run from now until the fetch's
        answer is granted (holding: its target, or what runs if more; the
        jobs the fetch itself brings may start under the target before
        then), runs now, and has fetched and not started. A key left out
        is one the pool may run nothing of: the fetch ends its lease."""
        with self._lock:
            queued: Counter[Key] = Counter(
                (task, part) for task, part in self._waiting.values() if part is not None
            )
            keys = sorted(
                key
                for key in self._target.keys() | self._running.keys() | queued.keys()
                if key[0] in self.tasks
            )
            return (
                [task for task, _ in keys],
                [part for _, part in keys],
                [max(self._target.get(k, 0), self._running.get(k, 0)) for k in keys],
                [self._running.get(k, 0) for k in keys],
                [queued[k] for k in keys],
            )

    def grant(self, targets: Mapping[Key, int], generation: int) -> set[str]:
        """A fetch that started at ``generation`` read back these targets (a
        key without one: none). Returns the tasks of the keys whose target grew."""
        with self._lock:
            grew: set[str] = set()
            for key in targets.keys() | self._target.keys():
                new = targets.get(key, 0)
                if generation != self._generation:
                    # Suspended meanwhile: no more than now, until the next fetch.
                    new = min(new, self._target.get(key, 0))
                if new > self._target.get(key, 0):
                    grew.add(key[0])
                if new or self._running.get(key, 0):
                    self._target[key] = new
                else:
                    self._target.pop(key, None)
                    self._running.pop(key, None)
            return grew

    def stalled(self) -> bool:
        """Whether jobs fetched under a lease wait while no job of their key
        runs here and its target is 0 (another pool holds the slots):
        nothing that ends here will let them start."""
        with self._lock:
            return any(
                part is not None
                and not self._target.get((task, part), 0)
                and not self._running.get((task, part), 0)
                for task, part in set(self._waiting.values())
            )

    def suspend(self) -> None:
        """A limit changed: run no more than now under any lease until the
        next fetch leases again."""
        with self._lock:
            self._generation += 1
            for key in self._target:
                self._target[key] = min(self._target[key], self._running.get(key, 0))

    def set_tasks(self, tasks: Collection[str], partitioned: Collection[str] = ()) -> None:
        """The tasks fetched under leases from now on, and those of them
        whose limit has partition_by."""
        self.tasks = frozenset(tasks)
        self.partitioned = frozenset(partitioned)
