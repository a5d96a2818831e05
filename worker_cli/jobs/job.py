"""A job as stored in ``_private_jobs``, plus its task identifier and queue name."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from ..sql import JOB_COLUMNS

__all__ = [
    "Job",
    "decode_jobs",
    "jobs_from_rows",
    "parse_payloads",
    "task_and_queue_ids",
]


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


def parse_payloads(raw: Sequence[bytes | None]) -> list[Any]:
    """The payloads of a batch of rows, parsed with one ``json.loads``."""
    if not raw:
        return []
    return list(
        json.loads(b"[" + b",".join(b"null" if text is None else text for text in raw) + b"]")
    )


# Where decode_jobs finds what it reads in a row of statements.JOB_COLUMNS.
_QUEUE_ID = JOB_COLUMNS.index("job_queue_id")
_TASK_ID = JOB_COLUMNS.index("task_id")
_PAYLOAD = JOB_COLUMNS.index("payload")
if Job._fields[: len(JOB_COLUMNS)] != JOB_COLUMNS:  # pragma: no cover
    raise ImportError("Job's fields must start with statements.JOB_COLUMNS, in its order")


def decode_jobs(
    rows: Sequence[Sequence[Any]],
    task_names: Mapping[int, str],
    queue_names: Mapping[int, str] | None = None,
    *,
    first: int = 0,
) -> list[Job]:
    """Jobs from rows holding :data:`~worker_cli.sql.JOB_COLUMNS` from
    column ``first`` on, read with :func:`read_payloads_raw` (the payloads are
    parsed in one go).

    The task identifier comes from ``task_names`` by task id. The queue name
    comes from ``queue_names`` by queue id, or without ``queue_names`` from the
    column after the job's columns.
    """
    payload = first + _PAYLOAD
    end = first + len(JOB_COLUMNS)
    task_id = first + _TASK_ID
    payloads = parse_payloads([row[payload] for row in rows])
    if queue_names is None:
        queues = [row[end] for row in rows]
    else:
        queue_id = first + _QUEUE_ID
        queues = [queue_names.get(row[queue_id]) for row in rows]
    return [
        Job._make(
            (*row[first:payload], value, *row[payload + 1 : end], task_names[row[task_id]], queue)
        )
        for row, value, queue in zip(rows, payloads, queues, strict=True)
    ]


def task_and_queue_ids(
    rows: Sequence[Sequence[Any]], *, first: int = 0
) -> tuple[list[int], list[int]]:
    """The distinct task ids and queue ids of rows as :func:`decode_jobs` reads them
    (to look up the names it needs); rows whose job columns are null add none."""
    task_ids = {row[first + _TASK_ID] for row in rows} - {None}
    queue_ids = {row[first + _QUEUE_ID] for row in rows} - {None}
    return list(task_ids), list(queue_ids)


def jobs_from_rows(rows: Sequence[Sequence[Any]], task_names: dict[int, str]) -> list[Job]:
    """Jobs from ``get_jobs`` rows (the job columns, then the queue name),
    read with :func:`read_payloads_raw`: the payloads are parsed in one go."""
    return decode_jobs(rows, task_names)
