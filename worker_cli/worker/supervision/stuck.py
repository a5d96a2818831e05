"""Stuck jobs: those of this pool that go on running when they should have
stopped (a cancel request ignored past its grace, a plain ``def`` task still
running past its timeout's grace).

Each is reported once, with the line its task is at (a warning), and is
listed here until its task ends. The list is read by the heartbeat (it goes
into the pool's heartbeat row, ``stuck_job_ids``, where the dashboard shows
it: migrations/py/000012.sql) and by the metrics (``graphile_worker_jobs_stuck``),
so the heartbeat's thread reads it under a lock.
"""

from __future__ import annotations

import logging
import threading

__all__ = ["KEPT", "StuckJobs"]

logger = logging.getLogger("graphile_worker")

#: What happens to a stuck job unless something else is said.
KEPT = "it keeps its slot and its lock, and is never run twice"


class StuckJobs:
    """The stuck jobs of one pool (see the module's docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: frozenset[int] = frozenset()

    def __bool__(self) -> bool:
        return bool(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._ids

    def report(self, job_id: int, what: str, where: str | None, then: str = KEPT) -> None:
        """A job goes on running when it should have stopped: ``what`` it
        does, ``then`` what follows, and ``where`` its task is (its innermost
        frames). Warned once per job."""
        with self._lock:
            if job_id in self._ids:
                return
            self._ids = self._ids | {job_id}
        logger.warning(
            "Job %d %s: %s; its task is at %s", job_id, what, then, where or "an unknown place"
        )

    def ended(self, job_id: int) -> None:
        """The job's task ended (whatever its outcome)."""
        if job_id in self._ids:
            with self._lock:
                self._ids = self._ids - {job_id}

    def ids(self) -> list[int]:
        """The ids of the stuck jobs, ascending (any thread)."""
        return sorted(self._ids)
