"""The ``graphile-worker`` command."""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from importlib.metadata import version
from typing import Any, TypeVar

import click

from .connection import load_dotenv_file
from .errors import GraphileWorkerError, IncompatibleSchemaError

__all__ = ["command", "main"]

T = TypeVar("T")


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
@click.option(
    "--schema-only",
    is_flag=True,
    help="Install or upgrade the database schema, then exit.",
)
@click.version_option(version("graphile-worker"), "--version", prog_name="graphile-worker")
def command(connection: str | None, schema: str, schema_only: bool) -> None:
    """Run graphile-worker jobs from PostgreSQL (compatible with graphile-worker for Node)."""
    if not schema_only:
        raise click.UsageError(
            "running jobs is not available yet in this version; use --schema-only"
        )
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from .runner import run_migrations

    report = _run(run_migrations(connection, schema=schema))
    if report.applied or report.applied_py:
        click.echo(f"Schema {schema!r} migrated to revision {report.revision}.")
    else:
        click.echo(f"Schema {schema!r} is up to date (revision {report.revision}).")


def main() -> None:
    """Console entry point: read ``.env`` first, so it can set any option's variable."""
    load_dotenv_file()
    command(prog_name="graphile-worker")
