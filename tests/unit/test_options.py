"""The defaults live in WorkerOptions; the CLI and run() take them from there."""

from __future__ import annotations

import dataclasses
import inspect

import click
import pytest

from worker_cli.cli.commands import command
from worker_cli.config.options import FLAGS, WorkerOptions
from worker_cli.runner import run

pytestmark = pytest.mark.unit

DEFAULTS = WorkerOptions()
FIELDS = {field.name for field in dataclasses.fields(WorkerOptions)}


def test_every_flag_sets_a_field_and_a_run_keyword() -> None:
    keywords = inspect.signature(run).parameters
    for flag in FLAGS:
        assert flag.field in FIELDS
        assert flag.field in keywords


def test_cli_defaults_are_the_fields_defaults() -> None:
    # With the command's own settings: click keeps the help option it makes first.
    ctx = click.Context(command, **command.context_settings)
    params = {param.name: param for param in command.get_params(ctx)}
    for flag in FLAGS:
        param = params[flag.field]
        assert param.get_default(ctx) == flag.default
        assert flag.to_field(flag.default) == getattr(DEFAULTS, flag.field), flag.field


def test_run_defaults_are_the_fields_defaults() -> None:
    for name, parameter in inspect.signature(run).parameters.items():
        if name in FIELDS and name not in ("schema", "log_success"):
            # schema and log_success default to None: an environment variable, then the field.
            assert parameter.default == getattr(DEFAULTS, name), name
