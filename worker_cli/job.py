"""A job as stored in ``_private_jobs``, plus its task identifier and queue name."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

__all__ = ["Job"]


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
