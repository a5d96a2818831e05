"""Jobs a worker ran to an outcome, and how long they took, by task: the
figures of ``graphile_worker_jobs_total`` and
``graphile_worker_job_duration_seconds`` (no prometheus-client here).

Outcomes partition the attempts that reached one (:data:`OUTCOMES`): each is
exactly one of a success, a failed attempt that another follows (``retry``),
or a failed attempt that ends the job, as a ``cancelled`` one (a cancel
request, or its task raised ``Cancel``), a ``timeout`` (its task raised past
the job's timeout) or any other ``failure`` (attempts used up, ``Discard``,
an unreadable payload). A snooze is no outcome: the attempt is given back.

They come from the pool's events: ``job:success``; ``job:error`` for every
failed attempt, followed at once (in the same call, on the event loop) by
``job:failed`` when it ends the job. So a failed attempt is counted on the
loop's next turn (``call_soon``), when it is known whether ``job:failed``
followed: a counter never goes back.
"""

from __future__ import annotations

import asyncio
import threading
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import JobCancelled, JobTimeout
from ..tasks.retry_policy import Cancel

__all__ = ["DURATION_BUCKETS", "OUTCOMES", "JobStats", "TaskSnapshot", "final_outcome"]

#: Upper bounds (seconds) of the job duration histogram's buckets: from a
#: trivial job's fraction of a millisecond to a five-minute one.
DURATION_BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)

#: The outcomes of an attempt, each attempt exactly one: ``failure``,
#: ``cancelled`` and ``timeout`` end the job (its final failures).
OUTCOMES = ("success", "retry", "failure", "cancelled", "timeout")


def final_outcome(error: BaseException) -> str:
    """The outcome of a failed attempt that ends its job, by its error."""
    if isinstance(error, JobTimeout):
        return "timeout"
    if isinstance(error, JobCancelled | Cancel):
        return "cancelled"
    return "failure"


class _TaskFigures:
    """One task's counts and durations (under :attr:`JobStats._lock`)."""

    __slots__ = ("buckets", "outcomes", "seconds")

    def __init__(self, size: int) -> None:
        #: Attempts by outcome, in the order of OUTCOMES.
        self.outcomes = [0] * len(OUTCOMES)
        #: Observations per bucket, not cumulative; the last one is +Inf.
        self.buckets = [0] * size
        self.seconds = 0.0


@dataclass(frozen=True)
class TaskSnapshot:
    """One task's figures as read by a scrape (buckets cumulative, with +Inf)."""

    task: str
    #: Attempts by outcome, in the order of OUTCOMES.
    outcomes: tuple[int, ...]
    buckets: tuple[int, ...]
    seconds: float


class JobStats:
    """Jobs run to an outcome and their durations, by task.

    Written on the event loop (one event handler call per job), read by a
    scrape in any thread: a lock keeps a task's counts, buckets and sum
    consistent with one another.
    """

    def __init__(self, tasks: Iterable[str], bounds: Sequence[float] = DURATION_BUCKETS) -> None:
        self.bounds = tuple(bounds)
        self._lock = threading.Lock()
        # Every task of the worker from the start: a series that appears only
        # after its first job hides the first increase from rate().
        self._tasks = {task: _TaskFigures(len(self.bounds) + 1) for task in tasks}
        #: Failed attempts not counted yet (on the loop only), by job id:
        #: task, seconds, error; and whether job:failed said it ends the job.
        self._failed: dict[int, tuple[str, float, BaseException]] = {}
        self._final: set[int] = set()

    def on_success(self, event: Mapping[str, Any]) -> None:
        """``job:success`` handler."""
        self.record(event["job"].task_identifier, event["duration_ms"] / 1000, "success")

    def on_error(self, event: Mapping[str, Any]) -> None:
        """``job:error`` handler (every failed attempt): counted on the
        loop's next turn, once ``job:failed`` has said whether it is final."""
        job = event["job"]
        self._failed[job.id] = (job.task_identifier, event["duration_ms"] / 1000, event["error"])
        asyncio.get_running_loop().call_soon(self._settle, job.id)

    def on_failed(self, event: Mapping[str, Any]) -> None:
        """``job:failed`` handler (a failed attempt that ends its job)."""
        job_id = event["job"].id
        if job_id in self._failed:
            self._final.add(job_id)

    def _settle(self, job_id: int) -> None:
        failed = self._failed.pop(job_id, None)
        if failed is None:
            return
        task, seconds, error = failed
        if job_id in self._final:
            self._final.discard(job_id)
            self.record(task, seconds, final_outcome(error))
        else:
            self.record(task, seconds, "retry")

    def record(self, task: str, seconds: float, outcome: str) -> None:
        # Prometheus buckets are "less than or equal": the first bound >= seconds.
        index = bisect_left(self.bounds, seconds)
        which = OUTCOMES.index(outcome)
        with self._lock:
            figures = self._tasks.get(task)
            if figures is None:
                figures = self._tasks[task] = _TaskFigures(len(self.bounds) + 1)
            figures.outcomes[which] += 1
            figures.buckets[index] += 1
            figures.seconds += seconds

    def snapshot(self) -> list[TaskSnapshot]:
        """Every task's figures, by task identifier."""
        with self._lock:
            raw = [
                (task, tuple(f.outcomes), list(f.buckets), f.seconds)
                for task, f in self._tasks.items()
            ]
        result = []
        for task, outcomes, buckets, seconds in sorted(raw):
            cumulative, total = [], 0
            for count in buckets:
                total += count
                cumulative.append(total)
            result.append(TaskSnapshot(task, outcomes, tuple(cumulative), seconds))
        return result
