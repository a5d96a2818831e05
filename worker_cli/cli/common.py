"""What the commands share: options built from ``WorkerOptions``, the
connection and schema options of the subcommands, and running a coroutine
with the package's errors as click's one-line errors."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from ..config.options import FLAGS
from ..errors import GraphileWorkerError, IncompatibleSchemaError
from .params import number, schema_name

__all__ = [
    "CONTEXT_SETTINGS",
    "FLAGS_BY_FIELD",
    "SHARED_OPTIONS",
    "SchemaIncompatible",
    "connection_option",
    "failure",
    "run_async",
    "schema_option",
    "shared",
    "worker_option",
]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class SchemaIncompatible(click.ClickException):
    """The database's schema is newer and breaking: exit code 57, as Node's."""

    exit_code = IncompatibleSchemaError.exit_code


def failure(error: GraphileWorkerError) -> click.ClickException:
    """The error as click shows it: one line, exit code 1 (57 for the schema)."""
    if isinstance(error, IncompatibleSchemaError):
        return SchemaIncompatible(str(error))
    return click.ClickException(str(error))


def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    import uvloop

    try:
        return uvloop.run(coroutine)
    except GraphileWorkerError as exc:
        raise failure(exc) from None


CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}

#: The flag of each WorkerOptions field that has one.
FLAGS_BY_FIELD = {flag.field: flag for flag in FLAGS}


def worker_option(field: str) -> Callable[[F], F]:
    """The click option of a WorkerOptions field, from its row in ``FLAGS``:
    its default is the field's, and its value is passed to the field's name."""
    flag = FLAGS_BY_FIELD[field]
    if flag.switch:  # on by default: --history on|off
        return click.option(
            *flag.names,
            field,
            type=click.Choice(["on", "off"]),
            default=flag.default,
            show_default=True,
            envvar=flag.envvar,
            show_envvar=flag.envvar is not None,
            help=flag.help,
        )
    if flag.choices is not None:
        return click.option(
            *flag.names,
            field,
            type=click.Choice(flag.choices),
            default=flag.default,
            show_default=True,
            envvar=flag.envvar,
            show_envvar=flag.envvar is not None,
            help=flag.help,
        )
    if isinstance(flag.default, bool):
        return click.option(
            *flag.names,
            field,
            is_flag=True,
            envvar=flag.envvar,
            show_envvar=flag.envvar is not None,
            help=flag.help,
        )
    kind: click.IntRange | click.FloatRange | None = None
    if flag.low is not None or flag.high is not None:
        kind = number(flag.low, flag.high, whole=flag.whole, low_open=flag.low_open)
    return click.option(
        *flag.names,
        field,
        type=kind,
        callback=schema_name if field == "schema" else None,
        default=flag.default,
        show_default=True,
        envvar=flag.envvar,
        show_envvar=flag.envvar is not None,
        metavar=flag.metavar,
        help=flag.help,
    )


#: Options the worker and its subcommands share (given before a subcommand,
#: they apply to it; -C/--config may come before a subcommand too).
connection_option = click.option(
    "-c",
    "--connection",
    metavar="URL",
    envvar="DATABASE_URL",
    show_envvar=True,
    help="PostgreSQL connection string. Default: DATABASE_URL, else the libpq PG* variables.",
)
schema_option = worker_option("schema")
SHARED_OPTIONS = ("connection", "schema")


def shared(ctx: click.Context, connection: str | None, schema: str) -> tuple[str | None, str]:
    """A subcommand's connection and schema: its own, unless an option was only
    given (on the command line) before the subcommand."""
    parent = ctx.parent

    def value(name: str, own: Any) -> Any:
        if (
            parent is not None
            and ctx.get_parameter_source(name) is not ParameterSource.COMMANDLINE
            and parent.get_parameter_source(name) is ParameterSource.COMMANDLINE
        ):
            return parent.params[name]
        return own

    return value("connection", connection), value("schema", schema)
