"""``python manage.py graphile_worker``: the worker of a Django project.

It runs the jobs of the Django Tasks enqueued through a
:class:`~.backend.GraphileWorkerBackend` (``--backend``, default
``default``), on that backend's database and schema, for the Django queues
named by ``--queue-name``. It takes the worker's own flags (``-j``,
``--once``, ``--schema-only``, heartbeat, metrics, ...) as
``graphile-worker`` does; a click command, run by the management command.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import click
from django.tasks import task_backends
from django.tasks.exceptions import InvalidTaskBackend

from ...cli.commands import (
    log_format_option,
    metrics_host_option,
    metrics_port_option,
    metrics_registry,
    migrate_only,
    once_option,
    progress_interval_option,
    run_worker,
    schema_only_option,
    tracing_option,
    worker_settings,
)
from ...cli.common import CONTEXT_SETTINGS, worker_option
from ...errors import GraphileWorkerError
from ...observe import log_output as logs
from ...observe.log_output import LogFormat
from .backend import GraphileWorkerBackend
from .connection import conninfo_of
from .names import identifier_of
from .pruning import PRUNE_TASK, make_prune_task, prune_cron_items
from .task_runner import make_task_runner

__all__ = ["command"]


@click.command(context_settings=CONTEXT_SETTINGS)
@click.option(
    "--backend",
    "backend_alias",
    metavar="ALIAS",
    default="default",
    show_default=True,
    help="The TASKS alias whose tasks to run (a GraphileWorkerBackend).",
)
@click.option(
    "--queue-name",
    "queue_names",
    metavar="NAMES",
    default="default",
    show_default=True,
    help="Comma-separated Django queue names to run, or * for every name in the backend's QUEUES.",
)
@schema_only_option
@once_option
@worker_option("schema")
@worker_option("concurrency")
@worker_option("max_pool_size")
@worker_option("local_queue_size")
@worker_option("local_queue_horizon")
@worker_option("complete_job_batch_delay")
@worker_option("poll_interval")
@worker_option("no_prepared_statements")
@worker_option("listen_url")
@worker_option("heartbeat_interval")
@worker_option("heartbeat_timeout")
@worker_option("session_grace")
@worker_option("history")
@worker_option("timeout_grace")
@log_format_option
@progress_interval_option
@metrics_port_option
@metrics_host_option
@tracing_option
# manage.py reads these two itself, before the command runs.
@click.option("--settings", hidden=True)
@click.option("--pythonpath", hidden=True)
@click.pass_context
def command(
    ctx: click.Context,
    /,
    backend_alias: str,
    queue_names: str,
    schema_only: bool,
    once: bool,
    log_format: LogFormat,
    progress_interval: float,
    metrics_port: int | None,
    metrics_host: str,
    tracing: bool,
    settings: str | None,
    pythonpath: str | None,
    **worker_flags: Any,
) -> None:
    """Run the Django Tasks enqueued through graphile-worker (GraphileWorkerBackend)."""
    if once and schema_only:
        raise click.UsageError("--once and --schema-only cannot be used together")
    backend = _backend(backend_alias)
    if ctx.get_parameter_source("schema") is click.core.ParameterSource.DEFAULT:
        worker_flags["schema"] = backend.schema
    elif worker_flags["schema"] != backend.schema:
        raise click.UsageError(
            f"--schema {worker_flags['schema']!r} is not the schema of backend "
            f"{backend_alias!r} ({backend.schema!r}, its OPTIONS['schema']): leave it out"
        )
    queues = _queues(backend, queue_names)
    options = worker_settings(ctx, worker_flags)
    logs.configure(log_format)
    _print_once()
    try:
        conninfo = conninfo_of(backend.database)
    except GraphileWorkerError as exc:
        raise click.ClickException(str(exc)) from None
    if schema_only:
        migrate_only(conninfo, options["schema"])
        return
    if metrics_port is not None:
        options["metrics_registry"] = metrics_registry(metrics_port, metrics_host)
    runner = make_task_runner(backend.schema, type(backend))
    tasks: dict[str, Any] = {identifier_of(queue): runner for queue in queues}
    tasks[PRUNE_TASK] = make_prune_task(backend.schema)
    run_worker(
        conninfo,
        options,
        task_list=tasks,
        parsed_cron_items=prune_cron_items(backend.keep_results_days),
        once=once,
        progress_interval=progress_interval,
        tracing=tracing,
    )


def _print_once() -> None:
    """Each log line once, in the worker's format: a handler printing to the
    terminal (stderr or stdout) on a logger whose records also reach the root
    logger's (the worker's) is removed, such as Django's ``console`` handler
    of the ``django`` logger under ``DEBUG = True``. A logger that does not
    propagate keeps its own handlers."""
    terminal = {sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__}
    for logger in list(logging.Logger.manager.loggerDict.values()):
        if not isinstance(logger, logging.Logger) or not _reaches_root(logger):
            continue
        for handler in list(logger.handlers):
            if isinstance(handler, logging.StreamHandler) and handler.stream in terminal:
                logger.removeHandler(handler)


def _reaches_root(logger: logging.Logger) -> bool:
    current: logging.Logger | None = logger
    while current is not None and current.parent is not None:
        if not current.propagate:
            return False
        current = current.parent
    return True


def _backend(alias: str) -> GraphileWorkerBackend:
    try:
        backend = task_backends[alias]
    except InvalidTaskBackend as exc:
        raise click.BadParameter(str(exc), param_hint="--backend") from None
    if not isinstance(backend, GraphileWorkerBackend):
        raise click.BadParameter(
            f"TASKS[{alias!r}] is a {type(backend).__name__}, not a GraphileWorkerBackend",
            param_hint="--backend",
        )
    return backend


def _queues(backend: GraphileWorkerBackend, names: str) -> list[str]:
    """The queue names of ``--queue-name``, checked against the backend's QUEUES."""
    if names.strip() == "*":
        if not backend.queues:
            raise click.BadParameter(
                f"* means every queue in TASKS[{backend.alias!r}]['QUEUES'], which is empty: "
                "name the queues",
                param_hint="--queue-name",
            )
        return sorted(backend.queues)
    queues = [name.strip() for name in names.split(",") if name.strip()]
    if not queues:
        raise click.BadParameter("name at least one queue", param_hint="--queue-name")
    unknown = [name for name in queues if backend.queues and name not in backend.queues]
    if unknown:
        raise click.BadParameter(
            f"{', '.join(map(repr, unknown))} not in TASKS[{backend.alias!r}]['QUEUES'] "
            f"({', '.join(map(repr, sorted(backend.queues)))})",
            param_hint="--queue-name",
        )
    return queues
