"""The ``graphile-worker`` command: the same flags as graphile-worker (Node) 0.18."""

from __future__ import annotations

import gc
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from .._version import __version__
from ..config.database import load_dotenv_file
from ..config.file import config_file_option, set_by_config_file
from ..config.options import WorkerOptions
from ..errors import GraphileWorkerError
from ..extras import install_hint
from ..observe import log_output as logs
from ..observe.log_output import LOG_FORMATS, LogFormat
from .common import (
    CONTEXT_SETTINGS,
    FLAGS_BY_FIELD,
    SHARED_OPTIONS,
    connection_option,
    failure,
    run_async,
    schema_option,
    shared,
    worker_option,
)
from .params import (
    MAX_PROGRESS_INTERVAL,
    MAX_REFRESH,
    number,
)

__all__ = ["command", "main"]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

CLEANUP_TASKS = (
    "GC_TASK_IDENTIFIERS",
    "GC_JOB_QUEUES",
    "DELETE_PERMAFAILED_JOBS",
    "GC_UNIQUE_LOCKS",
)


def _parse_cleanup(_ctx: click.Context, _param: click.Parameter, value: str | None) -> list[str]:
    if value is None:
        return []
    names = [name.strip().upper() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in CLEANUP_TASKS]
    if not names or unknown:
        raise click.BadParameter(
            f"unknown cleanup task {', '.join(unknown) or repr(value)}; "
            f"choose from {', '.join(CLEANUP_TASKS)}"
        )
    return names


#: Options the Django worker command (worker_cli.contrib.django) shares.
schema_only_option = click.option(
    "--schema-only", is_flag=True, help="Install or upgrade the schema, then exit."
)
once_option = click.option(
    "--once", is_flag=True, help="Run until no runnable job is left, then exit."
)
log_format_option = click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    default="text",
    show_default=True,
    envvar="GRAPHILE_WORKER_LOG_FORMAT",
    show_envvar=True,
    help="Log lines as text, or as JSON objects (one per line, with the job's fields).",
)

progress_interval_option = click.option(
    "--progress-interval",
    type=number(0, MAX_PROGRESS_INTERVAL),
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    envvar="GRAPHILE_WORKER_PROGRESS_INTERVAL",
    show_envvar=True,
    help="With --once: log jobs done, rate and jobs remaining this often (0: never; "
    f"at most {MAX_PROGRESS_INTERVAL}).",
)

metrics_port_option = click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    metavar="PORT",
    envvar="GRAPHILE_WORKER_METRICS_PORT",
    show_envvar=True,
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (0: any free port, logged). "
    "Needs graphile-worker[metrics].",
)

metrics_host_option = click.option(
    "--metrics-host",
    metavar="HOST",
    default="127.0.0.1",
    show_default=True,
    envvar="GRAPHILE_WORKER_METRICS_HOST",
    show_envvar=True,
    help="Address the metrics are served on (0.0.0.0: every interface).",
)

tracing_option = click.option(
    "--tracing",
    is_flag=True,
    envvar="GRAPHILE_WORKER_TRACING",
    show_envvar=True,
    help="An OpenTelemetry span per job, child of the span that added it. Needs "
    "graphile-worker[otel] and an SDK (e.g. run under opentelemetry-instrument).",
)


@click.group(
    context_settings=CONTEXT_SETTINGS,
    invoke_without_command=True,
    subcommand_metavar="[COMMAND [ARGS]...]",
)
@connection_option
@schema_option
@schema_only_option
@once_option
@worker_option("concurrency")
@worker_option("max_pool_size")
@worker_option("local_queue_size")
@worker_option("local_queue_horizon")
@worker_option("complete_job_batch_delay")
@worker_option("poll_interval")
@worker_option("no_prepared_statements")
@worker_option("listen_url")
@click.option(
    "--cleanup",
    metavar="TASKS",
    callback=_parse_cleanup,
    help="Clean the database, then exit: a comma-separated list of "
    + ", ".join(CLEANUP_TASKS)
    + ".",
)
@click.option(
    "--crontab",
    "crontab_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Crontab file of recurring jobs. Default: ./crontab, if there is one.",
)
@worker_option("heartbeat_interval")
@worker_option("heartbeat_timeout")
@worker_option("session_grace")
@worker_option("use_local_time")
@worker_option("history")
@worker_option("timeout_grace")
@worker_option("cron_timezone")
@worker_option("job_logs")
@worker_option("processes")
@click.option(
    "--tasks",
    "tasks_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("tasks"),
    show_default=True,
    help="Folder of task files (.py modules with a `task` function, or executables).",
)
@log_format_option
@progress_interval_option
@metrics_port_option
@metrics_host_option
@tracing_option
@click.option(
    "--embedded-db",
    metavar="DIR",
    type=click.Path(path_type=Path, file_okay=False),
    help="Start a private PostgreSQL with its data in DIR (created on first use, kept) "
    "and use it; for trying and developing. Needs graphile-worker[embedded].",
)
@click.version_option(__version__, "--version", prog_name="graphile-worker")
@config_file_option
@click.pass_context
def command(
    ctx: click.Context,
    /,
    connection: str | None,
    schema_only: bool,
    once: bool,
    cleanup: list[str],
    crontab_path: Path | None,
    tasks_dir: Path,
    log_format: LogFormat,
    progress_interval: float,
    metrics_port: int | None,
    metrics_host: str,
    tracing: bool,
    embedded_db: Path | None,
    **worker_flags: Any,
) -> None:
    """Run jobs from a PostgreSQL queue shared with graphile-worker (Node).

    Without a COMMAND, run the worker with the options below; `status` prints
    what is in the queue.
    """
    if ctx.invoked_subcommand is not None:
        _check_shared_options_only(ctx)
        return
    if once and schema_only:
        raise click.UsageError("--once and --schema-only cannot be used together")
    settings = worker_settings(ctx, worker_flags)
    logs.configure(log_format)
    if embedded_db is not None:  # runs until the command ends
        from ..embedded import use_embedded_database

        connection = use_embedded_database(embedded_db, connection)
    if schema_only:
        migrate_only(connection, settings["schema"])
    elif cleanup:
        _clean(connection, settings["schema"], cleanup)
    else:
        crontab_file = crontab_path
        if crontab_file is None and Path("crontab").is_file():
            crontab_file = Path("crontab")
        if metrics_port is not None:
            settings["metrics_registry"] = metrics_registry(metrics_port, metrics_host)
        run_worker(
            connection,
            settings,
            task_directory=tasks_dir,
            once=once,
            progress_interval=progress_interval,
            crontab_file=crontab_file,
            tracing=tracing,
        )


def worker_settings(ctx: click.Context, flags: dict[str, Any]) -> dict[str, Any]:
    """The worker flags' values as ``run()`` keywords (in the fields' units),
    checked together as WorkerOptions checks them; an error also names the
    config file's keys among the fields it names."""
    settings = {field: FLAGS_BY_FIELD[field].to_field(value) for field, value in flags.items()}
    try:
        WorkerOptions(**settings)
    except ValueError as exc:
        message = str(exc)
        named = [field for field in flags if re.search(rf"\b{field}\b", message)]
        from_file = set_by_config_file(ctx, named)
        raise click.UsageError(f"{message} ({from_file})" if from_file else message) from None
    return settings


def metrics_registry(port: int, host: str) -> Any:
    """``--metrics-port``: serve /metrics (from a thread, until the process
    ends); returns the registry the worker's metrics go into."""
    try:
        from ..observe.prometheus import serve_metrics

        return serve_metrics(port, host).registry
    except GraphileWorkerError as exc:
        raise failure(exc) from None


def migrate_only(connection: str | None, schema: str) -> None:
    """``--schema-only``."""
    from ..runner import run_migrations

    report = run_async(run_migrations(connection, schema=schema))
    if report.applied or report.applied_py:
        click.echo(f"Schema {schema!r} migrated to revision {report.revision}.")
    else:
        click.echo(f"Schema {schema!r} is up to date (revision {report.revision}).")


def _clean(connection: str | None, schema: str, tasks: list[str]) -> None:
    """``--cleanup``."""
    from ..client.worker_utils import make_worker_utils

    async def clean() -> None:
        async with make_worker_utils(connection, schema=schema) as utils:
            await utils.migrate()
            await utils.cleanup(tasks)  # type: ignore[arg-type]

    run_async(clean())
    click.echo(f"Cleanup done: {', '.join(tasks)}.")


def run_worker(connection: str | None, settings: dict[str, Any], **run_options: Any) -> None:
    """The worker (``--once`` too); exits with its exit code. A database error
    while it starts is one line."""
    import psycopg

    from ..db.backoff import one_line
    from ..runner import run

    async def work() -> int:
        try:
            worker = await run(connection, **settings, **run_options)
        except psycopg.Error as exc:  # e.g. a read-only server (a standby)
            raise GraphileWorkerError(f"the worker could not start: {one_line(exc)}") from None
        await worker
        return worker.exit_code

    # Everything imported so far lives until the process ends: the collector
    # need not traverse it again, neither in the worker's collections nor in
    # the interpreter's at exit (~60 ms of a --once run here).
    gc.freeze()
    code = run_async(work())
    _exit_despite_stuck_task_threads(code)
    if code:
        sys.exit(code)


def _exit_despite_stuck_task_threads(code: int) -> None:
    """A plain ``def`` task that ignored a forced shutdown still runs in its
    thread, and Python would wait for it forever at exit. Its job is already
    failed and written back, so leave without it. So do threads a task
    started and left running (not daemon threads, which Python would wait
    for): they get a second to end, then they are named and left behind."""
    from ..worker import busy_task_threads

    log = logging.getLogger("graphile_worker")
    stuck = busy_task_threads()
    if stuck:
        log.warning(
            "%d task thread(s) still running (a plain `def` task that ignored the shutdown); "
            "exiting without waiting for them",
            stuck,
        )
    deadline = time.monotonic() + 1.0
    left = []
    for thread in threading.enumerate():
        if thread is threading.main_thread() or thread.daemon:
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            left.append(thread.name)
    if left:
        log.warning(
            "Thread(s) %s, left running by a task, did not end: exiting without waiting for "
            "them (a task should join the threads it starts, or make them daemon threads)",
            ", ".join(repr(name) for name in left),
        )
    if not stuck and not left:
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _check_shared_options_only(ctx: click.Context) -> None:
    """Before a subcommand, only the shared options (-c, -s) and -C may be given."""
    given = [
        param
        for param in ctx.command.params
        if param.name not in (*SHARED_OPTIONS, "config_file")
        and param.name is not None
        and ctx.get_parameter_source(param.name) is ParameterSource.COMMANDLINE
    ]
    if given:
        names = ", ".join(param.opts[-1] for param in given)
        raise click.UsageError(
            f"{names} cannot be used with the {ctx.invoked_subcommand} command", ctx
        )


@command.command(context_settings=CONTEXT_SETTINGS)
@connection_option
@schema_option
@click.option("--json", "as_json", is_flag=True, help="Print the figures as one JSON document.")
@click.pass_context
def status(ctx: click.Context, connection: str | None, schema: str, as_json: bool) -> None:
    """Print what is in the queue (read-only): jobs waiting, scheduled, locked
    and permanently failed, by task and by named queue, and the oldest waiting
    job."""
    from ..observe.status_report import format_json, format_text, read_status

    connection, schema = shared(ctx, connection, schema)
    figures = run_async(read_status(connection, schema=schema))
    click.echo(format_json(figures) if as_json else format_text(figures))


def _basic_auth(_ctx: click.Context, _param: click.Parameter, value: str | None) -> Any:
    if value is None:
        return None
    if not value:  # else it would silently mean "no authentication"
        raise click.BadParameter(
            "must not be empty: give USER:PASSWORD, or leave --auth out for no authentication"
        )
    from ..dashboard.security import BasicAuth

    try:
        return BasicAuth.parse(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@command.command(context_settings=CONTEXT_SETTINGS)
@connection_option
@schema_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8080,
    show_default=True,
    help="Port to listen on (0: a free one; the log line names it).",
)
@click.option("--read-only", is_flag=True, help="Show the queue; hide and refuse the actions.")
@worker_option("no_prepared_statements")
@click.option(
    "--auth",
    metavar="USER:PASSWORD",
    envvar="GRAPHILE_WORKER_DASHBOARD_AUTH",
    show_envvar=True,
    callback=_basic_auth,
    help="Ask for these HTTP Basic credentials (required on a non-loopback --host). "
    "Prefer the variable: a flag is visible to every user in the process list.",
)
@click.option(
    "--refresh",
    type=number(0, MAX_REFRESH),
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help=f"Pages refresh themselves this often (0: never; at most {MAX_REFRESH}).",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="HOST",
    envvar="GRAPHILE_WORKER_DASHBOARD_ALLOWED_HOSTS",
    show_envvar=True,
    help="Also answer requests for this host name (repeatable); any other Host but the "
    "listening address and localhost gets a 400 (DNS rebinding).",
)
@click.option(
    "--crontab",
    "crontab_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="The workers' crontab, for the Crontab page's schedules, time zones, next runs "
    "and Run now. Default: ./crontab, if there is one.",
)
@worker_option("cron_timezone")
@click.pass_context
def dashboard(ctx: click.Context, /, connection: str | None, schema: str, **options: Any) -> None:
    """Serve the web dashboard: the queue by task, state and named queue, jobs,
    worker pools, crontab, and (unless --read-only) actions on jobs."""
    try:
        from ..dashboard.serve import serve
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] not in ("starlette", "uvicorn", "jinja2"):
            raise
        raise click.ClickException(
            "the dashboard needs Starlette, uvicorn and Jinja2: " + install_hint("dashboard")
        ) from None
    connection, schema = shared(ctx, connection, schema)
    if options["crontab_file"] is None and Path("crontab").is_file():
        options["crontab_file"] = Path("crontab")
    try:
        serve(connection, schema=schema, **options)
    except GraphileWorkerError as exc:
        raise failure(exc) from None


def main() -> None:
    """Console entry point: read ``.env`` first, so it can set any option's variable."""
    load_dotenv_file()
    try:
        command(prog_name="graphile-worker")
    except KeyboardInterrupt:  # Ctrl-C before the worker could install its handlers
        click.echo("Interrupted.", err=True)
        sys.exit(130)
