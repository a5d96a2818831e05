"""The commands about workflows: ``workflow ID`` (its steps with their state,
job and the first line of each error; ``--cancel``, ``--retry``, ``--wait``)
and ``workflows`` (a page of them, newest first)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

import click

from ..jobs.workflow_state import WORKFLOW_STATES
from .common import CONTEXT_SETTINGS, connection_option, run_async, schema_option, shared
from .params import MAX_WAIT, number
from .params import job_id as job_id_param

if TYPE_CHECKING:
    from ..jobs.workflow_state import StepInfo, WorkflowInfo

__all__ = ["format_workflow", "workflow", "workflows"]

#: Exit code of ``workflow --wait`` when the workflow is not final in time
#: (as ``job --wait``).
WAIT_TIMEOUT_EXIT = 3
#: The longest error line ``workflow`` prints.
ERROR_SHOWN = 100


@click.command("workflow", context_settings=CONTEXT_SETTINGS)
@connection_option
@schema_option
@click.argument("workflow_id", metavar="ID", callback=job_id_param)
@click.option("--json", "as_json", is_flag=True, help="Print it as one JSON document.")
@click.option(
    "--cancel",
    "cancel",
    is_flag=True,
    help="Cancel it first: no step starts any more, running steps are asked to stop.",
)
@click.option("--reason", metavar="TEXT", help="Why it is cancelled (with --cancel).")
@click.option(
    "--retry",
    "retry",
    is_flag=True,
    help="Run its failed and cancelled steps again first, and the steps after them.",
)
@click.option(
    "--wait",
    type=number(0, MAX_WAIT),
    metavar="SECONDS",
    help=f"Wait up to SECONDS for it to finish (at most {MAX_WAIT}); "
    f"exit code {WAIT_TIMEOUT_EXIT} if it has not.",
)
@click.pass_context
def workflow(
    ctx: click.Context,
    connection: str | None,
    schema: str,
    workflow_id: int,
    as_json: bool,
    cancel: bool,
    reason: str | None,
    retry: bool,
    wait: float | None,
) -> None:
    """Print workflow ID: its state, counts and each step with its state, job
    id and the first line of its error (see get_workflow)."""
    from ..client.worker_utils import make_worker_utils
    from ..client.workflow_plans import WorkflowWaitTimeout

    if cancel and retry:
        raise click.UsageError("--cancel and --retry cannot be given together")
    if reason is not None and not cancel:
        raise click.UsageError("--reason goes with --cancel")
    connection, schema = shared(ctx, connection, schema)

    async def read() -> tuple[WorkflowInfo | None, WorkflowWaitTimeout | None, str]:
        async with make_worker_utils(connection, schema=schema) as utils:
            done = ""
            if cancel and await utils.cancel_workflow(workflow_id, reason) is not None:
                done = "Cancelled: no step starts any more; running steps were asked to stop."
            if retry:
                count = await utils.retry_workflow(workflow_id)
                if count is not None:
                    done = f"Retried: {count} step(s) run again."
            if wait is None:
                return await utils.get_workflow(workflow_id), None, done
            try:
                return await utils.wait_for_workflow(workflow_id, wait), None, done
            except WorkflowWaitTimeout as exc:
                return exc.last, exc, done

    info, timed_out, done = run_async(read())
    if info is None:
        raise click.ClickException(
            f"workflow {workflow_id} does not exist (never added, or pruned)"
        )
    if as_json:
        click.echo(json.dumps(as_document(info)))
    else:
        if done:
            click.echo(done)
        click.echo(format_workflow(info))
    if timed_out is not None:
        click.echo(f"Error: {timed_out}", err=True)
        ctx.exit(WAIT_TIMEOUT_EXIT)


@click.command("workflows", context_settings=CONTEXT_SETTINGS)
@connection_option
@schema_option
@click.option(
    "--state",
    type=click.Choice(WORKFLOW_STATES),
    help="Only workflows in this state.",
)
@click.option(
    "--limit", type=click.IntRange(1, 10_000), default=50, show_default=True, help="How many."
)
@click.option("--json", "as_json", is_flag=True, help="One JSON document per line.")
@click.pass_context
def workflows(
    ctx: click.Context,
    connection: str | None,
    schema: str,
    state: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List workflows, newest first: id, name, state, and their steps' counts."""
    from ..client.worker_utils import make_worker_utils

    connection, schema = shared(ctx, connection, schema)

    async def read() -> list[WorkflowInfo]:
        async with make_worker_utils(connection, schema=schema) as utils:
            return await utils.list_workflows(state=state, limit=limit)

    found = run_async(read())
    if as_json:
        for info in found:
            click.echo(json.dumps(as_document(info)))
        return
    if not found:
        click.echo("No workflows." if state is None else f"No {state} workflows.")
        return
    header: tuple[str, ...] = ("ID", "NAME", "STATE", "STEPS", "LEFT", "CREATED", "FINISHED")
    table: list[tuple[str, ...]] = [header] + [
        (
            str(info.id),
            info.name or "-",
            info.state,
            str(info.total),
            str(info.left),
            _time(info.created_at),
            _time(info.finished_at),
        )
        for info in found
    ]
    click.echo(_table(table))


def format_workflow(info: WorkflowInfo) -> str:
    """What ``workflow ID`` prints."""
    name = f" {info.name!r}" if info.name else ""
    counts = ", ".join(
        f"{count} {word}"
        for count, word in (
            (info.succeeded, "succeeded"),
            (info.failed, "failed"),
            (info.cancelled, "cancelled"),
            (info.skipped, "skipped"),
            (info.left, "not final"),
        )
        if count
    )
    lines = [f"Workflow {info.id}{name}: {info.state} ({info.total} steps: {counts})"]
    lines.append(f"created at {_time(info.created_at)}, finished at {_time(info.finished_at)}")
    if info.cancel_requested_at is not None:
        why = f": {info.cancel_reason}" if info.cancel_reason else ""
        lines.append(f"cancel requested at {_time(info.cancel_requested_at)}{why}")
    if info.error:
        lines.append(f"error: {_first_line(info.error)}")
    rows = [("STEP", "STATE", "JOB", "TASK", "ERROR")] + [
        _step_row(step) for step in info.steps.values()
    ]
    lines.append(_table(rows))
    return "\n".join(lines)


def _step_row(step: StepInfo) -> tuple[str, ...]:
    return (
        step.ref,
        step.state,
        str(step.job_id) if step.job_id is not None else "-",
        step.task_identifier,
        _first_line(step.error) if step.error else "",
    )


def as_document(info: WorkflowInfo) -> dict[str, Any]:
    """The workflow as JSON (``--json``): its fields, times in ISO 8601, and
    (``workflow``) its steps by ref."""
    from ..jobs.workflow_state import WORKFLOW_FIELDS

    document: dict[str, Any] = {}
    for name in WORKFLOW_FIELDS:
        value = getattr(info, name)
        document[name] = value.isoformat() if isinstance(value, datetime) else value
    if info.steps:
        document["steps"] = {
            ref: {
                "state": step.state,
                "task_identifier": step.task_identifier,
                "run_if": step.run_if,
                "after": list(step.after),
                "job_id": step.job_id,
                "result": step.result,
                "error": step.error,
                "retries": step.retries,
                "queued_at": _iso(step.queued_at),
                "finished_at": _iso(step.finished_at),
            }
            for ref, step in info.steps.items()
        }
    return document


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= ERROR_SHOWN else line[: ERROR_SHOWN - 1] + "…"


def _time(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S%z")


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )
