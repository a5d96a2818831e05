"""A job as stored in ``_private_jobs``, plus its task identifier and queue name."""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

__all__ = ["Job"]


@dataclass(frozen=True, slots=True)
class Job:
    """One row of the jobs table, read-only.

    ``task_identifier`` and ``queue_name`` are looked up from the task and
    queue tables so callers never deal with their internal ids.
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
        return cls(**{name: row[name] for name in _FIELD_NAMES})


_FIELD_NAMES = tuple(f.name for f in fields(Job))
