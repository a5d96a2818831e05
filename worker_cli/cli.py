"""The ``graphile-worker`` command: the same flags as graphile-worker (Node) 0.18."""

from __future__ import annotations

import gc
import logging
import os
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from . import logs
from ._version import __version__
from .config import load_dotenv_file
from .errors import GraphileWorkerError, IncompatibleSchemaError
from .logs import LOG_FORMATS, LogFormat
from .options import WorkerOptions

__all__ = ["command", "main"]

T = TypeVar("T")

CLEANUP_TASKS = (
    "GC_TASK_IDENTIFIERS",
    "GC_JOB_QUEUES",
    "DELETE_PERMAFAILED_JOBS",
    "GC_UNIQUE_LOCKS",
)


class SchemaIncompatible(click.ClickException):
    """The database's schema is newer and breaking: exit code 57, as Node's."""

    exit_code = IncompatibleSchemaError.exit_code


def _failure(error: GraphileWorkerError) -> click.ClickException:
    """The error as click shows it: one line, exit code 1 (57 for the schema)."""
    if isinstance(error, IncompatibleSchemaError):
        return SchemaIncompatible(str(error))
    return click.ClickException(str(error))


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    import uvloop

    try:
        return uvloop.run(coroutine)
    except GraphileWorkerError as exc:
        raise _failure(exc) from None


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


CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}

#: Options the worker and its subcommands share (given before a subcommand,
#: they apply to it).
connection_option = click.option(
    "-c",
    "--connection",
    metavar="URL",
    envvar="DATABASE_URL",
    show_envvar=True,
    help="PostgreSQL connection string. Default: DATABASE_URL, else the libpq PG* variables.",
)
schema_option = click.option(
    "-s",
    "--schema",
    envvar="GRAPHILE_WORKER_SCHEMA",
    show_envvar=True,
    default="graphile_worker",
    show_default=True,
    help="The schema graphile-worker's tables and functions live in.",
)
SHARED_OPTIONS = ("connection", "schema")


@click.group(
    context_settings=CONTEXT_SETTINGS,
    invoke_without_command=True,
    subcommand_metavar="[COMMAND [ARGS]...]",
)
@connection_option
@schema_option
@click.option("--schema-only", is_flag=True, help="Install or upgrade the schema, then exit.")
@click.option("--once", is_flag=True, help="Run until no runnable job is left, then exit.")
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="How many jobs to run at the same time.",
)
@click.option(
    "-m",
    "--max-pool-size",
    type=click.IntRange(min=2),
    default=10,
    show_default=True,
    help="Largest number of PostgreSQL connections in the pool.",
)
@click.option(
    "--local-queue-size",
    type=click.IntRange(min=0),
    default=200,
    show_default=True,
    envvar="GRAPHILE_WORKER_LOCAL_QUEUE_SIZE",
    show_envvar=True,
    help="Most jobs fetched ahead of free slots (about 50 ms of work at the current "
    "rate is kept; 0: fetch only for idle slots). A crashed worker holds at most "
    "this many plus -j jobs until their locks expire.",
)
@click.option(
    "--complete-job-batch-delay",
    type=click.IntRange(min=0, max=10000),
    default=2,
    show_default=True,
    metavar="MS",
    envvar="GRAPHILE_WORKER_COMPLETE_JOB_BATCH_DELAY",
    show_envvar=True,
    help="While the worker is busy, how long finished jobs may wait for others to be "
    "written back with them (one statement and one commit); 0: write as soon as "
    "the previous write is done.",
)
@click.option(
    "--poll-interval",
    type=click.IntRange(min=1),
    default=2000,
    show_default=True,
    metavar="MS",
    help="Milliseconds between polls for due jobs (scheduled jobs and retries) when idle.",
)
@click.option(
    "--no-prepared-statements",
    is_flag=True,
    help="Do not use prepared statements (for pgBouncer in transaction mode).",
)
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
@click.option(
    "--heartbeat-interval",
    type=click.FloatRange(min=0),
    default=WorkerOptions.heartbeat_interval,
    show_default=True,
    envvar="GRAPHILE_WORKER_HEARTBEAT_INTERVAL",
    show_envvar=True,
    metavar="SECONDS",
    help="Record a heartbeat this often, and release the jobs of worker pools whose "
    "heartbeat stopped (crashed workers). 0 turns heartbeats off.",
)
@click.option(
    "--heartbeat-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=WorkerOptions.heartbeat_timeout,
    show_default=True,
    envvar="GRAPHILE_WORKER_HEARTBEAT_TIMEOUT",
    show_envvar=True,
    metavar="SECONDS",
    help="A pool without a heartbeat for this long is declared dead by the others and its "
    "jobs run again; keep it well above any pause a worker may have (at least twice "
    "the interval).",
)
@click.option(
    "--tasks",
    "tasks_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("tasks"),
    show_default=True,
    help="Folder of task files (.py modules with a `task` function, or executables).",
)
@click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    default="text",
    show_default=True,
    envvar="GRAPHILE_WORKER_LOG_FORMAT",
    show_envvar=True,
    help="Log lines as text, or as JSON objects (one per line, with the job's fields).",
)
@click.option(
    "--progress-interval",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    envvar="GRAPHILE_WORKER_PROGRESS_INTERVAL",
    show_envvar=True,
    help="With --once: log jobs done, rate and jobs remaining this often (0: never).",
)
@click.option(
    "--embedded-db",
    metavar="DIR",
    type=click.Path(path_type=Path, file_okay=False),
    help="Start a private PostgreSQL with its data in DIR (created on first use, kept) "
    "and use it; for trying and developing. Needs graphile-worker[embedded].",
)
@click.version_option(__version__, "--version", prog_name="graphile-worker")
@click.pass_context
def command(
    ctx: click.Context,
    connection: str | None,
    schema: str,
    schema_only: bool,
    once: bool,
    jobs: int,
    max_pool_size: int,
    local_queue_size: int,
    complete_job_batch_delay: int,
    poll_interval: int,
    no_prepared_statements: bool,
    cleanup: list[str],
    crontab_path: Path | None,
    heartbeat_interval: float,
    heartbeat_timeout: float,
    tasks_dir: Path,
    log_format: LogFormat,
    progress_interval: float,
    embedded_db: Path | None,
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
    try:
        WorkerOptions(heartbeat_interval=heartbeat_interval, heartbeat_timeout=heartbeat_timeout)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    logs.configure(log_format)
    if embedded_db is not None:  # runs until the command ends
        from .embedded import use_embedded_database

        connection = use_embedded_database(embedded_db, connection)
    from . import runner
    from .worker_utils import make_worker_utils

    if schema_only:
        report = _run(runner.run_migrations(connection, schema=schema))
        if report.applied or report.applied_py:
            click.echo(f"Schema {schema!r} migrated to revision {report.revision}.")
        else:
            click.echo(f"Schema {schema!r} is up to date (revision {report.revision}).")
        return

    if cleanup:

        async def clean() -> None:
            async with make_worker_utils(connection, schema=schema) as utils:
                await utils.migrate()
                await utils.cleanup(cleanup)  # type: ignore[arg-type]

        _run(clean())
        click.echo(f"Cleanup done: {', '.join(cleanup)}.")
        return

    crontab_file = crontab_path
    if crontab_file is None and Path("crontab").is_file():
        crontab_file = Path("crontab")

    async def work() -> int:
        worker = await runner.run(
            connection,
            task_directory=tasks_dir,
            concurrency=jobs,
            schema=schema,
            poll_interval=poll_interval / 1000,
            max_pool_size=max_pool_size,
            local_queue_size=local_queue_size,
            complete_job_batch_delay=complete_job_batch_delay / 1000,
            no_prepared_statements=no_prepared_statements,
            once=once,
            progress_interval=progress_interval,
            crontab_file=crontab_file,
            heartbeat_interval=heartbeat_interval,
            heartbeat_timeout=heartbeat_timeout,
        )
        await worker
        return worker.exit_code

    # Everything imported so far lives until the process ends: the collector
    # need not traverse it again, neither in the worker's collections nor in
    # the interpreter's at exit (~60 ms of a --once run here).
    gc.freeze()
    code = _run(work())
    _exit_despite_stuck_task_threads(code)
    if code:
        sys.exit(code)


def _exit_despite_stuck_task_threads(code: int) -> None:
    """A plain ``def`` task that ignored a forced shutdown still runs in its
    thread, and Python would wait for it forever at exit. Its job is already
    failed and written back, so leave without it."""
    from .worker import busy_task_threads

    stuck = busy_task_threads()
    if not stuck:
        return
    logging.getLogger("graphile_worker").warning(
        "%d task thread(s) still running (a plain `def` task that ignored the shutdown); "
        "exiting without waiting for them",
        stuck,
    )
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _check_shared_options_only(ctx: click.Context) -> None:
    """Before a subcommand, only the shared options (-c, -s) may be given."""
    given = [
        param
        for param in ctx.command.params
        if param.name not in SHARED_OPTIONS
        and param.name is not None
        and ctx.get_parameter_source(param.name) is ParameterSource.COMMANDLINE
    ]
    if given:
        names = ", ".join(param.opts[-1] for param in given)
        raise click.UsageError(
            f"{names} cannot be used with the {ctx.invoked_subcommand} command", ctx
        )


def _shared(ctx: click.Context, name: str, value: Any) -> Any:
    """A shared option's value: the subcommand's own, unless it was only given
    (on the command line) before the subcommand."""
    parent = ctx.parent
    if (
        parent is not None
        and ctx.get_parameter_source(name) is not ParameterSource.COMMANDLINE
        and parent.get_parameter_source(name) is ParameterSource.COMMANDLINE
    ):
        return parent.params[name]
    return value


@command.command(context_settings=CONTEXT_SETTINGS)
@connection_option
@schema_option
@click.option("--json", "as_json", is_flag=True, help="Print the figures as one JSON document.")
@click.pass_context
def status(ctx: click.Context, connection: str | None, schema: str, as_json: bool) -> None:
    """Print what is in the queue (read-only): jobs waiting, scheduled, locked
    and permanently failed, by task and by named queue, and the oldest waiting
    job."""
    from .status import format_json, format_text, read_status

    connection = _shared(ctx, "connection", connection)
    schema = _shared(ctx, "schema", schema)
    figures = _run(read_status(connection, schema=schema))
    click.echo(format_json(figures) if as_json else format_text(figures))


def _json_payload(_ctx: click.Context, _param: click.Parameter, value: str | None) -> Any:
    if value is None:
        return None
    import json

    try:
        return json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON ({exc}): {value!r}") from None


def _aware_datetime(_ctx: click.Context, _param: click.Parameter, value: str | None) -> Any:
    if value is None:
        return None
    from datetime import datetime

    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"not an ISO 8601 date and time: {value!r}") from None
    if moment.tzinfo is None:
        raise click.BadParameter(
            f"{value!r} has no time zone; add one, e.g. {value}+00:00 or {value}Z"
        )
    return moment


@command.command("add-job", context_settings=CONTEXT_SETTINGS)
@connection_option
@schema_option
@click.argument("identifier")
@click.argument("payload", required=False, callback=_json_payload)
@click.option("-q", "--queue", "queue_name", metavar="NAME", help="Named queue (runs serially).")
@click.option(
    "--run-at",
    metavar="DATETIME",
    callback=_aware_datetime,
    help="When to run it, ISO 8601 with a time zone. Default: now.",
)
@click.option("--max-attempts", type=click.IntRange(min=1), help="Default: 25.")
@click.option("--priority", type=int, help="Lower runs first. Default: 0.")
@click.option("--job-key", metavar="KEY", help="Replace or dedupe the pending job with this key.")
@click.option(
    "--job-key-mode",
    type=click.Choice(["replace", "preserve_run_at", "unsafe_dedupe"]),
    help="How --job-key treats an existing job. Default: replace.",
)
@click.option("--flag", "flags", multiple=True, metavar="FLAG", help="A flag (repeatable).")
@click.pass_context
def add_job(
    ctx: click.Context,
    connection: str | None,
    schema: str,
    identifier: str,
    payload: Any,
    queue_name: str | None,
    run_at: Any,
    max_attempts: int | None,
    priority: int | None,
    job_key: str | None,
    job_key_mode: Any,
    flags: tuple[str, ...],
) -> None:
    """Add a job: IDENTIFIER is the task, PAYLOAD a JSON document (default {}).

    The schema must be installed (run the worker or --schema-only first).
    """
    from .worker_utils import make_worker_utils

    connection = _shared(ctx, "connection", connection)
    schema = _shared(ctx, "schema", schema)

    async def add() -> Any:
        async with make_worker_utils(connection, schema=schema) as utils:
            return await utils.add_job(
                identifier,
                payload,
                queue_name=queue_name,
                run_at=run_at,
                max_attempts=max_attempts,
                priority=priority,
                job_key=job_key,
                job_key_mode=job_key_mode,
                flags=list(flags) or None,
            )

    try:
        job = _run(add())
    except ValueError as exc:  # JobSpecError names the field
        raise click.UsageError(str(exc), ctx) from None
    where = f" in queue {job.queue_name!r}" if job.queue_name else ""
    click.echo(
        f"Added job {job.id} ({job.task_identifier}){where}, run at {job.run_at.isoformat()}."
    )


def main() -> None:
    """Console entry point: read ``.env`` first, so it can set any option's variable."""
    load_dotenv_file()
    try:
        command(prog_name="graphile-worker")
    except KeyboardInterrupt:  # Ctrl-C before the worker could install its handlers
        click.echo("Interrupted.", err=True)
        sys.exit(130)
