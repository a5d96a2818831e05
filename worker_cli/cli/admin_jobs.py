"""What the admin commands (:mod:`.admin_commands`) do in the database, and
how they print it: a :class:`Session` on one autocommit connection, which
lists and counts the jobs a filter matches and acts on jobs by id, in
batches of :data:`BATCH` ids, each batch a transaction of its own (a filter
matching 100,000 jobs never holds one long transaction).

The database part (:class:`Filters`, :class:`Session`, ...) lives in
:mod:`worker_cli.client.admin_batches`, shared with the dashboard's bulk
actions; the statements are :mod:`worker_cli.sql.admin`; the
actions go through graphile-worker's admin functions, so a job a worker
holds is left alone (and reported), as those functions leave it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import psycopg

from ..client.admin_batches import BATCH, Filters, Matches, Outcome, Session
from ..config.database import resolve_connection_string
from ..db.backoff import one_line
from ..db.connections import connect
from ..errors import GraphileWorkerError
from ..observe.status_report import DatetimeOrText
from ..schema.probe import schema_required

__all__ = [
    "BATCH",
    "Filters",
    "Matches",
    "Outcome",
    "Session",
    "format_jobs",
    "format_outcome",
    "jobs_json",
    "session",
]

#: Ids a text summary names at most per line (the rest are counted).
SHOWN_IDS = 20
#: Characters of a job's last error the ``jobs`` table shows (its first line).
ERROR_WIDTH = 60


@asynccontextmanager
async def session(connection: str | None, schema: str) -> AsyncIterator[Session]:
    """A :class:`Session`; a missing schema, or any database error, is a
    GraphileWorkerError of one line."""
    conninfo = resolve_connection_string(connection)
    try:
        async with await connect(conninfo, autocommit=True) as conn:
            conn.adapters.register_loader("timestamptz", DatetimeOrText)
            with schema_required(schema):
                yield Session(conn, schema)
    except psycopg.Error as exc:
        raise GraphileWorkerError(f"the command failed: {one_line(exc)}") from None


# --- Output -----------------------------------------------------------------------


def _when(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def jobs_json(jobs: list[dict[str, Any]]) -> str:
    """The jobs as one JSON array (times in ISO 8601; a run_at a datetime
    cannot hold as PostgreSQL writes it)."""
    return json.dumps([{name: _when(value) for name, value in job.items()} for job in jobs])


def _first_line(error: str | None) -> str:
    if not error:
        return ""
    line = error.strip().splitlines()[0] if error.strip() else ""
    return line if len(line) <= ERROR_WIDTH else line[: ERROR_WIDTH - 1] + "…"


def format_jobs(jobs: list[dict[str, Any]]) -> list[str]:
    """The jobs as a table: id, task, queue, state (a paused job's with the
    pause holding it: ``paused (queue mail)``), attempts, run_at, the first
    line of the last error."""
    header = ["id", "task", "queue", "state", "attempts", "run_at", "last_error"]
    body = [
        [
            str(job["id"]),
            job["task_identifier"],
            job["queue_name"] or "-",
            job["state"] + (f" ({job['paused_by']})" if job["paused_by"] else ""),
            f"{job['attempts']}/{job['max_attempts']}",
            job["run_at"].isoformat(timespec="seconds")
            if isinstance(job["run_at"], datetime)
            else str(job["run_at"]),
            _first_line(job["last_error"]),
        ]
        for job in jobs
    ]
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    return [
        "  ".join(
            cell.rjust(width) if i == 0 else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [header, *body]
    ]


def _ids(ids: list[int]) -> str:
    shown = ", ".join(str(one) for one in ids[:SHOWN_IDS])
    return shown + (f" (and {len(ids) - SHOWN_IDS:,} more)" if len(ids) > SHOWN_IDS else "")


def _jobs(count: int) -> str:
    return f"{count:,} job" + ("" if count == 1 else "s")


def format_outcome(outcome: Outcome, done: str, unchanged: str) -> list[str]:
    """The outcome for people: what was ``done`` (``Retried``), then a line
    for each kind of job left alone (``unchanged``: why, for this action)."""
    lines = [f"{done} {_jobs(len(outcome.changed))}" + _listed(outcome.changed)]
    if outcome.locked:
        lines.append(
            f"Skipped {_jobs(len(outcome.locked))} locked by a worker (left alone): "
            + _ids(outcome.locked)
        )
    if outcome.unchanged:
        lines.append(
            f"Left {_jobs(len(outcome.unchanged))} as they were ({unchanged}): "
            + _ids(outcome.unchanged)
        )
    if outcome.missing:
        lines.append("Not found: " + _ids(outcome.missing))
    if outcome.stopped and outcome.action == "cancel":
        lines.append(
            f"Told {len(outcome.stopped):,} running job"
            + ("" if len(outcome.stopped) == 1 else "s")
            + " to stop (recorded as cancelled when "
            + ("it ends" if len(outcome.stopped) == 1 else "they end")
            + "): "
            + _ids(outcome.stopped)
        )
    elif outcome.stopped:
        lines.append(
            f"Job {_ids(outcome.stopped)} is running on a worker: it keeps running, "
            "but lost its key and will not be retried"
        )
    return lines


def _listed(ids: list[int]) -> str:
    return f": {_ids(ids)}" if ids else ""
