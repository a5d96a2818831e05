"""``graphile-worker status``: what is in the queue, read-only.

Everything is read in one read-only, repeatable-read transaction (one
snapshot, one ``now()``), so the figures add up. Nothing is migrated or
written; a database without the schema raises SchemaNotInstalledError.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg import IsolationLevel
from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import Loader
from psycopg.types.datetime import TimestamptzLoader

from ..config.database import resolve_connection_string, resolve_schema
from ..db.backoff import one_line
from ..db.connections import connect
from ..errors import GraphileWorkerError, SchemaNotInstalledError
from ..sql import clock as clock_sql
from ..sql import compose
from ..sql import status as status_sql

__all__ = [
    "STRANDED_CAP",
    "STRANDED_TASKS",
    "Counts",
    "QueueStatus",
    "Status",
    "StrandedTask",
    "format_json",
    "format_text",
    "read_status",
]

#: The counters, in the order they are printed.
COUNTERS = ("total", "waiting", "scheduled", "retrying", "paused", "running", "failed")

#: Stranded tasks: tasks not run by a live Python pool examined at most, and
#: runnable jobs counted at most per task (more: the count says so).
STRANDED_TASKS = 1000
STRANDED_CAP = 10_000

#: What a stranded task is, wherever one is shown.
STRANDED_NOTE = "no live Python worker handles it; Node workers are not seen"
#: Why nothing is flagged when no Python pool has a heartbeat row.
STRANDED_UNCHECKED = (
    "not checked: no Python worker heartbeat to compare with "
    "(no Python worker is running, or heartbeats are off)"
)


@dataclass
class Counts:
    """Jobs by state, in the words every command prints: each job is exactly
    one of waiting (never attempted, due now), scheduled (never attempted,
    ``run_at`` in the future), retrying (failed before, will run again),
    paused (held by a pause), running (locked by a worker, or held by a
    crashed one) and failed (``attempts >= max_attempts``)."""

    total: int = 0
    waiting: int = 0
    scheduled: int = 0
    retrying: int = 0
    paused: int = 0
    running: int = 0
    failed: int = 0

    def add(self, other: Counts) -> None:
        for name in COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class QueueStatus(Counts):
    """A named queue's jobs, and who holds the queue's lock."""

    locked_by: str | None = None
    locked_for_seconds: float | None = None


@dataclass
class OldestWaiting:
    job_id: int
    task_identifier: str
    queue_name: str | None
    #: PostgreSQL's text for a time Python cannot hold (``-infinity``, a BC date).
    run_at: datetime | str
    #: None when ``run_at`` is ``-infinity``.
    age_seconds: float | None


@dataclass
class StrandedTask:
    """A task with runnable jobs (not locked, attempts left, due) that no live
    Python pool lists among its tasks."""

    task_identifier: str
    #: Runnable jobs, counted up to STRANDED_CAP (``capped``: there are more).
    runnable: int
    capped: bool
    #: The earliest run_at of its runnable jobs (PostgreSQL's text for a time
    #: Python cannot hold), and how long ago (None for ``-infinity``).
    oldest_run_at: datetime | str
    oldest_age_seconds: float | None


@dataclass
class Status:
    schema: str
    revision: int | None
    time: datetime
    jobs: Counts = field(default_factory=Counts)
    oldest_waiting: OldestWaiting | None = None
    tasks: dict[str, Counts] = field(default_factory=dict)
    queues: dict[str, QueueStatus] = field(default_factory=dict)
    #: The paused jobs by the pause holding them (``queue mail``, ``every task``).
    paused_by: dict[str, int] = field(default_factory=dict)
    #: Tasks that no live Python worker handles, by identifier; None when not
    #: checked (no heartbeat row: nothing to compare with).
    stranded: list[StrandedTask] | None = None


async def read_status(connection_string: str | None = None, *, schema: str | None = None) -> Status:
    """Read the queue's figures (``-c``/DATABASE_URL/PG*, and the schema as the worker's)."""
    conninfo = resolve_connection_string(connection_string)
    schema_name = resolve_schema(schema)
    try:
        async with await connect(conninfo) as conn:
            conn.adapters.register_loader("timestamptz", DatetimeOrText)
            await conn.set_read_only(True)
            await conn.set_isolation_level(IsolationLevel.REPEATABLE_READ)
            async with conn.transaction():
                cur = await conn.execute(
                    compose(status_sql.INSTALLED, schema_name),
                    {"schema": schema_name},
                )
                installed = await cur.fetchone()
                if not installed or not installed[0]:
                    raise SchemaNotInstalledError(
                        f"the graphile-worker schema {schema_name!r} is not installed in this "
                        "database; nothing to report (`graphile-worker --schema-only` installs it)"
                    )

                async def fetch(statement: str) -> list[tuple[Any, ...]]:
                    cursor = await conn.execute(compose(statement, schema_name))
                    return await cursor.fetchall()

                [(now,)] = await fetch(clock_sql.NOW)
                [(revision,)] = await fetch(status_sql.REVISION)
                counts = await fetch(status_sql.COUNTS)
                oldest = await fetch(status_sql.OLDEST_WAITING)
                locked_queues = await fetch(status_sql.LOCKED_QUEUES)
                stranded = await _read_stranded(conn, schema_name)
    except psycopg.Error as exc:
        reason = one_line(exc)
        raise GraphileWorkerError(f"could not read the queue status: {reason}") from None
    status = _assemble(schema_name, revision, now, counts, oldest, locked_queues)
    status.stranded = stranded
    return status


async def _read_stranded(
    conn: psycopg.AsyncConnection[Any], schema: str
) -> list[StrandedTask] | None:
    """The stranded tasks; None when no Python pool has a heartbeat row (or
    the schema has no heartbeats table)."""
    cur = await conn.execute(
        compose(status_sql.HEARTBEATS_INSTALLED, schema),
        {"schema": schema},
    )
    found = await cur.fetchone()
    if not found or not found[0]:
        return None
    cur = await conn.execute(compose(status_sql.ANY_HEARTBEAT, schema))
    if not await cur.fetchone():
        return None
    cur = await conn.execute(
        compose(status_sql.STRANDED_TASKS, schema),
        {"tasks": STRANDED_TASKS, "cap": STRANDED_CAP + 1},
    )
    return [stranded_task(*row) for row in await cur.fetchall()]


def stranded_task(
    identifier: str, runnable: int, oldest_run_at: datetime | str, age: float | None
) -> StrandedTask:
    """A row of ``stranded_tasks`` (read with a cap of STRANDED_CAP + 1)."""
    return StrandedTask(
        identifier,
        min(int(runnable), STRANDED_CAP),
        int(runnable) > STRANDED_CAP,
        oldest_run_at,
        None if age is None else round(float(age), 3),
    )


class DatetimeOrText(Loader):
    """A ``timestamptz`` as a datetime, or as PostgreSQL's text when a datetime
    cannot hold it (``infinity``, ``-infinity``, before year 1 or after 9999):
    a job's ``run_at`` may be any of these (``add_job(..., run_at =>
    '-infinity')``), and status must still report it."""

    def __init__(self, oid: int, context: AdaptContext | None = None) -> None:
        super().__init__(oid, context)
        self._datetime = TimestamptzLoader(oid, context)

    def load(self, data: Buffer) -> datetime | str:
        try:
            return self._datetime.load(data)
        except psycopg.DataError:
            return bytes(data).decode()


def _assemble(
    schema: str,
    revision: int | None,
    now: datetime,
    counts: Iterable[tuple[Any, ...]],
    oldest: list[tuple[Any, ...]],
    locked_queues: Iterable[tuple[Any, ...]],
) -> Status:
    status = Status(schema=schema, revision=revision, time=now)
    for identifier, queue_name, *figures, paused_by in counts:
        group = Counts(*(int(x) for x in figures))
        if group.paused:
            status.paused_by[paused_by] = status.paused_by.get(paused_by, 0) + group.paused
        status.jobs.add(group)
        status.tasks.setdefault(identifier, Counts()).add(group)
        if queue_name is not None:
            status.queues.setdefault(queue_name, QueueStatus()).add(group)
    for queue_name, locked_by, locked_for in locked_queues:
        queue = status.queues.setdefault(queue_name, QueueStatus())
        queue.locked_by = locked_by
        queue.locked_for_seconds = None if locked_for is None else round(float(locked_for), 3)
    if oldest:
        job_id, identifier, queue_name, run_at, age = oldest[0]
        status.oldest_waiting = OldestWaiting(
            job_id, identifier, queue_name, run_at, None if age is None else round(float(age), 3)
        )
    status.paused_by = dict(sorted(status.paused_by.items()))
    status.tasks = dict(sorted(status.tasks.items()))
    status.queues = dict(sorted(status.queues.items()))
    return status


# --- Output -----------------------------------------------------------------------


def format_json(status: Status) -> str:
    """The status as one JSON document (times in ISO 8601)."""
    return json.dumps(asdict(status), default=_iso, indent=2)


def _iso(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot encode {type(value).__name__}")


def format_age(seconds: float) -> str:
    """``42s``, ``3m 12s``, ``2h 05m``, ``4d 03h``."""
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h {whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d {whole % 86400 // 3600:02d}h"


def format_text(status: Status) -> str:
    """The status for people: a summary, then tables by task and by named queue."""
    jobs = status.jobs
    revision = "unknown" if status.revision is None else status.revision
    lines = [
        f"Schema {status.schema!r} (revision {revision}) at {status.time.isoformat()}",
        f"Jobs: {jobs.total}",
        f"  waiting: {jobs.waiting}  (due now, never attempted)",
        f"  scheduled: {jobs.scheduled}  (run_at in the future, never attempted)",
        f"  retrying: {jobs.retrying}  (failed before, will run again)",
        f"  paused: {jobs.paused}  (held by a pause{_held(status.paused_by)})",
        f"  running: {jobs.running}  (locked by a worker)",
        f"  failed: {jobs.failed}  (attempts >= max_attempts)",
    ]
    oldest = status.oldest_waiting
    if oldest is None:
        lines.append("Oldest waiting job: none")
    else:
        queue = f", queue {oldest.queue_name}" if oldest.queue_name else ""
        lines.append(
            f"Oldest waiting job: {oldest.job_id} ({oldest.task_identifier}{queue}), "
            + _due(oldest)
        )
    lines.extend(_stranded_lines(status.stranded))
    if status.tasks:
        lines.append("")
        lines.extend(_table("task", status.tasks.items(), []))
    if status.queues:
        lines.append("")
        lines.extend(
            _table(
                "queue",
                status.queues.items(),
                [
                    "-"
                    if q.locked_by is None
                    else q.locked_by
                    if q.locked_for_seconds is None
                    else f"{q.locked_by} ({format_age(q.locked_for_seconds)})"
                    for q in status.queues.values()
                ],
            )
        )
    return "\n".join(lines)


def _held(paused_by: dict[str, int]) -> str:
    """``: queue mail 3, task report 1`` (the pauses holding jobs), or nothing."""
    return (": " + ", ".join(f"{by} {n}" for by, n in paused_by.items())) if paused_by else ""


def _stranded_lines(stranded: list[StrandedTask] | None) -> list[str]:
    """``Stranded tasks: ...``, then a line per stranded task."""
    if stranded is None:
        return [f"Stranded tasks: {STRANDED_UNCHECKED}"]
    if not stranded:
        return ["Stranded tasks: none"]
    lines = [f"Stranded tasks: {len(stranded)}  (runnable jobs, but {STRANDED_NOTE})"]
    for task in stranded:
        runnable = f"{task.runnable}+" if task.capped else str(task.runnable)
        if task.oldest_age_seconds is None:
            due = f"oldest due since {task.oldest_run_at}"
        else:
            due = f"oldest due for {format_age(task.oldest_age_seconds)}"
        lines.append(f"  {task.task_identifier}: {runnable} runnable, {due}")
    return lines


def _due(oldest: OldestWaiting) -> str:
    """How long a job has been due; a run_at a datetime cannot hold is shown
    as PostgreSQL writes it."""
    if oldest.age_seconds is None:
        return f"due since {oldest.run_at}"
    due = f"due for {format_age(oldest.age_seconds)}"
    return due if isinstance(oldest.run_at, datetime) else f"{due} (run_at {oldest.run_at})"


def _table(kind: str, groups: Iterable[tuple[str, Counts]], locks: list[str]) -> list[str]:
    header = [kind, *COUNTERS] + (["locked_by"] if locks else [])
    body = [
        [name, *(str(getattr(counts, c)) for c in COUNTERS)] + ([locks[i]] if locks else [])
        for i, (name, counts) in enumerate(groups)
    ]
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    out = []
    for row in [header, *body]:
        cells = [
            cell.ljust(width) if i == 0 or i > len(COUNTERS) else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
    return out
