"""The commands about single jobs: ``add-job``, and ``job`` (its record, its
progress and attempt errors; ``--logs`` the lines its attempts logged;
``--wait`` waits for it to finish)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from ..jobs.job_spec import SMALLINT_MAX, SMALLINT_MIN
from .common import CONTEXT_SETTINGS, connection_option, run_async, schema_option, shared
from .params import MAX_WAIT, aware_datetime, json_payload, number
from .params import job_id as job_id_param

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..jobs.job import Job
    from ..jobs.job_state import AttemptError, JobLog, JobResult

__all__ = ["WAIT_TIMEOUT_EXIT", "add_job", "format_logs", "format_record", "job"]

#: Exit code of ``job --wait`` when the job has not finished in time.
WAIT_TIMEOUT_EXIT = 3


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
    from ..client.worker_utils import make_worker_utils

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
    click.echo(added(job, job_key_mode))


def added(job: Job, mode: str | None) -> str:
    """What ``add-job`` did: a new job; or, where a job had the key already
    (graphile-worker moved its revision), that job replaced (``replace``),
    updated with its run_at kept (``preserve_run_at``) or left as it was
    (``unsafe_dedupe``)."""
    where = f" in queue {job.queue_name!r}" if job.queue_name else ""
    run_at = job.run_at.isoformat()
    if job.key is None or not job.revision:
        return f"Added job {job.id} ({job.task_identifier}){where}, run at {run_at}."
    if mode == "unsafe_dedupe":
        return (
            f"Kept job {job.id} (key {job.key}): a job has this key already "
            f"(unsafe_dedupe); nothing was added, run at {run_at}."
        )
    done = "Updated" if mode == "preserve_run_at" else "Replaced"
    kept = ", its run_at kept" if mode == "preserve_run_at" else ""
    named = f"{job.task_identifier}, key {job.key}"
    return f"{done} job {job.id} ({named}){where}{kept}, run at {run_at}."


@click.command("job", context_settings=CONTEXT_SETTINGS)
@connection_option
@schema_option
@click.argument("job_id", metavar="ID", callback=job_id_param)
@click.option("--json", "as_json", is_flag=True, help="Print the record as one JSON document.")
@click.option(
    "--tracebacks",
    "all_tracebacks",
    is_flag=True,
    help="Print every attempt's traceback (default: the newest attempt's).",
)
@click.option(
    "--logs",
    "with_logs",
    is_flag=True,
    help="Print the lines each kept attempt logged through helpers.logger (a worker keeps "
    "failed and cancelled attempts' by default; --job-logs all keeps every attempt's); with "
    '--json, as "logs".',
)
@click.option(
    "--wait",
    type=number(0, MAX_WAIT),
    metavar="SECONDS",
    help=f"Wait up to SECONDS for the job to finish (at most {MAX_WAIT}); "
    f"exit code {WAIT_TIMEOUT_EXIT} if it has not.",
)
@click.pass_context
def job(
    ctx: click.Context,
    connection: str | None,
    schema: str,
    job_id: int,
    as_json: bool,
    all_tracebacks: bool,
    with_logs: bool,
    wait: float | None,
) -> None:
    """Print what is known of job ID: its state, task, queue, attempts, times,
    progress, payload, last error and result (from any process; see
    get_job_result), and every failed attempt's error a Python worker kept
    (get_job_errors), with the newest attempt's traceback; with --logs, the
    lines its kept attempts logged (get_job_logs)."""
    import psycopg

    from ..client.job_waiting import WaitTimeout
    from ..client.worker_utils import make_worker_utils
    from ..errors import GraphileWorkerError
    from ..sql import compose
    from ..sql import jobs as jobs_sql

    connection, schema = shared(ctx, connection, schema)

    async def read() -> tuple[
        JobResult | None, list[AttemptError], Extras, WaitTimeout | None, list[JobLog] | None
    ]:
        async with make_worker_utils(connection, schema=schema) as utils:
            record: JobResult | None
            timed_out = None
            if wait is None:
                record = await utils.get_job_result(job_id)
            else:
                try:
                    record = await utils.wait_for_job(job_id, wait)
                except WaitTimeout as exc:
                    record, timed_out = exc.last, exc
            errors = await utils.get_job_errors(job_id)
            logs = await utils.get_job_logs(job_id) if with_logs else None
            async with utils.connection() as conn:
                try:
                    cursor = await conn.execute(
                        compose(jobs_sql.JOB_EXTRAS, schema), {"job_id": job_id}
                    )
                except psycopg.errors.UndefinedColumn:  # the schema of a version before
                    raise GraphileWorkerError(
                        f"the graphile-worker schema {schema!r} is older than this version: "
                        "run `graphile-worker --schema-only` (or start a worker) to upgrade it"
                    ) from None
                payload, removed_by = await cursor.fetchone() or (None, None)
            return record, errors, Extras(payload, removed_by), timed_out, logs

    record, errors, extras, timed_out, logs = run_async(read())
    if record is not None:
        if as_json:
            document = record.as_dict()
            document["payload"] = None if extras.payload is None else json.loads(extras.payload)
            document["removed_by"] = extras.removed_by
            document["attempt_errors"] = [error.as_dict() for error in errors]
            if logs is not None:
                document["logs"] = [log.as_dict() for log in logs]
            click.echo(json.dumps(document))
        else:
            click.echo(format_record(record, errors, extras, all_tracebacks=all_tracebacks))
            if logs is not None:
                click.echo(format_logs(job_id, logs))
    if timed_out is not None:
        click.echo(f"Error: {timed_out}", err=True)
        ctx.exit(WAIT_TIMEOUT_EXIT)


@dataclass(frozen=True)
class Extras:
    """What ``job`` shows beside the record: the payload's text as stored
    (None: the job has left the jobs table, and the history keeps none), and
    how it was removed (None: it was not)."""

    payload: str | None = None
    removed_by: str | None = None


#: The longest payload ``job`` prints (characters of its compact JSON).
PAYLOAD_SHOWN = 500

#: How a removal was made, by the history's removed_by.
REMOVED_HOW = {
    "cli": "by an operator, from the command line",
    "dashboard": "by an operator, from the dashboard",
    "django-admin": "by an operator, from Django's admin",
    "api": "through the Python API (remove_job)",
}

#: The record's fields as ``job`` prints them, in this order.
_SHOWN = (
    ("task_identifier", "task"),
    ("queue_name", "queue"),
    ("key", "key"),
    ("created_at", "created at"),
    ("run_at", "run at"),
    ("started_at", "started at"),
    ("finished_at", "finished at"),
    ("locked_by", "locked by"),
    ("cancel_requested_at", "cancel requested at"),
    ("cancel_reason", "cancel reason"),
    ("last_error", "last error"),
)


def format_record(
    record: JobResult,
    errors: Sequence[AttemptError] = (),
    extras: Extras = Extras(),
    *,
    all_tracebacks: bool = False,
) -> str:
    """A job's record as ``graphile-worker job`` prints it: one field a line,
    only those it has, its payload cut at :data:`PAYLOAD_SHOWN` characters;
    then its attempt errors, oldest first, each by the first line of its
    error (an operator's retry, which restarted the numbers, marked among
    them), and the newest attempt's traceback (every attempt's with
    ``all_tracebacks``)."""
    held = f" ({record.paused_by})" if record.state == "paused" and record.paused_by else ""
    lines = [f"Job {record.id}: {record.state}{held}"]
    if record.state == "removed":
        how = REMOVED_HOW.get(extras.removed_by or "", extras.removed_by or "by an operator")
        when = record.finished_at.isoformat() if record.finished_at else "?"
        lines.append(f"  removed at {when}, {how}")
    if record.state == "unknown":
        lines.append(
            "  no row anywhere: finished by a Node worker, removed by Node's functions, "
            "pruned from the history, or never added"
        )
    for name, label in _SHOWN:
        value = getattr(record, name)
        if value is not None:
            shown = value.isoformat() if isinstance(value, datetime) else value
            lines.append(f"  {label}: {shown}")
        if name == "key" and record.attempts is not None:
            lines.append(f"  attempts: {record.attempts} of {record.max_attempts}")
        if name == "key" and record.progress is not None:
            updated = record.progress.updated_at.isoformat()
            lines.append(f"  progress: {record.progress}, updated {updated}")
    if record.timed_out:
        lines.append("  timed out: yes")
    lines.extend(_payload_lines(record, extras))
    if record.state == "succeeded":
        if record.result_error is not None:
            lines.append(f"  result: not kept ({record.result_error})")
        else:
            lines.append(f"  result: {json.dumps(record.result)}")
    if errors:
        lines.append("  attempt errors (oldest first):")
    for error in errors:
        at = error.failed_at.isoformat()
        if error.retried_by is not None:
            lines.append(
                f"    retried by an operator at {at} ({error.retried_by}) after "
                f"{error.attempt} attempt(s): the attempts below are numbered from 1 again"
            )
            continue
        first = (error.error or "").strip().partition("\n")[0]
        then = "retried" if error.retried else "not retried"
        lines.append(f"    attempt {error.attempt} at {at} ({then}): {first}")
    failed = [error for error in errors if error.retried_by is None and error.traceback]
    for error in failed if all_tracebacks else failed[-1:]:
        lines.append(f"  traceback of attempt {error.attempt} at {error.failed_at.isoformat()}:")
        lines.extend(f"    {line}" for line in (error.traceback or "").splitlines())
    return "\n".join(lines)


def _payload_lines(record: JobResult, extras: Extras) -> list[str]:
    """The payload line: compact JSON cut at :data:`PAYLOAD_SHOWN` characters
    (saying so), or why there is none."""
    if extras.payload is None:
        if record.task_identifier is None:  # unknown: nothing to say
            return []
        return ["  payload: not kept once the job left the jobs table"]
    try:
        text = json.dumps(json.loads(extras.payload), separators=(", ", ": "))
    except ValueError:  # a number JSON allows and Python's json reads as inf
        text = extras.payload
    if len(text) > PAYLOAD_SHOWN:
        return [
            f"  payload: {text[:PAYLOAD_SHOWN]}... (cut: {len(text):,} characters in all; "
            "--json prints it whole)"
        ]
    return [f"  payload: {text}"]


def format_logs(job_id: int, logs: Sequence[JobLog]) -> str:
    """``job ID --logs``: each kept attempt's lines, oldest attempt first,
    under a header naming the attempt, its outcome and when its lines were
    written (UTC); or why there are none."""
    if not logs:
        return (
            f"  no logs kept for job {job_id} (a worker keeps the lines a task logs through "
            "helpers.logger for failed and cancelled attempts only, unless it runs with "
            "--job-logs all; they are kept 7 days)"
        )
    lines = ["  logs (oldest attempt first):"]
    for log in logs:
        attempt = "?" if log.attempt is None else str(log.attempt)
        at = log.logged_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        lines.append(f"    attempt {attempt} ({log.outcome}, {at})")
        lines.extend(f"      {line}" for line in log.lines)
        if not log.lines:
            lines.append("      (no lines)")
    return "\n".join(lines)
