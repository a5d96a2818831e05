"""A job as stored in ``_private_jobs``, plus its task identifier and queue name."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import Loader
from psycopg.pq import Format

__all__ = [
    "Job",
    "RawPayloadBinaryLoader",
    "RawPayloadLoader",
    "jobs_from_rows",
    "parse_payloads",
    "read_payloads_raw",
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


class RawPayloadLoader(Loader):
    """Loads a ``json`` value as its text, unparsed (bytes).

    Jobs come in batches: :func:`parse_payloads` then reads every payload of
    a batch with one ``json.loads``, about five times faster than one call
    per row. PostgreSQL has already checked that each value is JSON.
    """

    def load(self, data: Buffer) -> bytes:
        return bytes(data)


class RawPayloadBinaryLoader(RawPayloadLoader):
    """:class:`RawPayloadLoader` for results in binary format (``json`` is sent
    as its text in both formats)."""

    format = Format.BINARY


def read_payloads_raw(context: AdaptContext) -> None:
    """Make a connection or cursor load ``json`` columns with :class:`RawPayloadLoader`
    (in text and binary results)."""
    context.adapters.register_loader("json", RawPayloadLoader)
    context.adapters.register_loader("json", RawPayloadBinaryLoader)


def parse_payloads(raw: Sequence[bytes | None]) -> list[Any]:
    """The payloads of a batch of rows, parsed with one ``json.loads``."""
    if not raw:
        return []
    return list(
        json.loads(b"[" + b",".join(b"null" if text is None else text for text in raw) + b"]")
    )


def jobs_from_rows(rows: Sequence[Sequence[Any]], task_names: dict[int, str]) -> list[Job]:
    """Jobs from ``get_jobs`` rows (the 17 job columns, then the queue name),
    read with :func:`read_payloads_raw`: the payloads are parsed in one go."""
    payloads = parse_payloads([row[3] for row in rows])
    return [
        Job._make((*row[:3], payload, *row[4:17], task_names[row[2]], row[17]))
        for row, payload in zip(rows, payloads, strict=True)
    ]
