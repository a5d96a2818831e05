"""Prometheus metrics of a running worker (the ``metrics`` extra: ``prometheus-client``).

``graphile-worker --metrics-port PORT`` serves them at ``/metrics``
(:func:`serve_metrics`); in library mode ``run(..., metrics_registry=registry)``
adds them to a registry the application already serves (:func:`attach_metrics`).

Where each figure comes from, so that nothing is paid when metrics are off
(none of this is imported then) and little when they are on:

- ``graphile_worker_jobs_total{task, outcome}`` and
  ``graphile_worker_job_duration_seconds{task}``: the pool's ``job:success``
  and ``job:error`` events (their ``duration_ms``), counted on the event loop
  (:class:`JobStats`);
- ``graphile_worker_jobs_running`` and ``graphile_worker_local_queue_length``:
  the pool's read-only figures, read when scraped;
- ``graphile_worker_queue_depth{task, state}``: one bounded query, cached
  (:class:`~worker_cli.observe.queue_depth.QueueDepth`); ``task`` is one of the
  worker's tasks, or ``(other)`` for the jobs of every other task together;
- ``graphile_worker_paused{kind, name}``: 1 per pause in force (all
  workers), read in the same cached query as the depth;
- ``graphile_worker_limit_running``, ``_limit_max_running``,
  ``_limit_recent_starts`` and ``_limit_max_starts`` ``{kind, name}``: each
  limit's slots in use and starts in its current window, and its caps (all
  workers), read in the same cached query too;
- ``graphile_worker_tasks_stranded{task}``: the runnable jobs of each task
  that no live Python pool handles (by the heartbeats' task lists; Node
  workers are not seen), no series for the others and none at all while no
  Python pool has a heartbeat row; in the same cached query.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError
from .queue_depth import OTHER_TASKS, STATES, Depth, QueueDepth
from .status import STRANDED_CAP

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
    raise ConfigurationError(
        "metrics need prometheus-client: install the metrics extra: "
        "pip install 'graphile-worker[metrics]'"
    ) from None

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

#: Upper bounds (seconds) of the job duration histogram's buckets: from a
#: trivial job's fraction of a millisecond to a five-minute one.
DURATION_BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)


class _TaskFigures:
    """One task's counts and durations (under :attr:`JobStats._lock`)."""

    __slots__ = ("buckets", "failures", "seconds", "successes")

    def __init__(self, size: int) -> None:
        self.successes = 0
        self.failures = 0
        #: Observations per bucket, not cumulative; the last one is +Inf.
        self.buckets = [0] * size
        self.seconds = 0.0


@dataclass(frozen=True)
class TaskSnapshot:
    """One task's figures as read by a scrape (buckets cumulative, with +Inf)."""

    task: str
    successes: int
    failures: int
    buckets: tuple[int, ...]
    seconds: float


class JobStats:
    """Jobs run to an outcome and their durations, by task.

    Written on the event loop (one event handler call per job), read by a
    scrape in any thread: a lock keeps a task's counts, buckets and sum
    consistent with one another.
    """

    def __init__(self, tasks: Iterable[str], bounds: Sequence[float] = DURATION_BUCKETS) -> None:
        self.bounds = tuple(bounds)
        self._lock = threading.Lock()
        # Every task of the worker from the start: a series that appears only
        # after its first job hides the first increase from rate().
        self._tasks = {task: _TaskFigures(len(self.bounds) + 1) for task in tasks}

    def on_success(self, event: Mapping[str, Any]) -> None:
        """``job:success`` handler."""
        self.record(event["job"].task_identifier, event["duration_ms"] / 1000, success=True)

    def on_error(self, event: Mapping[str, Any]) -> None:
        """``job:error`` handler (every failed attempt)."""
        self.record(event["job"].task_identifier, event["duration_ms"] / 1000, success=False)

    def record(self, task: str, seconds: float, *, success: bool) -> None:
        # Prometheus buckets are "less than or equal": the first bound >= seconds.
        index = bisect_left(self.bounds, seconds)
        with self._lock:
            figures = self._tasks.get(task)
            if figures is None:
                figures = self._tasks[task] = _TaskFigures(len(self.bounds) + 1)
            if success:
                figures.successes += 1
            else:
                figures.failures += 1
            figures.buckets[index] += 1
            figures.seconds += seconds

    def snapshot(self) -> list[TaskSnapshot]:
        """Every task's figures, by task identifier."""
        with self._lock:
            raw = [
                (task, f.successes, f.failures, list(f.buckets), f.seconds)
                for task, f in self._tasks.items()
            ]
        result = []
        for task, successes, failures, buckets, seconds in sorted(raw):
            cumulative, total = [], 0
            for count in buckets:
                total += count
                cumulative.append(total)
            result.append(TaskSnapshot(task, successes, failures, tuple(cumulative), seconds))
        return result


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
            "Jobs this worker ran to an outcome (success, failure: every failed attempt).",
            labels=("task", "outcome"),
        )
        durations = HistogramMetricFamily(
            "graphile_worker_job_duration_seconds",
            "How long the jobs this worker ran took, from the task's start to its outcome.",
            labels=("task",),
        )
        running = GaugeMetricFamily("graphile_worker_jobs_running", "Jobs running now.")
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
        depth = GaugeMetricFamily(
            "graphile_worker_queue_depth",
            "Jobs in the queue (all workers) by task and state, as `graphile-worker status` "
            "counts them (retrying: waiting or scheduled after a failed attempt); task: one "
            "of this worker's tasks, or (other) for every other task's jobs; read at most "
            "every few seconds, over a bounded number of rows.",
            labels=("task", "state"),
        )
        truncated = GaugeMetricFamily(
            "graphile_worker_queue_depth_truncated",
            "1 when the queue held more jobs than the depth query reads: the depth "
            "figures are then lower bounds.",
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
                jobs.add_metric([name, "success"], figures.successes)
                jobs.add_metric([name, "failure"], figures.failures)
                durations.add_metric(
                    [name], list(zip(bounds, figures.buckets, strict=True)), figures.seconds
                )
            load = self._pool.load
            running.add_metric([], load.running)
            stuck.add_metric([], load.stuck)
            queued.add_metric([], load.queued)
            queue = self._depth.read()
            if queue is not None:
                # This worker's tasks and the bucket of the others always, at 0
                # when they have no job; no series of their own for other tasks.
                for task in sorted({*self._pool.tasks, OTHER_TASKS}):
                    counts = queue.counts.get(task, (0,) * len(STATES))
                    for state, count in zip(STATES, counts, strict=True):
                        depth.add_metric([task, state], count)
                truncated.add_metric([], int(queue.truncated))
                for kind, name in queue.paused:
                    paused.add_metric([kind, name], 1)
            queries.add_metric([], self._depth.queries)
        yield from (jobs, durations, running, stuck, queued, depth, truncated, paused, queries)
        yield from _limit_families(queue)
        yield _stranded_family(queue)


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
        self.depth = QueueDepth(pool, asyncio.get_running_loop())
        self._collector = _Collector(pool, self.stats, self.depth)
        self._handlers = (
            ("job:success", self.stats.on_success),
            ("job:error", self.stats.on_error),
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
