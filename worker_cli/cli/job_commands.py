"""The commands about single jobs: ``add-job``."""

from __future__ import annotations

from typing import Any

import click

from ..jobs.job_spec import SMALLINT_MAX, SMALLINT_MIN
from .common import CONTEXT_SETTINGS, connection_option, run_async, schema_option, shared
from .params import aware_datetime, json_payload

__all__ = ["add_job"]


@click.command("add-job", context_settings=CONTEXT_SETTINGS)
@connection_option
@schema_option
@click.argument("identifier")
@click.argument("payload", required=False, callback=json_payload)
@click.option("-q", "--queue", "queue_name", metavar="NAME", help="Named queue (runs serially).")
@click.option(
    "--run-at",
    metavar="DATETIME",
    callback=aware_datetime,
    help="When to run it, ISO 8601 with a time zone. Default: now.",
)
@click.option(
    "--max-attempts", type=click.IntRange(1, SMALLINT_MAX), help="Default: 25 (at most 32767)."
)
@click.option(
    "--priority",
    type=click.IntRange(SMALLINT_MIN, SMALLINT_MAX),
    help="Lower runs first, from -32768 to 32767. Default: 0.",
)
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
    from ..jobs.worker_utils import make_worker_utils

    connection, schema = shared(ctx, connection, schema)

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
        job = run_async(add())
    except ValueError as exc:  # JobSpecError names the field
        raise click.UsageError(str(exc), ctx) from None
    where = f" in queue {job.queue_name!r}" if job.queue_name else ""
    click.echo(
        f"Added job {job.id} ({job.task_identifier}){where}, run at {job.run_at.isoformat()}."
    )
