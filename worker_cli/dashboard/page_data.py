"""What each page shows, read from the database (the statements are in
:mod:`worker_cli.sql.dashboard`; every one of them is bounded).

Each function takes a connection inside a read-only, repeatable-read
transaction (see :meth:`.app.Dashboard.reading`), so one page's figures come
from one snapshot and one ``now()``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any, LiteralString

import psycopg
from psycopg.rows import dict_row

from ..jobs.job_state import JobProgress
from ..jobs.schedule import Schedule
from ..observe.status_report import STRANDED_CAP
from ..schema.migrate import MigrationFiles
from ..sql import compose
from ..sql import dashboard as dashboard_sql
from ..sql import job_progress as job_progress_sql
from ..sql import limits as limits_sql
from ..sql import status as status_sql
from . import filters as queries
from .finished import FinishedFilter, FinishedPage
from .job_counts import Census, Count, sample_percent

__all__ = [
    "JobFilter",
    "JobsPage",
    "LockHolder",
    "Overview",
    "PoolsPage",
    "Reader",
]

Row = dict[str, Any]

#: Jobs shown on one page of the list; latest failures on the overview;
#: named queues, pauses and limits on the overview; pools, cron items and
#: tasks listed at most.
PAGE_SIZE = 50
FAILURES_SHOWN = 10
QUEUES_SHOWN = 50
PAUSES_SHOWN = 200
LIMITS_SHOWN = 200
#: Partition values of one limit read at most (its figures are then over these).
PARTITIONS_READ = 1000
LIST_LIMIT = 500
#: Stranded tasks shown on the overview at most (runnable jobs are counted up
#: to STRANDED_CAP per task, as by `graphile-worker status`).
STRANDED_SHOWN = 200

#: The cursor of the first page: below every id.
NEWEST = 2**63 - 1

#: A result stored in more bytes than this is not previewed in the Finished
#: list (its size is shown); a finished job's page reads the first
#: RESULT_READ characters of a result.
RESULT_PREVIEW_MAX = 16 * 1024
RESULT_READ = 1_000_000
#: A job's page shows its ATTEMPT_ERRORS_SHOWN newest attempt errors, each
#: cut at ERROR_READ characters.
ATTEMPT_ERRORS_SHOWN = 50
ERROR_READ = 20_000
#: A job's page shows the kept logs of its JOB_LOGS_SHOWN newest attempts
#: (each at most 64 KiB: the worker's bound).
JOB_LOGS_SHOWN = 20


@dataclass(frozen=True)
class JobFilter:
    """The job list's filters and cursor (from the query string)."""

    task: str | None = None
    queue: str | None = None
    state: str | None = None
    before: int = NEWEST

    def query(self, **changes: Any) -> dict[str, str]:
        """The query string of this filter (with ``changes``), without empty values."""
        values = {
            "task": self.task,
            "queue": self.queue,
            "state": self.state,
            "before": None if self.before == NEWEST else self.before,
            **changes,
        }
        return {name: str(value) for name, value in values.items() if value not in (None, "")}


@dataclass
class JobsPage:
    """One page of the job list."""

    filter: JobFilter
    rows: list[Row]
    #: Jobs the window examined below the cursor, and the lowest id among them.
    examined: int
    lowest: int | None
    #: The cursor of the next page (older jobs), or None at the oldest job.
    next_before: int | None
    #: True when the window ran out before the page was full: the next page
    #: searches older jobs (a rare filter on a long table).
    window_ran_out: bool


@dataclass
class Liveness:
    """The overview's line about the worker pools, from the heartbeats the
    Worker pools page reads (the first LIST_LIMIT rows) and the census's lock
    holders."""

    #: Pools whose last beat is within their timeout, and their slots.
    alive: int = 0
    slots: int = 0
    #: Pools silent past their timeout (dead; another pool releases their
    #: jobs and deletes the row), and the latest beat among them.
    silent: int = 0
    last_silent_beat: datetime | None = None
    #: Holders of running jobs without a heartbeat row (Node workers, pools
    #: with heartbeats off, or a dead pool's row deleted already).
    unseen: int = 0

    @classmethod
    def of(cls, beats: list[Row], census: Census) -> Liveness:
        live = [beat for beat in beats if beat["alive"]]
        silent = [beat for beat in beats if not beat["alive"]]
        known = {beat["pool_id"] for beat in beats}
        return cls(
            alive=len(live),
            slots=sum(int(beat["concurrency"] or 0) for beat in live),
            silent=len(silent),
            last_silent_beat=max((beat["beat_at"] for beat in silent), default=None),
            unseen=sum(1 for pool_id in census.holders if pool_id not in known),
        )


@dataclass
class Overview:
    now: datetime
    revision: int | None
    census: Census
    oldest_waiting: Row | None
    queues: list[Row]
    queues_truncated: bool
    failures: list[Row]
    #: Jobs the latest-failures window examined (WINDOW when the table has more).
    failures_examined: int
    #: The pauses in force, by kind and name (the first PAUSES_SHOWN).
    pauses: list[Row] = field(default_factory=list)
    pauses_truncated: bool = False
    #: The limits, by kind and name (the first LIMITS_SHOWN), with their use.
    limits: list[Row] = field(default_factory=list)
    limits_truncated: bool = False
    #: Tasks with runnable jobs that no live Python pool handles (the first
    #: STRANDED_SHOWN by identifier; none when no pool has a heartbeat row).
    stranded: list[Row] = field(default_factory=list)
    stranded_truncated: bool = False
    #: The worker pools alive, silent, and unseen (holding jobs without a heartbeat).
    liveness: Liveness = field(default_factory=Liveness)

    def stranded_of(self, task: str) -> Row | None:
        """The stranded-task row of ``task``; None if it is not stranded."""
        for row in self.stranded:
            if row["task_identifier"] == task:
                return row
        return None

    def pause_of(self, kind: str, name: str) -> Row | None:
        """The pause holding back the named queue or the task ``name``: its
        own, else the pause of every one (``*``); None if neither is in force."""
        found = None
        for pause in self.pauses:
            if pause["kind"] == kind and pause["name"] == name:
                return pause
            if pause["kind"] == kind and pause["name"] == "*":
                found = pause
        return found

    def limit_of(self, kind: str, name: str) -> Row | None:
        """The limit of the named queue or the task ``name``; None if it has none."""
        for limit in self.limits:
            if limit["kind"] == kind and limit["name"] == name:
                return limit
        return None


@dataclass
class LockHolder:
    """A worker pool that holds locks, or has a heartbeat row, or both."""

    pool_id: str
    heartbeat: Row | None = None
    jobs: Count | None = None
    queues: int = 0
    locked_since: datetime | None = None

    @property
    def alive(self) -> bool:
        return bool(self.heartbeat and self.heartbeat["alive"])


@dataclass
class PoolsPage:
    now: datetime
    census: Census
    live: list[LockHolder] = field(default_factory=list)
    #: Pools without a live heartbeat that hold locks (or left a stale row).
    others: list[LockHolder] = field(default_factory=list)


#: A kept log line: its time (UTC), its level, its message (attempt_log.py).
_LOG_LINE = re.compile(r"^\S+Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


def log_lines(text: str) -> tuple[list[tuple[str, str]], int]:
    """An attempt's kept text as (level, line) pairs, level lower case
    (``info``, ``error``...; a line that continues an entry, its message's
    further lines or its traceback, has the entry's; the line saying how many
    were dropped, ``note``), and how many entries it holds."""
    lines = []
    level, entries = "note", 0
    for line in text.split("\n") if text else []:
        found = _LOG_LINE.match(line)
        if found:
            level, entries = found.group(1).lower(), entries + 1
        lines.append((level, line))
    return lines, entries


@cache
def _py_revisions() -> tuple[int, ...]:
    """This version's Python migrations (read from the package once: /healthz
    checks them on every request)."""
    return tuple(MigrationFiles().py_revisions())


class Reader:
    """Runs the dashboard's statements on one connection."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], schema: str) -> None:
        self.conn = conn
        self.schema = schema

    async def rows(self, statement: LiteralString, **params: Any) -> list[Row]:
        cur = self.conn.cursor(row_factory=dict_row)
        await cur.execute(compose(statement, self.schema), params)
        return await cur.fetchall()

    async def row(self, statement: LiteralString, **params: Any) -> Row | None:
        found = await self.rows(statement, **params)
        return found[0] if found else None

    # --- the schema -----------------------------------------------------------

    async def schema_problem(self) -> str | None:
        """Why the dashboard cannot show this schema, or None."""
        found = await self.row(dashboard_sql.INSTALLED, schema=self.schema)
        if not found or not found["jobs"]:
            return (
                f"the graphile-worker schema {self.schema!r} is not installed in this database "
                "(`graphile-worker --schema-only` installs it)"
            )
        applied = set()
        if found["py_migrations"]:
            applied = set((await self.row(dashboard_sql.PY_MIGRATIONS) or {}).get("ids") or [])
        missing = [n for n in _py_revisions() if n not in applied]
        if missing:
            return (
                f"the schema {self.schema!r} lacks this version's Python migrations "
                f"({', '.join(map(str, missing))}): start a worker of this version, or run "
                "`graphile-worker --schema-only`"
            )
        return None

    # --- pages ----------------------------------------------------------------

    async def census(self) -> Census:
        found = await self.row(dashboard_sql.JOBS_PAGES, schema=self.schema)
        percent = sample_percent(int(found["pages"]) if found else 0)
        return Census.from_rows(percent, await self.rows(dashboard_sql.CENSUS, percent=percent))

    async def overview(self) -> Overview:
        now = await self.row(dashboard_sql.NOW)
        revision = await self.row(dashboard_sql.REVISION)
        census = await self.census()
        queues = await self.rows(dashboard_sql.QUEUES, limit=QUEUES_SHOWN + 1)
        failures = await self.rows(
            dashboard_sql.LATEST_FAILURES, window=queries.WINDOW, limit=FAILURES_SHOWN
        )
        pauses = await self.pauses(PAUSES_SHOWN + 1)
        limits = await self.limits(LIMITS_SHOWN + 1)
        stranded = await self.stranded(STRANDED_SHOWN + 1)
        beats = await self.rows(dashboard_sql.HEARTBEATS, limit=LIST_LIMIT)
        assert now is not None
        return Overview(
            now=now["now"],
            revision=revision["revision"] if revision else None,
            census=census,
            oldest_waiting=await self.row(dashboard_sql.OLDEST_DUE),
            queues=queues[:QUEUES_SHOWN],
            queues_truncated=len(queues) > QUEUES_SHOWN,
            failures=[row for row in failures if row["id"] is not None],
            failures_examined=failures[0]["examined"] if failures else 0,
            pauses=pauses[:PAUSES_SHOWN],
            pauses_truncated=len(pauses) > PAUSES_SHOWN,
            limits=limits[:LIMITS_SHOWN],
            limits_truncated=len(limits) > LIMITS_SHOWN,
            stranded=stranded[:STRANDED_SHOWN],
            stranded_truncated=len(stranded) > STRANDED_SHOWN,
            liveness=Liveness.of(beats, census),
        )

    async def stranded(self, limit: int = STRANDED_SHOWN) -> list[Row]:
        """Tasks with runnable jobs that no live Python pool handles (at most
        ``limit``), each with its runnable jobs up to STRANDED_CAP (``capped``:
        more) and the earliest run_at among them."""
        found = await self.rows(status_sql.STRANDED_TASKS, tasks=limit, cap=STRANDED_CAP + 1)
        for row in found:
            row["capped"] = row["runnable"] > STRANDED_CAP
            row["runnable"] = min(row["runnable"], STRANDED_CAP)
        return found

    async def pauses(self, limit: int = PAUSES_SHOWN) -> list[Row]:
        """The pauses in force, by kind and name (at most ``limit``)."""
        return await self.rows(dashboard_sql.PAUSES, limit=limit)

    async def limits(self, limit: int = LIMITS_SHOWN) -> list[Row]:
        """The limits, by kind and name (at most ``limit``), each with its use
        over its first PARTITIONS_READ partition values (``partitions_over``:
        it has more)."""
        found = await self.rows(limits_sql.LIMIT_USAGE, limit=limit, partitions=PARTITIONS_READ + 1)
        for row in found:
            row["partitions_over"] = row["partitions"] > PARTITIONS_READ
            row["partitions"] = min(row["partitions"], PARTITIONS_READ)
        return found

    async def jobs(self, job_filter: JobFilter) -> JobsPage:
        found = await self.rows(
            dashboard_sql.JOBS_PAGE,
            before=job_filter.before,
            window=queries.WINDOW,
            limit=PAGE_SIZE + 1,
            task=job_filter.task,
            queue=job_filter.queue,
            state=job_filter.state,
        )
        examined, lowest = found[0]["examined"], found[0]["lowest"]
        rows = [row for row in found if row["id"] is not None]
        if len(rows) > PAGE_SIZE:
            rows = rows[:PAGE_SIZE]
            return JobsPage(job_filter, rows, examined, lowest, rows[-1]["id"], False)
        if examined == queries.WINDOW:  # jobs below this window remain
            return JobsPage(job_filter, rows, examined, lowest, lowest, True)
        return JobsPage(job_filter, rows, examined, lowest, None, False)

    async def job(self, job_id: int) -> Row | None:
        return await self.row(dashboard_sql.JOB, id=job_id)

    async def finished(self, finished_filter: FinishedFilter) -> FinishedPage:
        found = await self.rows(
            dashboard_sql.FINISHED_PAGE,
            upper_id=finished_filter.cursor,
            after=finished_filter.after,
            before=finished_filter.before,
            window=queries.WINDOW,
            limit=PAGE_SIZE + 1,
            task=finished_filter.task,
            state=finished_filter.state,
            preview_max=RESULT_PREVIEW_MAX,
        )
        latest = await self.row(dashboard_sql.LATEST_FINISHED)
        examined = found[0]["examined"]
        rows = [row for row in found if row["id"] is not None]
        if len(rows) > PAGE_SIZE:
            rows = rows[:PAGE_SIZE]
            return FinishedPage(finished_filter, rows, examined, rows[-1]["id"], False, latest)
        if examined == queries.WINDOW:  # rows below this window remain
            lowest = found[0]["lowest_id"]
            return FinishedPage(finished_filter, rows, examined, lowest, True, latest)
        return FinishedPage(finished_filter, rows, examined, None, False, latest)

    async def finished_job(self, job_id: int) -> Row | None:
        """A finished job's history record, or None."""
        return await self.row(dashboard_sql.FINISHED_JOB, id=job_id, cut=RESULT_READ)

    async def attempt_errors(self, job_id: int) -> list[Row]:
        """The job's attempt errors, newest first (at most ATTEMPT_ERRORS_SHOWN;
        each row says how many there are)."""
        return await self.rows(
            dashboard_sql.ATTEMPT_ERRORS, id=job_id, limit=ATTEMPT_ERRORS_SHOWN, cut=ERROR_READ
        )

    async def job_progress(self, job_id: int) -> JobProgress | None:
        """The job's progress as its task last reported it, or None."""
        found = await self.row(job_progress_sql.JOB_PROGRESS, job_id=job_id)
        return None if found is None else JobProgress(**found)

    async def job_logs(self, job_id: int) -> list[Row]:
        """The job's kept logs, newest attempt first (at most JOB_LOGS_SHOWN;
        each row says how many there are), each with its ``lines`` as
        (level, text) pairs and the entries they hold (``line_count``:
        :func:`log_lines`)."""
        found = await self.rows(dashboard_sql.JOB_LOGS, id=job_id, limit=JOB_LOGS_SHOWN)
        for row in found:
            row["lines"], row["line_count"] = log_lines(row["lines"])
        return found

    async def task_identifiers(self) -> list[str]:
        return [
            row["identifier"]
            for row in await self.rows(dashboard_sql.TASK_IDENTIFIERS, limit=LIST_LIMIT)
        ]

    async def pools(self) -> PoolsPage:
        now = await self.row(dashboard_sql.NOW)
        assert now is not None
        census = await self.census()
        page = PoolsPage(now=now["now"], census=census)
        holders: dict[str, LockHolder] = {}
        for beat in await self.rows(dashboard_sql.HEARTBEATS, limit=LIST_LIMIT):
            holders[beat["pool_id"]] = LockHolder(beat["pool_id"], heartbeat=beat)
        for pool_id, held in census.holders.items():
            holder = holders.setdefault(pool_id, LockHolder(pool_id))
            holder.jobs = census.count(held.jobs)
            holder.locked_since = held.locked_since
        for row in await self.rows(dashboard_sql.QUEUE_HOLDERS, window=queries.WINDOW):
            holder = holders.setdefault(row["locked_by"], LockHolder(row["locked_by"]))
            holder.queues = int(row["queues"])
            since = row["locked_since"]
            if holder.locked_since is None or (since and since < holder.locked_since):
                holder.locked_since = since
        for holder in holders.values():
            if holder.jobs is None and (holder.heartbeat is not None or census.exact):
                holder.jobs = census.count(0)
            (page.live if holder.alive else page.others).append(holder)
        page.others.sort(key=lambda h: (h.locked_since is None, h.locked_since, h.pool_id))
        return page

    async def pool_alive(self, pool_id: str) -> Row | None:
        return await self.row(dashboard_sql.POOL_ALIVE, pool_id=pool_id)

    async def crontab(self) -> list[Row]:
        return await self.rows(dashboard_sql.CRONTAB, limit=LIST_LIMIT)

    async def schedules(self, limit: int = LIST_LIMIT) -> list[Schedule]:
        """The schedules in the database, by identifier (at most ``limit``)."""
        return [Schedule(**row) for row in await self.rows(dashboard_sql.SCHEDULES, limit=limit)]

    async def now(self) -> datetime:
        found = await self.row(dashboard_sql.NOW)
        assert found is not None
        return found["now"]  # type: ignore[no-any-return]
