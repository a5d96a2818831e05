"""Library entry points: the worker pipeline (config, migrate, load tasks, pool).

``run(...)`` starts a worker and returns a :class:`Runner`; ``run_once(...)``
runs until no runnable job is left; ``run_migrations(...)`` only migrates.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable, Generator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from .config.database import DatabaseConfig, resolve_database
from .config.options import ForbiddenFlags, WorkerOptions
from .db.connections import connect
from .errors import ConfigurationError
from .jobs.job import Job
from .jobs.payloads import NamedPayload, job_identity
from .jobs.unique import UniqueJobResult, UniqueSpec
from .observe.events import Events
from .observe.progress import ProgressReporter
from .schema.migrate import MigrationReport, migrate
from .tasks.loader import Task, TaskFunction, load_task_directory, make_task_list
from .worker import WorkerPool

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from .jobs.crontab import ParsedCronItem

__all__ = ["Runner", "run", "run_migrations", "run_once"]

logger = logging.getLogger("graphile_worker")

EXIT_SCHEMA_INCOMPATIBLE = 57
#: Exit code of a worker that stopped because a job was stuck past its timeout
#: (its task says on_stuck="exit"): a supervisor should start it again.
EXIT_JOB_STUCK = 75
#: Exit code of a worker that stopped (forced) without writing back every result.
EXIT_RESULTS_UNWRITTEN = 1
#: After a second signal, the process exits this many seconds later at the
#: latest, even if the event loop is stuck (the pool itself gives up on the
#: database after ``forced_shutdown_timeout``).
FORCED_EXIT_AFTER = 10.0


async def run_migrations(
    connection_string: str | None = None, *, schema: str | None = None
) -> MigrationReport:
    """Install or upgrade the schema and return what was done (``--schema-only``)."""
    database = resolve_database(connection_string, schema)
    async with await connect(database.conninfo, autocommit=True) as conn:
        return await migrate(conn, database.schema)


class Runner:
    """A running worker. ``await runner`` waits for it to finish."""

    def __init__(self, pool: WorkerPool, task: asyncio.Task[None]) -> None:
        self.pool = pool
        self.events = pool.events
        self._task = task

    @property
    def exit_code(self) -> int:
        """57 if a breaking schema migration stopped the worker; 75 if a job
        stuck past its timeout did (``pool.stuck_job_ids``: its task says
        on_stuck="exit"; exit the process, its thread still runs); 1 if a
        forced stop left results unwritten (``pool.unwritten_job_ids``); else 0."""
        if self.pool.breaking_migration:
            return EXIT_SCHEMA_INCOMPATIBLE
        if self.pool.stuck_job_ids:
            return EXIT_JOB_STUCK
        return EXIT_RESULTS_UNWRITTEN if self.pool.unwritten_job_ids else 0

    async def stop(self) -> None:
        """Stop fetching, let running jobs finish, and wait for the worker to end."""
        self.pool.stop()
        await self._task

    def force_stop(self) -> None:
        """Fail running jobs (they will retry) and stop as soon as possible: within
        ``forced_shutdown_timeout`` (5 s) whatever the database does."""
        self.pool.force_stop()

    @overload
    async def add_job(
        self,
        identifier: str | NamedPayload,
        payload: Any = None,
        *,
        unique: None = None,
        **options: Any,
    ) -> Job: ...

    @overload
    async def add_job(
        self,
        identifier: str | NamedPayload,
        payload: Any = None,
        *,
        unique: UniqueSpec,
        **options: Any,
    ) -> UniqueJobResult: ...

    async def add_job(
        self,
        identifier: str | NamedPayload,
        payload: Any = None,
        *,
        unique: UniqueSpec | None = None,
        **options: Any,
    ) -> Job | UniqueJobResult:
        """Add a job through the worker's own pool (options as WorkerUtils.add_job)."""
        identifier, payload = job_identity(identifier, payload)
        utils = self.pool.utils
        if utils is None:
            raise RuntimeError("the worker has stopped")
        if unique is None:
            job: Job = await utils.add_job(identifier, payload, **options)
            return job
        result: UniqueJobResult = await utils.add_job(identifier, payload, unique=unique, **options)
        return result

    def __await__(self) -> Generator[Any, None, None]:
        return self._task.__await__()


async def run(
    connection_string: str | None = None,
    *,
    task_list: Mapping[str, TaskFunction] | None = None,
    task_directory: str | Path | None = None,
    concurrency: int = WorkerOptions.concurrency,
    schema: str | None = None,
    poll_interval: float = WorkerOptions.poll_interval,
    max_pool_size: int = WorkerOptions.max_pool_size,
    no_prepared_statements: bool = WorkerOptions.no_prepared_statements,
    listen_url: str | None = WorkerOptions.listen_url,
    forbidden_flags: ForbiddenFlags = WorkerOptions.forbidden_flags,
    local_queue_size: int = WorkerOptions.local_queue_size,
    local_queue_horizon: float = WorkerOptions.local_queue_horizon,
    complete_job_batch_delay: float = WorkerOptions.complete_job_batch_delay,
    graceful_shutdown_timeout: float = WorkerOptions.graceful_shutdown_timeout,
    events: Events | None = None,
    no_handle_signals: bool = False,
    once: bool = False,
    log_success: bool | None = None,
    progress_interval: float | None = None,
    crontab: str | None = None,
    crontab_file: str | Path | None = None,
    parsed_cron_items: Sequence[ParsedCronItem] | None = None,
    heartbeat_interval: float | None = WorkerOptions.heartbeat_interval,
    heartbeat_timeout: float = WorkerOptions.heartbeat_timeout,
    session_grace: float = WorkerOptions.session_grace,
    use_local_time: bool = WorkerOptions.use_local_time,
    history: bool = WorkerOptions.history,
    max_result_bytes: int = WorkerOptions.max_result_bytes,
    timeout_grace: float = WorkerOptions.timeout_grace,
    cron_timezone: str = WorkerOptions.cron_timezone,
    job_logs: str = WorkerOptions.job_logs,
    processes: int | None = WorkerOptions.processes,
    tracing: bool = False,
    metrics_registry: CollectorRegistry | None = None,
) -> Runner:
    """Migrate, load the tasks and start a worker pool; returns once it is running.

    The settings default to :class:`WorkerOptions`'s (see its fields);
    ``schema`` to ``GRAPHILE_WORKER_SCHEMA``, ``log_success`` to true unless
    ``NO_LOG_SUCCESS`` is set; times are in seconds. Exactly one of
    ``task_list`` (identifier -> callable) and ``task_directory``; at most one
    of ``crontab`` (its text), ``crontab_file`` and ``parsed_cron_items``
    (cron does not run with ``once``). With ``once``, a progress line every
    ``progress_interval`` seconds. ``tracing`` and ``metrics_registry`` need
    their extras; off, none of their code runs."""
    database = resolve_database(connection_string, schema)
    tasks = load_tasks(task_list, task_directory)
    cron_items = load_cron_items(crontab, crontab_file, parsed_cron_items)
    if progress_interval is not None and progress_interval < 0:
        raise ConfigurationError("progress_interval must not be negative")
    options = WorkerOptions(
        concurrency=concurrency,
        schema=database.schema,
        poll_interval=poll_interval,
        max_pool_size=max_pool_size,
        no_prepared_statements=no_prepared_statements,
        listen_url=listen_url,
        forbidden_flags=forbidden_flags,
        local_queue_size=local_queue_size,
        local_queue_horizon=local_queue_horizon,
        complete_job_batch_delay=complete_job_batch_delay,
        graceful_shutdown_timeout=graceful_shutdown_timeout,
        log_success=not os.environ.get("NO_LOG_SUCCESS") if log_success is None else log_success,
        heartbeat_interval=heartbeat_interval,
        heartbeat_timeout=heartbeat_timeout,
        session_grace=session_grace,
        use_local_time=use_local_time,
        history=history,
        max_result_bytes=max_result_bytes,
        timeout_grace=timeout_grace,
        cron_timezone=cron_timezone,
        job_logs=job_logs,
        processes=processes,
    )
    _warn_if_pool_too_small(options)
    pool = _make_pool(
        database, tasks, options, tracing=tracing, events=events, once=once, cron_items=cron_items
    )
    task = await _start(
        pool, database, handle_signals=not no_handle_signals, metrics_registry=metrics_registry
    )
    if once and progress_interval:
        _report_progress(pool, task, progress_interval)
    return Runner(pool, task)


def _report_progress(pool: WorkerPool, task: asyncio.Task[None], interval: float) -> None:
    """With ``once``: a progress line every ``interval`` seconds, and a total at the end."""
    reporter = ProgressReporter(pool, interval)
    reporter.start()
    task.add_done_callback(reporter.finish)


def _make_pool(
    database: DatabaseConfig,
    tasks: dict[str, Task],
    options: WorkerOptions,
    *,
    tracing: bool,
    **kwargs: Any,
) -> WorkerPool:
    """The worker pool; with ``tracing``, its tasks run in spans and its
    fetches read the jobs' trace contexts (``worker_cli.observe.otel``)."""
    on_fetched = None
    if tracing:
        from .observe.otel import trace_tasks

        tasks, contexts = trace_tasks(tasks, database.schema)
        on_fetched = contexts.load
    return WorkerPool(database.conninfo, tasks, options, on_fetched=on_fetched, **kwargs)


def _warn_if_pool_too_small(options: WorkerOptions) -> None:
    if options.max_pool_size < options.concurrency:
        logger.warning(
            "max_pool_size (%d) is smaller than the concurrency (%d): tasks that use the "
            "database will wait for connections",
            options.max_pool_size,
            options.concurrency,
        )


async def _start(
    pool: WorkerPool,
    database: DatabaseConfig,
    *,
    handle_signals: bool,
    metrics_registry: CollectorRegistry | None = None,
) -> asyncio.Task[None]:
    """Migrate on the connection the fetcher will go on with, start the pool
    and wait until it is ready; returns its task. The pool's metrics go into
    ``metrics_registry`` (if any) until it stops."""
    if logger.isEnabledFor(logging.DEBUG):
        from .observe.debug_log import attach_debug_logging

        attach_debug_logging(pool.events)
    metrics = None
    if metrics_registry is not None:
        from .observe.prometheus import attach_metrics

        metrics = attach_metrics(pool, metrics_registry)
    # Signals are handled from here on: one during start-up stops the worker as
    # soon as it has started.
    remove_handlers = _handle_signals(pool) if handle_signals else None
    try:
        conn = await connect(pool.conninfo_for("fetch"), autocommit=True)
        try:
            await migrate(conn, database.schema)
            if not pool.once:
                from .worker.background.schedule_source import refuse_shared_identifiers

                identifiers = [item.identifier for item in pool.cron_items]
                await refuse_shared_identifiers(conn, database.schema, identifiers)
        except BaseException:
            await conn.close()
            raise
        # The pool's fetcher goes on with this connection: one connect fewer.
        pool.adopt_connection(conn)
        task = asyncio.create_task(pool.run(), name=pool.id)
    except BaseException:
        if remove_handlers:
            remove_handlers()
        if metrics is not None:  # (once the pool runs, its stop event detaches them)
            metrics.detach()
        raise
    if remove_handlers:
        task.add_done_callback(lambda _: remove_handlers())
    ready = asyncio.ensure_future(pool.ready.wait())
    await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
    if not ready.done():
        ready.cancel()
        await task  # start-up failed: raise its error
    return task


async def run_once(connection_string: str | None = None, **options: Any) -> int:
    """Run until no runnable job is left; returns the exit code (0, or 57)."""
    runner = await run(connection_string, once=True, **options)
    await runner
    return runner.exit_code


def load_tasks(
    task_list: Mapping[str, TaskFunction] | None, task_directory: str | Path | None
) -> dict[str, Task]:
    """The tasks from exactly one of a task list and a task directory."""
    if (task_list is None) == (task_directory is None):
        raise ConfigurationError("give exactly one of task_list and task_directory")
    if task_list is not None:
        if not task_list:
            raise ConfigurationError("task_list is empty")
        return make_task_list(task_list)
    assert task_directory is not None
    return load_task_directory(Path(task_directory))


def load_cron_items(
    crontab: str | None,
    crontab_file: str | Path | None,
    parsed_cron_items: Sequence[ParsedCronItem] | None,
) -> list[ParsedCronItem]:
    """The cron items from at most one of the three ways of giving them."""
    given = [x for x in (crontab, crontab_file, parsed_cron_items) if x is not None]
    if not given:
        return []
    from .jobs.crontab import CrontabError, parse_crontab

    if len(given) > 1:
        raise ConfigurationError("give at most one of crontab, crontab_file and parsed_cron_items")
    if parsed_cron_items is not None:
        return list(parsed_cron_items)
    if crontab_file is not None:
        path = Path(crontab_file)
        try:
            crontab = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigurationError(f"cannot read crontab {str(path)!r}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            line = path.read_bytes()[: exc.start].count(b"\n") + 1
            raise ConfigurationError(
                f"crontab {str(path)!r} line {line}: not UTF-8 text "
                f"(byte 0x{exc.object[exc.start]:02x})"
            ) from None
        try:
            return parse_crontab(crontab)
        except CrontabError as exc:
            raise CrontabError(f"{path}: {exc}") from None
    return parse_crontab(crontab) if crontab is not None else []


def _handle_signals(pool: WorkerPool) -> Callable[[], None]:
    """SIGINT/SIGTERM: graceful shutdown; a second one forces it. Returns the
    remover, called when the pool has stopped."""
    loop = asyncio.get_running_loop()
    names = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}
    backstop: list[threading.Timer] = []

    def on_signal(signum: signal.Signals) -> None:
        if pool.stopping:
            logger.warning("%s received again: forcing shutdown", names[signum])
            pool.force_stop()
            if not backstop:
                backstop.append(_exit_unless_stopped_within(FORCED_EXIT_AFTER, pool))
        else:
            pool.events.emit("gracefulShutdown", signal=names[signum])
            pool.stop(f"{names[signum]} received")

    for signum in names:
        loop.add_signal_handler(signum, on_signal, signum)

    def remove() -> None:
        for signum in names:
            loop.remove_signal_handler(signum)
        for timer in backstop:
            timer.cancel()

    return remove


def _exit_unless_stopped_within(seconds: float, pool: WorkerPool) -> threading.Timer:
    """The last resort of a forced stop: a thread that ends the process if the
    pool is still running ``seconds`` later (an event loop blocked by a task,
    say), naming the jobs the pool still held. Cancelled when the pool stops;
    the pool itself gives up on the database well before."""

    def expire() -> None:
        try:
            held = ", ".join(map(str, pool.held_job_ids())) or "none"
        except RuntimeError:  # changed while read from this thread
            held = "unknown"
        logger.error(
            "Still running %gs after the forced shutdown began: exiting now. Job(s) not "
            "written back (they will run again once released): %s",
            seconds,
            held,
        )
        logging.shutdown()
        os._exit(EXIT_RESULTS_UNWRITTEN)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    return timer
