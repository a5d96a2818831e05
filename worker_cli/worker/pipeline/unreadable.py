"""Reading fetched jobs when one row of the batch cannot be read.

A fetch is read in one go (:func:`~worker_cli.jobs.job.jobs_from_rows`: psycopg
loads the rows, one ``json.loads`` parses every payload). Values PostgreSQL
and ``add_job`` accept can still break that read: a payload nested thousands
of levels deep or holding an integer of thousands of digits (Python refuses
both), a ``run_at`` of ``-infinity`` or before year 1 (no Python datetime
holds it). The fetch has already committed the locks, so a read that gave up
would strand the whole batch, locked by a live pool.

:func:`read_jobs` then reads the rows one by one, each column with the
connection's own loader: a timestamp outside Python's range becomes the
earliest or latest datetime there is (a job due at ``-infinity`` is due now,
and runs), and a row with any other value that cannot be read comes back
apart, with the error that fails it (:class:`UnreadableJobError`), so that
only that job fails.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg.abc import Loader
from psycopg.pq import Format

from ...db.timestamps import EARLIEST, LATEST
from ...errors import UnreadableJobError
from ...jobs.job import Job, jobs_from_rows
from ...sql import JOB_COLUMNS

__all__ = ["Unreadable", "read_jobs"]

#: A job whose row could not be read: its readable columns (the others None),
#: and the error it fails with.
Unreadable = tuple[Job, UnreadableJobError]

#: The columns of a fetched row: the job's, then its queue name and its own timeout.
_COLUMNS = (*JOB_COLUMNS, "queue_name", "timeout")
_QUEUE_NAME = len(JOB_COLUMNS)
_TIMEOUT = len(JOB_COLUMNS) + 1
_ID = JOB_COLUMNS.index("id")
_PAYLOAD = JOB_COLUMNS.index("payload")
_TASK_ID = JOB_COLUMNS.index("task_id")
_TIMESTAMPTZ_OID = 1184


async def read_jobs(
    cursor: psycopg.AsyncCursor[Any],
    task_names: Mapping[int, str],
    timeouts: dict[int, float] | None = None,
) -> tuple[list[Job], list[Unreadable]]:
    """The jobs of a fetch's result (rows of ``get_jobs``' columns, payloads
    loaded raw), and those whose row cannot be read. Never raises for what a
    row holds: the rows are in memory, so the only error left is one row's.
    The jobs' own timeouts (seconds) go into ``timeouts``, by job id."""
    try:
        rows = await cursor.fetchall()  # (a value out of Python's range raises here)
        jobs = jobs_from_rows(rows, dict(task_names))
    except Exception:
        return _one_by_one(cursor, task_names, timeouts)
    if timeouts is not None:
        for row in rows:
            if row[_TIMEOUT] is not None:
                timeouts[row[_ID]] = row[_TIMEOUT].total_seconds()
    return jobs, []


def _one_by_one(
    cursor: psycopg.AsyncCursor[Any],
    task_names: Mapping[int, str],
    timeouts: dict[int, float] | None,
) -> tuple[list[Job], list[Unreadable]]:
    result = cursor.pgresult
    if result is None:
        return [], []
    loaders = [
        cursor.adapters.get_loader(result.ftype(column), Format(result.fformat(column)))
        for column in range(len(_COLUMNS))
    ]
    columns = [
        (None if cls is None else cls(result.ftype(column), cursor), result.ftype(column))
        for column, cls in enumerate(loaders)
    ]
    jobs: list[Job] = []
    unreadable: list[Unreadable] = []
    for row in range(result.ntuples):
        values: list[Any] = []
        problem: UnreadableJobError | None = None
        for column, (loader, oid) in enumerate(columns):
            value, error = _load(result.get_value(row, column), loader, oid)
            values.append(value)
            if error is not None and problem is None:
                problem = _unreadable(_COLUMNS[column], error)
        if problem is None and values[_PAYLOAD] is not None:
            try:
                values[_PAYLOAD] = json.loads(values[_PAYLOAD])
            except Exception as exc:  # RecursionError, ValueError (too many digits), ...
                values[_PAYLOAD] = None
                problem = _unreadable("payload", exc)
        elif problem is not None:
            values[_PAYLOAD] = None
        job = Job._make(
            (
                *values[: len(JOB_COLUMNS)],
                task_names.get(values[_TASK_ID], "?"),
                values[_QUEUE_NAME],
            )
        )
        if problem is None:
            jobs.append(job)
            if timeouts is not None and values[_TIMEOUT] is not None:
                timeouts[job.id] = values[_TIMEOUT].total_seconds()
        else:
            unreadable.append((job, problem))
    return jobs, unreadable


def _load(raw: bytes | None, loader: Loader | None, oid: int) -> tuple[Any, Exception | None]:
    """One value and, if it cannot be read, why (a timestamp out of Python's
    range is not an error: it becomes the earliest or latest datetime)."""
    if raw is None:
        return None, None
    if loader is None:
        return bytes(raw), None
    try:
        return loader.load(raw), None
    except Exception as exc:
        if oid == _TIMESTAMPTZ_OID:
            return (EARLIEST if _before_year_1(raw, loader) else LATEST), None
        return None, exc


def _before_year_1(raw: bytes, loader: Loader) -> bool:
    if loader.format == Format.BINARY:  # microseconds since 2000-01-01, signed
        return int.from_bytes(raw, "big", signed=True) < 0
    text = bytes(raw).decode()
    return text.startswith("-") or text.endswith("BC")


def _unreadable(column: str, error: Exception) -> UnreadableJobError:
    detail = " ".join(str(error).split()) or type(error).__name__
    return UnreadableJobError(column, f"cannot be read as a Python value ({detail})")
