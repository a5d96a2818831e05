"""A job as stored in ``_private_jobs``, plus its task identifier and queue name."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

__all__ = ["JOB_COLUMNS", "Job"]


class Job(NamedTuple):
    """One row of the jobs table, read-only (``job.attempts = 3`` raises).

    ``task_identifier`` and ``queue_name`` are looked up from the task and
    queue tables so callers never deal with their internal ids. A NamedTuple:
    cheap to build from a row, and ``job._asdict()`` gives a dict.
    """

    id: int
    job_queue_id: int | None
    task_id: int
    payload: Any
    priority: int
    run_at: datetime
    attempts: int
    max_attempts: int
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    key: str | None
    locked_at: datetime | None
    locked_by: str | None
    revision: int
    flags: dict[str, bool] | None
    is_available: bool
    task_identifier: str
    queue_name: str | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Job:
        """Build a Job from a dict row holding every column (extra keys ignored)."""
        return cls(*(row[name] for name in cls._fields))


#: The columns of _private_jobs, in the order of Job's first fields.
JOB_COLUMNS = Job._fields[:17]
