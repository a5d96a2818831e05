"""The queue's depth by task, named queue and state, its oldest waiting job
by task and named queue, the pauses in force and the limits' use, for
metrics: one bounded read, cached.

By task means the worker's own tasks, each on its own, and every other task
of the queue together under :data:`OTHER_TASKS`; by named queue means the
:data:`QUEUE_LABELS` named queues with the most jobs, each on its own, the
others together under :data:`OTHER_QUEUES`, and the jobs of no named queue
under "": the number of series stays bounded by the worker's code and these
constants, not by the names found in the table.

However often the metrics are scraped, and however large the queue, a worker
sends at most one depth query every :data:`CACHE_SECONDS`, and that query
reads at most :data:`SCAN_LIMIT` rows of the jobs table (more: the figures
are lower bounds, and say so). It runs on the worker's connection pool, on
the event loop; a scrape from another thread (prometheus-client's HTTP
server, a threaded web app) waits for it, up to :data:`WAIT_SECONDS`. The
same read, in the same transaction, lists the pauses in force (at most
:data:`PAUSES_LIMIT`: they are few, made by people) and the limits with
their use (at most :data:`LIMITS_LIMIT`, each over at most
:data:`PARTITIONS_READ` partition values), and the stranded tasks, with
runnable jobs that no live Python pool handles (at most
:data:`~worker_cli.observe.status_report.STRANDED_TASKS`, each counted up to
:data:`~worker_cli.observe.status_report.STRANDED_CAP`), and the workflows by
state: the running ones, and those that finished in the last day (each read
through its index, up to :data:`WORKFLOWS_CAP`). A
scrape on the event loop's own thread (an ASGI app sharing the worker's
loop) cannot wait: it gets the figures of the previous query, and the next
scrape the new ones.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from psycopg_pool import AsyncConnectionPool

from ..db.backoff import one_line
from ..jobs.workflow_state import WORKFLOW_STATES
from ..sql import compose
from ..sql import depth_metrics as metrics_sql
from ..sql import limits as limits_sql
from ..sql import status as status_sql
from ..sql import workflow_metrics as workflow_metrics_sql
from .status_report import STRANDED_CAP, STRANDED_TASKS

if TYPE_CHECKING:
    from .pool_view import ObservedPool

__all__ = [
    "CACHE_SECONDS",
    "EMPTY_GROUP",
    "LIMITS_LIMIT",
    "OTHER_QUEUES",
    "OTHER_TASKS",
    "PARTITIONS_READ",
    "PAUSES_LIMIT",
    "QUEUE_LABELS",
    "SCAN_LIMIT",
    "STATES",
    "WORKFLOWS_CAP",
    "Depth",
    "Group",
    "LimitUse",
    "QueueDepth",
]

logger = logging.getLogger("graphile_worker.metrics")

#: The states of a job, as every command prints them (``graphile-worker
#: status`` counts them so): every job is exactly one of them. (Before issue
#: 43 the labels were waiting, scheduled, locked and permanently_failed.)
STATES = ("waiting", "scheduled", "retrying", "paused", "running", "failed")
#: The ``task`` label of the jobs of every task the worker does not run (in
#: parentheses, unlike a usual task name; a task of the worker's so named
#: would add up with them), and the ``queue`` label of the named queues past
#: the :data:`QUEUE_LABELS` with the most jobs.
OTHER_TASKS = "(other)"
OTHER_QUEUES = "(other)"
#: Named queues that have a ``queue`` label of their own at most (those with
#: the most jobs read, then by name); the jobs of no named queue have "".
QUEUE_LABELS = 20
#: Seconds the figures are reused for.
CACHE_SECONDS = 5.0
#: Rows of the jobs table the query reads at most.
SCAN_LIMIT = 100_000
#: Seconds a scrape waits for a query (then it gets the previous figures).
WAIT_SECONDS = 5.0
#: Pauses in force listed at most (a series each).
PAUSES_LIMIT = 1000
#: Limits read at most (up to four series each), and partition values of
#: each (beyond them, a partitioned limit's figures are lower bounds).
LIMITS_LIMIT = 1000
PARTITIONS_READ = 1000
#: Workflows counted at most: the running ones, and (all states together)
#: those that finished in the last day, the last to finish first.
WORKFLOWS_CAP = 10_000

#: The clock of the cache (a module global, so that a test can move it).
_clock = time.monotonic


@dataclass(frozen=True)
class LimitUse:
    """A limit and how much of it is in use (over every partition value
    read); ``max_running`` and ``max_starts`` are per partition value when
    it has ``partition_by``, None when it sets none."""

    kind: str
    name: str
    running: int
    max_running: int | None
    recent_starts: int
    max_starts: int | None


@dataclass(frozen=True)
class Group:
    """The jobs of one task and named queue (labels as in :class:`Depth`)."""

    #: In the order of STATES: each job in exactly one.
    states: tuple[int, ...]
    #: The jobs that failed an attempt before and will run again, paused
    #: or not (the ``retrying`` state's, and the paused ones among them).
    retrying: int
    #: Seconds since the run_at of the oldest due job (paused ones too; inf
    #: for a run_at of -infinity), None when none is due.
    oldest_age: float | None


#: A task and queue without any job.
EMPTY_GROUP = Group((0,) * len(STATES), 0, None)


@dataclass(frozen=True)
class Depth:
    """Jobs by (task, queue): task one of the worker's tasks or
    :data:`OTHER_TASKS`, queue a named queue, :data:`OTHER_QUEUES` or ""
    (no named queue); only the pairs that have jobs."""

    groups: dict[tuple[str, str], Group]
    #: The table held more rows than the query reads: the counts are lower bounds.
    truncated: bool
    #: The pauses in force: (kind, name), kind ``queue`` or ``task``, name ``*``
    #: for every named queue or every task.
    paused: tuple[tuple[str, str], ...] = ()
    #: The limits, by kind and name.
    limits: tuple[LimitUse, ...] = ()
    #: The stranded tasks and their runnable jobs (up to STRANDED_CAP), by
    #: task: none when no Python pool has a heartbeat row.
    stranded: tuple[tuple[str, int], ...] = ()
    #: The workflows by state, in the order of WORKFLOW_STATES: running now,
    #: and finished in the last day (each up to WORKFLOWS_CAP); empty when
    #: they could not be read.
    workflows: tuple[tuple[str, int], ...] = ()


class QueueDepth:
    """The cached depth figures of one worker pool's queue."""

    def __init__(self, pool: ObservedPool, loop: asyncio.AbstractEventLoop) -> None:
        self._pool = pool
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._statement = compose(metrics_sql.QUEUE_DEPTH, pool.options.schema)
        self._pauses = compose(metrics_sql.PAUSES_IN_FORCE, pool.options.schema)
        self._limits = compose(limits_sql.LIMIT_USAGE, pool.options.schema)
        self._stranded = compose(status_sql.STRANDED_TASKS, pool.options.schema)
        self._workflows = compose(workflow_metrics_sql.WORKFLOWS_BY_STATE, pool.options.schema)
        self._lock = threading.Lock()
        self._figures: Depth | None = None
        self._read_at = -math.inf
        #: Set when the query in flight is done (None: none in flight).
        self._pending: threading.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        #: Queries sent so far.
        self.queries = 0

    def read(self) -> Depth | None:
        """The figures (any thread), queried again when older than
        :data:`CACHE_SECONDS`; None when they could not be read."""
        with self._lock:
            if self._closed or _clock() - self._read_at < CACHE_SECONDS:
                return self._figures
            pending = self._pending
            if pending is None:
                pending = self._pending = threading.Event()
                try:
                    self._loop.call_soon_threadsafe(self._start)
                except RuntimeError:  # the loop is closed: the worker is gone
                    self._pending = None
                    return self._figures
        if threading.get_ident() != self._loop_thread:
            pending.wait(WAIT_SECONDS)
        return self._figures

    async def aclose(self) -> None:
        """No more queries; the one in flight is cancelled and awaited."""
        with self._lock:
            self._closed = True
            task = self._task
        if task is not None:
            task.cancel()
            await asyncio.wait({task})

    def _start(self) -> None:
        """On the loop: start the query :meth:`read` asked for."""
        if self._closed:
            self._done(self._figures, -math.inf)
            return
        self._task = self._loop.create_task(self._refresh())

    async def _refresh(self) -> None:
        figures: Depth | None = None
        read_at = -math.inf
        try:
            utils = self._pool.utils
            if utils is not None:  # else the pool is not running: ask again next time
                self.queries += 1
                read_at = _clock()
                figures = await self._query(utils.pool)
        except Exception as exc:
            logger.warning("Could not read the queue depth for the metrics: %s", one_line(exc))
        finally:
            self._done(figures, read_at)

    def _done(self, figures: Depth | None, read_at: float) -> None:
        with self._lock:
            self._figures = figures
            self._read_at = read_at
            pending, self._pending = self._pending, None
            self._task = None
        if pending is not None:
            pending.set()

    async def _query(self, pool: AsyncConnectionPool[Any]) -> Depth:
        params = {
            "limit": SCAN_LIMIT + 1,
            "tasks": sorted(self._pool.tasks),
            "queues": QUEUE_LABELS,
            "other": OTHER_QUEUES,
        }
        async with pool.connection() as conn, conn.transaction():
            await conn.execute(metrics_sql.STATEMENT_TIMEOUT)
            cur = await conn.execute(self._statement, params)
            rows = await cur.fetchall()
            cur = await conn.execute(self._pauses, {"limit": PAUSES_LIMIT})
            paused = tuple((str(kind), str(name)) for kind, name in await cur.fetchall())
            cur = await conn.execute(
                self._limits, {"limit": LIMITS_LIMIT, "partitions": PARTITIONS_READ}
            )
            limits = tuple(_limit_use(row) for row in await cur.fetchall())
            cur = await conn.execute(self._stranded, {"tasks": STRANDED_TASKS, "cap": STRANDED_CAP})
            stranded = tuple((str(row[0]), int(row[1])) for row in await cur.fetchall())
            cur = await conn.execute(self._workflows, {"cap": WORKFLOWS_CAP})
            counted = {str(state): int(count) for state, count in await cur.fetchall()}
        workflows = tuple((state, counted.get(state, 0)) for state in WORKFLOW_STATES)
        scanned = sum(int(row[9]) for row in rows)
        return Depth(
            _groups(rows),
            truncated=scanned > SCAN_LIMIT,
            paused=paused,
            limits=limits,
            stranded=stranded,
            workflows=workflows,
        )


def _groups(rows: list[tuple[Any, ...]]) -> dict[tuple[str, str], Group]:
    """The rows of :data:`~worker_cli.sql.depth_metrics.QUEUE_DEPTH` by (task,
    queue); a worker's own task named like the bucket of the others adds up
    with it."""
    groups: dict[tuple[str, str], Group] = {}
    for task, queue, *figures in rows:
        key = (OTHER_TASKS if task is None else str(task), str(queue))
        states = tuple(int(count) for count in figures[: len(STATES)])
        retrying, age = int(figures[len(STATES)]), figures[len(STATES) + 2]
        oldest = None if age is None else float(age)
        before = groups.get(key)
        if before is not None:
            states = tuple(a + b for a, b in zip(before.states, states, strict=True))
            retrying += before.retrying
            ages = [x for x in (before.oldest_age, oldest) if x is not None]
            oldest = max(ages) if ages else None
        groups[key] = Group(states, retrying, oldest)
    return groups


def _limit_use(row: tuple[Any, ...]) -> LimitUse:
    """A row of :data:`~worker_cli.sql.limits.LIMIT_USAGE` (its columns:
    kind, name, max_running, max_starts, period, partition_by, updated_at,
    running, busiest_running, recent_starts, busiest_starts, partitions)."""
    kind, name, max_running, max_starts = row[:4]
    return LimitUse(str(kind), str(name), int(row[7]), max_running, int(row[9]), max_starts)
