"""Prometheus metrics of a running worker (the ``metrics`` extra: ``prometheus-client``).

``graphile-worker --metrics-port PORT`` serves them at ``/metrics``
(:func:`serve_metrics`); in library mode ``run(..., metrics_registry=registry)``
adds them to a registry the application already serves (:func:`attach_metrics`).

Where each figure comes from, so that nothing is paid when metrics are off
(none of this is imported then) and little when they are on:

- ``graphile_worker_jobs_total{task, outcome}`` and
  ``graphile_worker_job_duration_seconds{task}``: the pool's ``job:success``,
  ``job:error`` and ``job:failed`` events (their ``duration_ms``), counted on
  the event loop (:class:`~worker_cli.observe.job_stats.JobStats`); outcome
  ``success``, ``retry`` (a failed attempt that another follows) or, for a
  failed attempt that ends its job, ``failure``, ``cancelled`` or ``timeout``;
- ``graphile_worker_jobs_running{task}`` (every task of the pool, 0 when
  idle), ``_jobs_stuck`` and ``graphile_worker_local_queue_length``: the
  pool's read-only figures, read when scraped;
- ``graphile_worker_queue_depth{task, queue, state}`` (states that partition:
  each job in one), ``graphile_worker_queue_depth_retrying{task, queue}``
  and ``graphile_worker_oldest_runnable_job_age_seconds{task, queue}``: one
  bounded query, cached (:class:`~worker_cli.observe.queue_depth.QueueDepth`);
  ``task`` is one of the worker's tasks, or ``(other)`` for the jobs of every
  other task together; ``queue`` a named queue, ``""`` for none, ``(other)``
  past the named queues with the most jobs;
- ``graphile_worker_paused{kind, name}``: 1 per pause in force (all
  workers), read in the same cached query as the depth;
- ``graphile_worker_limit_running``, ``_limit_max_running``,
  ``_limit_recent_starts`` and ``_limit_max_starts`` ``{kind, name}``: each
  limit's slots in use and starts in its current window, and its caps (all
  workers), read in the same cached query too;
- ``graphile_worker_tasks_stranded{task}``: the runnable jobs of each task
  that no live Python pool handles (by the heartbeats' task lists; Node
  workers are not seen), no series for the others and none at all while no
  Python pool has a heartbeat row; in the same cached query;
- ``graphile_worker_workflows{state}``: the workflows running now (state
  ``running``) and those that finished in the last day (``succeeded``,
  ``failed``, ``cancelled``), each counted through its index up to
  :data:`~worker_cli.observe.queue_depth.WORKFLOWS_CAP`; in the same cached
  query;
- ``graphile_worker_schedule_last_run_timestamp_seconds{schedule}`` and
  ``graphile_worker_schedule_lag_seconds{schedule}``: each schedule in the
  database that has fired, when its last job was added and how long after its
  instant (at most :data:`SCHEDULES_READ` schedules, by identifier); read with
  the depth, as often, in a transaction of its own
  (:class:`_ScheduledDepth`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from ..db.backoff import one_line
from ..errors import ConfigurationError
from ..extras import install_hint
from ..sql import compose
from ..sql import depth_metrics as depth_metrics_sql
from ..sql import schedule_metrics as schedule_metrics_sql
from .job_stats import DURATION_BUCKETS, OUTCOMES, JobStats
from .queue_depth import (
    EMPTY_GROUP,
    OTHER_TASKS,
    QUEUE_LABELS,
    STATES,
    WORKFLOWS_CAP,
    Depth,
    QueueDepth,
)
from .status_report import STRANDED_CAP

try:
    from prometheus_client import (
        CollectorRegistry,
        PlatformCollector,
        ProcessCollector,
        start_http_server,
    )
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
except ImportError:
    raise ConfigurationError("metrics need prometheus-client: " + install_hint("metrics")) from None

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from .pool_view import ObservedPool

__all__ = [
    "DURATION_BUCKETS",
    "JobStats",
    "MetricsServer",
    "WorkerMetrics",
    "attach_metrics",
    "serve_metrics",
]

logger = logging.getLogger("graphile_worker.metrics")

#: Schedules in the database read at most (two series each, by identifier).
SCHEDULES_READ = 1000


@dataclass(frozen=True)
class ScheduleRun:
    """A schedule's last run: the unix time its job was added, and how many
    seconds after the instant it fired at (both None until it first fires)."""

    identifier: str
    last_run_at: float | None
    lag: float | None


@dataclass(frozen=True)
class _DepthAndSchedules(Depth):
    """The depth's figures, and the schedules' last runs (by identifier;
    empty when they could not be read)."""

    schedules: tuple[ScheduleRun, ...] = ()


class _ScheduledDepth(QueueDepth):
    """The queue depth's cached read, which reads the schedules' last runs
    too, after the depth's own statements, in a transaction of its own (a
    failure there leaves the depth's figures whole, and is logged)."""

    def __init__(self, pool: ObservedPool, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(pool, loop)
        self._schedules = compose(schedule_metrics_sql.SCHEDULE_RUNS, pool.options.schema)

    async def _query(self, pool: AsyncConnectionPool[Any]) -> Depth:
        depth = await super()._query(pool)
        try:
            async with pool.connection() as conn, conn.transaction():
                await conn.execute(depth_metrics_sql.STATEMENT_TIMEOUT)
                cur = await conn.execute(self._schedules, {"limit": SCHEDULES_READ})
                runs = tuple(ScheduleRun(str(i), at, lag) for i, at, lag in await cur.fetchall())
        except psycopg.Error as exc:
            logger.warning("Could not read the schedules for the metrics: %s", one_line(exc))
            runs = ()
        figures = {field.name: getattr(depth, field.name) for field in fields(depth)}
        return _DepthAndSchedules(**figures, schedules=runs)


class _Collector:
    """The prometheus-client collector of one worker pool."""

    def __init__(self, pool: ObservedPool, stats: JobStats, depth: QueueDepth) -> None:
        self._pool = pool
        self._stats = stats
        self._depth = depth

    def describe(self) -> Iterator[Metric]:
        """The families, without reading anything (a registry calls this on
        register; calling collect() there would query the database)."""
        return self._families(read=False)

    def collect(self) -> Iterator[Metric]:
        return self._families(read=True)

    def _families(self, *, read: bool) -> Iterator[Metric]:
        jobs = CounterMetricFamily(
            "graphile_worker_jobs",
            "Attempts this worker ran to an outcome, each exactly one of: success; retry "
            "(failed, another attempt follows); failure, cancelled, timeout (failed, and "
            "the job ends there: its final failures).",
            labels=("task", "outcome"),
        )
        durations = HistogramMetricFamily(
            "graphile_worker_job_duration_seconds",
            "How long the jobs this worker ran took, from the task's start to its outcome.",
            labels=("task",),
        )
        running = GaugeMetricFamily(
            "graphile_worker_jobs_running",
            "Jobs this worker is running now, by task (each of its tasks, 0 when idle).",
            labels=("task",),
        )
        stuck = GaugeMetricFamily(
            "graphile_worker_jobs_stuck",
            "Jobs running now that should have stopped: a cancel request ignored past its "
            "grace, or a task still running past its timeout's grace. Each keeps its slot "
            "and its lock; a warning names it and the line its task is at.",
        )
        queued = GaugeMetricFamily(
            "graphile_worker_local_queue_length",
            "Jobs this worker has fetched (locked) and not started yet.",
        )
        paused = GaugeMetricFamily(
            "graphile_worker_paused",
            "1 for each pause in force (for every Python worker): kind queue (a named "
            "queue) or task (a task identifier), name the queue or task (* for every "
            "one); read with the queue depth, at most every few seconds.",
            labels=("kind", "name"),
        )
        queries = CounterMetricFamily(
            "graphile_worker_queue_depth_queries",
            "Depth queries this worker sent (scrapes within the cache time share one).",
        )
        queue = None
        if read:
            # As prometheus-client writes bucket bounds ("0.001", "1.0").
            bounds = [repr(float(bound)) for bound in self._stats.bounds] + ["+Inf"]
            for figures in self._stats.snapshot():
                name = figures.task
                for outcome, count in zip(OUTCOMES, figures.outcomes, strict=True):
                    jobs.add_metric([name, outcome], count)
                durations.add_metric(
                    [name], list(zip(bounds, figures.buckets, strict=True)), figures.seconds
                )
            load = self._pool.load
            for task in dict.fromkeys([*self._pool.tasks, *load.running_tasks]):
                running.add_metric([task], load.running_tasks.get(task, 0))
            stuck.add_metric([], load.stuck)
            queued.add_metric([], load.queued)
            queue = self._depth.read()
            for kind, name in queue.paused if queue is not None else ():
                paused.add_metric([kind, name], 1)
            queries.add_metric([], self._depth.queries)
        yield from (jobs, durations, running, stuck, queued)
        yield from _depth_families(queue, self._pool.tasks)
        yield from (paused, queries)
        yield from _limit_families(queue)
        yield _stranded_family(queue)
        yield _workflows_family(queue)
        yield from _schedule_families(queue)


def _depth_families(queue: Depth | None, tasks: Iterable[str]) -> Iterator[Metric]:
    """The queue depth's families, filled from ``queue`` (None: empty): by
    task and queue, each of the worker's ``tasks`` and the bucket of the
    others always (queue "", at 0 when they have no job), and every other
    (task, queue) pair that has jobs."""
    labels = ("task", "queue")
    depth = GaugeMetricFamily(
        "graphile_worker_queue_depth",
        "Jobs in the queue (all workers) by task, named queue and state, as "
        "`graphile-worker status` counts them: each job in exactly one of waiting, "
        "scheduled, retrying, paused, running, failed; task: one of this worker's tasks, or "
        "(other) for every other task's jobs; queue: the named queue, empty for none, "
        f"(other) past the {QUEUE_LABELS} named queues with the most jobs; read at most "
        "every few seconds, over a bounded number of rows.",
        labels=(*labels, "state"),
    )
    retrying = GaugeMetricFamily(
        "graphile_worker_queue_depth_retrying",
        "The jobs that failed an attempt before and will run again: "
        "graphile_worker_queue_depth's retrying, and its paused jobs that failed "
        "before; read with the depth.",
        labels=labels,
    )
    oldest = GaugeMetricFamily(
        "graphile_worker_oldest_runnable_job_age_seconds",
        "Seconds since the run_at of the job that has waited longest (due, not locked, "
        "attempts left: status's waiting and retrying; paused ones too), by task and "
        "queue as the depth; 0 when none "
        "waits; +Inf for a run_at of -infinity; read with the depth, so up to its cache "
        "time old.",
        labels=labels,
    )
    truncated = GaugeMetricFamily(
        "graphile_worker_queue_depth_truncated",
        "1 when the queue held more jobs than the depth query reads: the depth "
        "figures are then lower bounds.",
    )
    if queue is not None:
        groups = dict(queue.groups)
        for task in {*tasks, OTHER_TASKS}:
            groups.setdefault((task, ""), EMPTY_GROUP)
        for key, group in sorted(groups.items()):
            for state, count in zip(STATES, group.states, strict=True):
                depth.add_metric([*key, state], count)
            retrying.add_metric(list(key), group.retrying)
            oldest.add_metric(list(key), 0.0 if group.oldest_age is None else group.oldest_age)
        truncated.add_metric([], int(queue.truncated))
    yield from (depth, retrying, oldest, truncated)


def _stranded_family(queue: Depth | None) -> Metric:
    """The stranded tasks' family, filled from ``queue`` (None: empty)."""
    stranded = GaugeMetricFamily(
        "graphile_worker_tasks_stranded",
        "Runnable jobs (not locked, attempts left, due) of each task that no live "
        "Python worker handles (by the heartbeats' task lists; Node workers are not "
        "seen); no series for other tasks, none while no Python worker has a "
        f"heartbeat; counted up to {STRANDED_CAP:,}; read with the queue depth.",
        labels=("task",),
    )
    for task, runnable in queue.stranded if queue is not None else ():
        stranded.add_metric([task], runnable)
    return stranded


def _workflows_family(queue: Depth | None) -> Metric:
    """The workflows' family, filled from ``queue`` (None: empty): a series
    per state, 0 when none."""
    workflows = GaugeMetricFamily(
        "graphile_worker_workflows",
        "Workflows (all workers) by state: running, those running now; succeeded, "
        "failed, cancelled, those that finished so in the last day. Each counted up to "
        f"{WORKFLOWS_CAP:,} (the finished ones together, the last to finish first); "
        "read with the queue depth.",
        labels=("state",),
    )
    for state, count in queue.workflows if queue is not None else ():
        workflows.add_metric([state], count)
    return workflows


def _schedule_families(queue: Depth | None) -> Iterator[Metric]:
    """The schedules' families, filled from ``queue`` (None, or no schedules
    read: empty): a series per schedule in the database that has fired."""
    last_run = GaugeMetricFamily(
        "graphile_worker_schedule_last_run_timestamp_seconds",
        "When each schedule in the database last added its job (unix time; every "
        "Python worker fires them); no series until it first fires; read with the queue "
        f"depth, the first {SCHEDULES_READ:,} schedules by identifier.",
        labels=("schedule",),
    )
    lag = GaugeMetricFamily(
        "graphile_worker_schedule_lag_seconds",
        "Seconds between the instant a schedule in the database last fired at and the "
        "moment its job was added (a backfilled run's is large); no series until it "
        "first fires; read with the queue depth.",
        labels=("schedule",),
    )
    runs = queue.schedules if isinstance(queue, _DepthAndSchedules) else ()
    for run in runs:
        if run.last_run_at is not None:
            last_run.add_metric([run.identifier], run.last_run_at)
        if run.lag is not None:
            lag.add_metric([run.identifier], run.lag)
    yield from (last_run, lag)


def _limit_families(queue: Depth | None) -> Iterator[Metric]:
    """The limits' families, filled from ``queue`` (None: empty). A limit
    has the running pair if it caps running jobs, the starts pair if it
    caps starts; its caps are per partition value when it has one."""
    labels = ("kind", "name")
    running = GaugeMetricFamily(
        "graphile_worker_limit_running",
        "Jobs running now that a limit counts (its slots in use; every Python worker, "
        "all its partition values); read with the queue depth.",
        labels=labels,
    )
    max_running = GaugeMetricFamily(
        "graphile_worker_limit_max_running",
        "A limit's max_running: jobs of the task or queue (of each partition value) "
        "allowed to run at once.",
        labels=labels,
    )
    starts = GaugeMetricFamily(
        "graphile_worker_limit_recent_starts",
        "Starts a limit counts in its current window (the last `per`; all its partition "
        "values); read with the queue depth.",
        labels=labels,
    )
    max_starts = GaugeMetricFamily(
        "graphile_worker_limit_max_starts",
        "A limit's max_starts: starts allowed in any window of its length (of each "
        "partition value).",
        labels=labels,
    )
    for use in queue.limits if queue is not None else ():
        if use.max_running is not None:
            running.add_metric([use.kind, use.name], use.running)
            max_running.add_metric([use.kind, use.name], use.max_running)
        if use.max_starts is not None:
            starts.add_metric([use.kind, use.name], use.recent_starts)
            max_starts.add_metric([use.kind, use.name], use.max_starts)
    yield from (running, max_running, starts, max_starts)


class WorkerMetrics:
    """One worker pool's metrics in a registry, from :func:`attach_metrics`
    until the pool stops (its ``stop`` event), when they leave the registry."""

    def __init__(self, pool: ObservedPool, registry: CollectorRegistry) -> None:
        self.pool = pool
        self.registry = registry
        self.stats = JobStats(pool.tasks)
        self.depth = _ScheduledDepth(pool, asyncio.get_running_loop())
        self._collector = _Collector(pool, self.stats, self.depth)
        self._handlers = (
            ("job:success", self.stats.on_success),
            ("job:error", self.stats.on_error),
            ("job:failed", self.stats.on_failed),
            ("stop", self._on_stop),
        )
        self._attached = False

    def attach(self) -> None:
        try:
            self.registry.register(self._collector)
        except ValueError as exc:
            raise ConfigurationError(
                f"metrics_registry: {exc} (one running worker per registry)"
            ) from None
        for name, handler in self._handlers:
            self.pool.events.on(name, handler)
        self._attached = True

    def detach(self) -> None:
        """Leave the registry and the pool's events (a worker that failed to start too)."""
        if not self._attached:
            return
        self._attached = False
        for name, handler in self._handlers:
            self.pool.events.off(name, handler)
        self.registry.unregister(self._collector)

    async def _on_stop(self, _event: Mapping[str, Any]) -> None:
        self.detach()
        await self.depth.aclose()


def attach_metrics(pool: ObservedPool, registry: CollectorRegistry) -> WorkerMetrics:
    """Add ``pool``'s metrics to ``registry`` (on the pool's event loop, before it starts)."""
    metrics = WorkerMetrics(pool, registry)
    metrics.attach()
    return metrics


@dataclass
class MetricsServer:
    """``/metrics`` served over HTTP from a thread of its own."""

    registry: CollectorRegistry
    url: str
    _server: WSGIServer

    def close(self) -> None:
        """Stop serving (blocks up to half a second: call it from a thread)."""
        self._server.shutdown()
        self._server.server_close()


def serve_metrics(port: int, host: str = "127.0.0.1") -> MetricsServer:
    """Serve a new registry at ``http://host:port/metrics`` (port 0: any free
    port; see ``url``): the process's CPU and memory, and the metrics of the
    worker ``run(..., metrics_registry=server.registry)`` starts."""
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise ConfigurationError(
            f"--metrics-port: cannot serve metrics on {host}:{port}: {exc.strerror or exc}"
        ) from None
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{server.server_port}/metrics"
    logger.info("Serving Prometheus metrics at %s", url)
    return MetricsServer(registry, url, server)
