"""The ``graphile-worker`` command: the same flags as graphile-worker (Node) 0.18."""

from __future__ import annotations

import logging
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import click

from ._version import __version__
from .connection import load_dotenv_file
from .errors import GraphileWorkerError, IncompatibleSchemaError

__all__ = ["command", "main"]

T = TypeVar("T")

CLEANUP_TASKS = ("GC_TASK_IDENTIFIERS", "GC_JOB_QUEUES", "DELETE_PERMAFAILED_JOBS")


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


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "-c",
    "--connection",
    metavar="URL",
    help="PostgreSQL connection string. Default: DATABASE_URL, else the libpq PG* variables.",
)
@click.option(
    "-s",
    "--schema",
    envvar="GRAPHILE_WORKER_SCHEMA",
    show_envvar=True,
    default="graphile_worker",
    show_default=True,
    help="The schema graphile-worker's tables and functions live in.",
)
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
    "--tasks",
    "tasks_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("tasks"),
    show_default=True,
    help="Folder of task files (.py modules with a `task` function, or executables).",
)
@click.version_option(__version__, "--version", prog_name="graphile-worker")
def command(
    connection: str | None,
    schema: str,
    schema_only: bool,
    once: bool,
    jobs: int,
    max_pool_size: int,
    poll_interval: int,
    no_prepared_statements: bool,
    cleanup: list[str],
    crontab_path: Path | None,
    tasks_dir: Path,
) -> None:
    """Run jobs from a PostgreSQL queue shared with graphile-worker (Node)."""
    if once and schema_only:
        raise click.UsageError("--once and --schema-only cannot be used together")
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr
    )
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
            no_prepared_statements=no_prepared_statements,
            once=once,
            crontab_file=crontab_file,
        )
        await worker
        return worker.exit_code

    code = _run(work())
    if code:
        sys.exit(code)


def main() -> None:
    """Console entry point: read ``.env`` first, so it can set any option's variable."""
    load_dotenv_file()
    try:
        command(prog_name="graphile-worker")
    except KeyboardInterrupt:  # Ctrl-C before the worker could install its handlers
        click.echo("Interrupted.", err=True)
        sys.exit(130)
