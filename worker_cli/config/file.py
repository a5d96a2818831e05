"""The configuration file: option values in TOML, for the command line and ``run()``.

The file is the one ``-C/--config FILE`` names (its ``[tool.graphile-worker]``
table if it has one, else its top-level keys), or by default the
``[tool.graphile-worker]`` table of ``./pyproject.toml`` when that file has
one. Its keys are the command's long option names (``jobs``,
``poll-interval``), and a key accepts what its option accepts, in the
option's units: both are read from the click command's own parameters, so
every option of the command is a key, with nothing to keep in step.

Values apply where neither the command line nor the environment gave one
(:func:`apply_config_file`). A problem is one line naming the file, the key
and what was expected (:class:`ConfigFileError`, exit code 2).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable
from datetime import date, time
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import click
from click.core import ParameterSource

from ..errors import ConfigurationError

__all__ = [
    "ConfigFile",
    "ConfigFileError",
    "apply_config_file",
    "check_config",
    "config_file_option",
    "read_config_file",
    "set_by_config_file",
]

F = TypeVar("F", bound=Callable[..., Any])

PYPROJECT = "pyproject.toml"
TABLE = "tool.graphile-worker"
#: Options that make no sense in a file.
REFUSED = ("help", "version", "config")
#: Keys a subcommand (``status``, ``add-job``, ...) reads from the file too.
SHARED = ("connection", "schema")
#: Where ``ctx.meta`` keeps how messages name the file applied to a command.
_WHERE = "graphile_worker.config_file"


class ConfigFileError(ConfigurationError):
    """The configuration file cannot be read or has a bad key or value."""

    exit_code = 2


class _Problem(click.ClickException):
    """A ConfigFileError as the command line shows it: one line, exit code 2."""

    exit_code = ConfigFileError.exit_code


class ConfigFile(NamedTuple):
    """The option values of one file, as read (not checked yet)."""

    path: Path
    #: How messages name it: the path, with the table if it is one.
    where: str
    values: dict[str, Any]


def read_config_file(path: str | Path | None = None) -> ConfigFile | None:
    """The file ``path`` (which must exist), else ``./pyproject.toml``'s
    ``[tool.graphile-worker]`` table, else None."""
    if path is None:
        default = Path(PYPROJECT)
        if not default.is_file():
            return None
        table = _table(default, _parse(default))
        return None if table is None else ConfigFile(default, f"{default} [{TABLE}]", table)
    path = Path(path)
    document = _parse(path)
    table = _table(path, document)
    if table is None:
        return ConfigFile(path, str(path), document)
    return ConfigFile(path, f"{path} [{TABLE}]", table)


def _parse(path: Path) -> dict[str, Any]:
    try:
        text = path.read_bytes().decode()
    except OSError as exc:
        raise ConfigFileError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        bad_line = exc.object[: exc.start].count(b"\n") + 1
        raise ConfigFileError(f"{path}, line {bad_line}: not UTF-8 text") from None
    import tomllib  # only when there is a file to read: a worker starts without it

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        found = re.search(r" \(at line (\d+), column (\d+)\)$", message)
        if found:
            line, where = found[1], f"column {found[2]}"
            message = message[: found.start()]
        else:
            line, where = str(len(text.splitlines()) or 1), "end of file"
            message = message.removesuffix(" (at end of document)")
        raise ConfigFileError(f"{path}, line {line}: not valid TOML: {message} ({where})") from None


def _table(path: Path, document: dict[str, Any]) -> dict[str, Any] | None:
    """The ``[tool.graphile-worker]`` table, or None if there is none."""
    tool = document.get("tool")
    table = tool.get("graphile-worker") if isinstance(tool, dict) else None
    if table is not None and not isinstance(table, dict):
        raise ConfigFileError(f"{path}: [{TABLE}] must be a table, not {_shown(table)}")
    return table


def option_keys(command: click.Command, ctx: click.Context) -> dict[str, click.Option]:
    """Each option of ``command`` by its key: its first long name without ``--``."""
    keys: dict[str, click.Option] = {}
    for param in command.get_params(ctx):
        if not isinstance(param, click.Option):
            continue
        long_names = [name for name in param.opts if name.startswith("--")]
        if long_names:
            keys[long_names[0][2:]] = param
    return keys


def check_config(config: ConfigFile, command: click.Command, ctx: click.Context) -> dict[str, Any]:
    """The file's values checked and converted by their options (types, ranges,
    callbacks), by parameter name; paths are relative to the file's folder."""
    keys = option_keys(command, ctx)
    known = [key for key in keys if key not in REFUSED]
    values: dict[str, Any] = {}
    for key, value in config.values.items():
        if key in REFUSED:
            raise ConfigFileError(f"{config.where}: '{key}' cannot be set in a config file")
        param = keys.get(key)
        if param is None or param.name is None:
            raise ConfigFileError(f"{config.where}: unknown key {key!r}{_hint(key, known)}")
        values[param.name] = _convert(config, key, param, value, ctx)
    return values


def _hint(key: str, known: list[str]) -> str:
    import difflib  # only for the message of an unknown key

    close = difflib.get_close_matches(key.replace("_", "-"), known, n=1)
    maybe = f" (did you mean '{close[0]}'?)" if close else ""
    return f"{maybe}; known keys: {', '.join(known)}"


def _convert(
    config: ConfigFile, key: str, param: click.Option, value: Any, ctx: click.Context
) -> Any:
    expected, fits = _expectation(param)
    items = value if param.multiple and isinstance(value, list) else [value]
    if (param.multiple and not isinstance(value, list)) or not all(map(fits, items)):
        raise ConfigFileError(
            f"{config.where}: key '{key}': expected {expected}, got {_shown(value)}"
        )
    if isinstance(param.type, click.Path):
        items = [str(config.path.parent / item) for item in items]
    try:
        converted = param.type_cast_value(ctx, items if param.multiple else items[0])
    except click.BadParameter:
        raise ConfigFileError(
            f"{config.where}: key '{key}': expected {expected}, got {_shown(value)}"
        ) from None
    if param.callback is None:
        return converted
    try:
        return param.callback(ctx, param, converted)
    except click.BadParameter as exc:
        raise ConfigFileError(f"{config.where}: key '{key}': {exc.message}") from None


def _expectation(param: click.Option) -> tuple[str, Callable[[Any], bool]]:
    """What a key accepts, in words, and the TOML values of the right type."""
    kind = param.type
    expected: str
    fits: Callable[[Any], bool]
    if param.is_flag or isinstance(kind, click.types.BoolParamType):
        expected, fits = "true or false", lambda v: isinstance(v, bool)
    elif isinstance(kind, click.types.IntParamType):
        expected = "an integer" + _range(kind)
        fits = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    elif isinstance(kind, click.types.FloatParamType):
        expected = "a number" + _range(kind)
        fits = lambda v: isinstance(v, int | float) and not isinstance(v, bool)  # noqa: E731
    elif isinstance(kind, click.Choice):
        expected = "one of " + ", ".join(json.dumps(str(choice)) for choice in kind.choices)
        fits = lambda v: isinstance(v, str)  # noqa: E731
    else:
        expected, fits = "a string", lambda v: isinstance(v, str)
    if param.multiple:
        expected = f"an array of {expected}"
    return expected, fits


def _range(kind: object) -> str:
    if not isinstance(kind, click.IntRange | click.FloatRange):
        return ""
    if kind.min is not None and kind.max is not None and not (kind.min_open or kind.max_open):
        return f" from {kind.min} to {kind.max}"
    low = f"{'>' if kind.min_open else '>='} {kind.min}" if kind.min is not None else ""
    high = f"{'<' if kind.max_open else '<='} {kind.max}" if kind.max is not None else ""
    return " " + " and ".join(part for part in (low, high) if part)


def _shown(value: Any) -> str:
    """A TOML value as a message shows it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, date | time):
        return value.isoformat()
    return repr(value)


def apply_config_file(ctx: click.Context, path: Path | None) -> dict[str, Any]:
    """Read the file and give its values to the parameters of ``ctx`` that
    neither the command line nor the environment set (click's
    ParameterSource says which); returns those values by parameter name.
    Subcommands get the shared keys (connection, schema) as their defaults,
    which also rank below their command line and environment."""
    try:
        config = read_config_file(path)
        values = {} if config is None else check_config(config, ctx.command, ctx)
    except ConfigFileError as exc:
        raise _Problem(str(exc)) from None
    if config is not None:
        ctx.meta[_WHERE] = config.where
    applied: dict[str, Any] = {}
    for name, value in values.items():
        if ctx.get_parameter_source(name) in (ParameterSource.DEFAULT, None):
            ctx.params[name] = value
            ctx.set_parameter_source(name, ParameterSource.DEFAULT_MAP)
            applied[name] = value
    shared = {name: values[name] for name in SHARED if name in values}
    if shared and isinstance(ctx.command, click.Group):
        ctx.default_map = {name: dict(shared) for name in ctx.command.commands}
    return applied


def set_by_config_file(ctx: click.Context, names: Iterable[str]) -> str | None:
    """Which of the parameters ``names`` took their value from the config file,
    as an error message names them (``w.toml: key 'jobs'``); None if none did."""
    where = ctx.meta.get(_WHERE)
    if where is None:
        return None
    keys = {param.name: key for key, param in option_keys(ctx.command, ctx).items()}
    from_file = [
        f"key {keys[name]!r}"
        for name in names
        if name in keys and ctx.get_parameter_source(name) is ParameterSource.DEFAULT_MAP
    ]
    return f"{where}: {', '.join(from_file)}" if from_file else None


def config_file_option(function: F) -> F:
    """``-C/--config FILE`` for a command (put it above ``click.pass_context``):
    the file's values replace those of the options left at their defaults
    before the command runs."""

    @functools.wraps(function)
    def with_config(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        kwargs.update(apply_config_file(ctx, kwargs.pop("config_file")))
        return function(*args, **kwargs)

    option = click.option(
        "-C",
        "--config",
        "config_file",
        metavar="FILE",
        type=click.Path(path_type=Path),
        envvar="GRAPHILE_WORKER_CONFIG",
        show_envvar=True,
        help="TOML file of option values (keys: the long option names, e.g. jobs = 4). "
        "Default: the [tool.graphile-worker] table of ./pyproject.toml, if it has one.",
    )
    return option(with_config)  # type: ignore[return-value]
