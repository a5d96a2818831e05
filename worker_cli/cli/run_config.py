"""``load_config``: the configuration file of the command line, for ``run()``.

::

    runner = await run(**load_config(), task_list={"send_email": send_email})

The file and its keys are the command line's (see :mod:`worker_cli.config.file`);
the keys become ``run()``'s keyword arguments in ``run()``'s units.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

import click

from ..config.database import load_dotenv_file
from ..config.file import check_config, read_config_file
from ..config.options import FLAGS
from ..errors import ConfigurationError
from ..runner import run
from .commands import command

__all__ = ["load_config"]

#: Options whose ``run()`` keyword has another name.
_KEYWORDS = {
    "connection": "connection_string",
    "tasks_dir": "task_directory",
    "crontab_path": "crontab_file",
}


def load_config(path: str | Path | None = None) -> dict[str, Any]:
    """The ``run()`` keyword arguments a configuration file sets.

    ``path`` is a TOML file (its ``[tool.graphile-worker]`` table if it has
    one, else its top-level keys); by default ``GRAPHILE_WORKER_CONFIG``,
    else the ``[tool.graphile-worker]`` table of ``./pyproject.toml`` (no
    such table: ``{}``). Keys are checked as the command line checks them
    (:class:`~worker_cli.config.file.ConfigFileError`, a ConfigurationError,
    names the file and the key). As on the command line, a key whose
    environment variable is set (``DATABASE_URL`` for ``connection``,
    ``.env`` included) takes that value instead. Keys of the command line
    only (``schema-only``, ``cleanup``, ``log-format``, ``embedded-db``) are
    checked and left out. Arguments given to ``run()`` beside these win, as
    flags do: ``run(**{**load_config(), "concurrency": 4})``.
    """
    load_dotenv_file()
    if path is None:
        path = os.environ.get("GRAPHILE_WORKER_CONFIG") or None
    config = read_config_file(path)
    if config is None:
        return {}
    # With the command's own settings: click keeps the help option (-h) it makes first.
    ctx = click.Context(command, **command.context_settings)
    params = {param.name: param for param in command.get_params(ctx)}
    flags = {flag.field: flag for flag in FLAGS}
    keywords = inspect.signature(run).parameters
    settings: dict[str, Any] = {}
    for name, value in check_config(config, command, ctx).items():
        value = _from_environment(ctx, params[name], value)
        keyword = _KEYWORDS.get(name, name)
        if name in flags:
            settings[name] = flags[name].to_field(value)
        elif keyword in keywords:
            settings[keyword] = value
    return settings


def _from_environment(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """The value of ``param``'s environment variable if it is set, else ``value``."""
    raw = param.value_from_envvar(ctx)
    if raw is None:
        return value
    try:
        return param.process_value(ctx, raw)
    except click.BadParameter as exc:
        names = param.envvar if isinstance(param.envvar, str) else "/".join(param.envvar or ())
        raise ConfigurationError(f"{names}: {exc.message}") from None
