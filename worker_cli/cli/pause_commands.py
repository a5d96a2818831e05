"""The commands about pauses: ``pause``, ``resume`` and ``pauses`` (the
list, ``--json`` too). ``pause`` and ``resume`` name what they paused or
resumed alike (``*``: every task, every named queue)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import click

from .common import CONTEXT_SETTINGS, connection_option, run_async, schema_option, shared
from .params import aware_datetime

if TYPE_CHECKING:
    from ..client.worker_utils import WorkerUtils
    from ..jobs.pause_spec import Pause

__all__ = ["pause", "pauses", "resume"]


def length(_ctx: click.Context, _param: click.Parameter, value: str | None) -> timedelta | None:
    """``--for``: a length such as 90, 90s, 10m, 2h or 1d (above 0, at most 366 days)."""
    from ..jobs.pause_spec import parse_length

    if value is None:
        return None
    try:
        return parse_length(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _target(queue: str | None, task: str | None) -> dict[str, str]:
    if (queue is None) == (task is None):
        raise click.UsageError("give either --queue NAME or --task IDENTIFIER (one of them)")
    return {"queue": queue} if queue is not None else {"task": task}  # type: ignore[dict-item]


def _describe(pause: Pause) -> str:
    from ..jobs.pause_spec import describe_target

    line = describe_target(pause.kind, pause.name)
    line += f": paused since {pause.paused_at.isoformat()}"
    line += f", until {pause.resume_at.isoformat()}" if pause.resume_at else ", until resumed"
    if pause.hold_queue_lock:
        line += ", Node workers held off too"
    if pause.reason:
        line += f" ({pause.reason})"
    return line


_queue = click.option("--queue", metavar="NAME", help="A named queue ('*': every named queue).")
_task = click.option("--task", metavar="IDENTIFIER", help="A task identifier ('*': every task).")


@click.command("pause", context_settings=CONTEXT_SETTINGS)
@connection_option
@schema_option
@_queue
@_task
@click.option("--for", "for_", metavar="LENGTH", callback=length, help="e.g. 10m, 2h, 1d.")
@click.option(
    "--until", metavar="DATETIME", callback=aware_datetime, help="ISO 8601 with a time zone."
)
@click.option("--reason", metavar="TEXT", help="Why: shown with the pause.")
@click.option(
    "--hold-queue-lock",
    is_flag=True,
    help="Keep Node workers off the named queue too (holds its lock; fails open when no "
    "Python worker has run for 4 hours).",
)
@click.pass_context
def pause(
    ctx: click.Context,
    connection: str | None,
    schema: str,
    queue: str | None,
    task: str | None,
    for_: timedelta | None,
    until: Any,
    reason: str | None,
    hold_queue_lock: bool,
) -> None:
    """Pause a named queue or a task on every Python worker: its jobs wait
    (running ones finish; jobs can still be added) until `resume`, or for a
    while (--for, --until)."""
    from ..client.worker_utils import make_worker_utils

    target = _target(queue, task)
    if for_ is not None and until is not None:
        raise click.UsageError("give --for or --until, not both")
    connection, schema = shared(ctx, connection, schema)

    async def pause_it() -> Pause:
        async with make_worker_utils(connection, schema=schema) as utils:
            if until is not None:
                await _refuse_past(utils, until)
            return await utils.pause(
                **target,
                until=until if until is not None else for_,
                reason=reason,
                hold_queue_lock=hold_queue_lock,
            )

    try:
        click.echo("Paused " + _describe(run_async(pause_it())))
    except ValueError as exc:  # JobSpecError: the one line naming the field
        raise click.UsageError(str(exc)) from None


async def _refuse_past(utils: WorkerUtils, until: datetime) -> None:
    """``--until`` must lie ahead of the database's clock (as the dashboard's
    form): a pause ending in the past would pause nothing, and would end a
    pause of the same queue or task in force."""
    from ..sql import clock as clock_sql

    async with utils.connection() as conn:
        cursor = await conn.execute(clock_sql.NOW)
        row = await cursor.fetchone()
    assert row is not None
    now: datetime = row[0]
    if until <= now:
        raise click.BadParameter(
            f"{until.isoformat()} has passed already (the database's clock reads "
            f"{now.astimezone(UTC).isoformat(timespec='seconds')}); give a time ahead, "
            "or a length with --for",
            param_hint="'--until'",
        )


@click.command("resume", context_settings=CONTEXT_SETTINGS)
@connection_option
@schema_option
@_queue
@_task
@click.pass_context
def resume(
    ctx: click.Context, connection: str | None, schema: str, queue: str | None, task: str | None
) -> None:
    """End a pause."""
    from ..client.worker_utils import make_worker_utils

    target = _target(queue, task)
    kind = next(iter(target))
    connection, schema = shared(ctx, connection, schema)

    async def resume_it() -> tuple[bool, list[Pause]]:
        async with make_worker_utils(connection, schema=schema) as utils:
            resumed = await utils.resume(**target)
            return resumed, await utils.list_pauses() if target.get(kind) == "*" else []

    from ..jobs.pause_spec import describe_target

    name = target[kind]
    try:
        resumed, left = run_async(resume_it())
    except ValueError as exc:  # JobSpecError: the one line naming the field
        raise click.UsageError(str(exc)) from None
    what = describe_target(kind, name)
    if not resumed:
        click.echo(
            f"No pause of {what} was in force"
            if name == "*"
            else f"{what.capitalize()} was not paused"
        )
        return
    # ``*`` ends the pause of every one, not the pauses of single ones.
    still = ", ".join(one.name for one in left if one.kind == kind and one.name != "*")
    click.echo(
        f"Resumed {what}" + (f" ({kind}s still paused on their own: {still})" if still else "")
    )


@click.command("pauses", context_settings=CONTEXT_SETTINGS)
@connection_option
@schema_option
@click.option("--json", "as_json", is_flag=True, help="Print the pauses as one JSON array.")
@click.pass_context
def pauses(ctx: click.Context, connection: str | None, schema: str, as_json: bool) -> None:
    """List the pauses in force."""
    from ..client.worker_utils import make_worker_utils

    connection, schema = shared(ctx, connection, schema)

    async def list_them() -> list[Pause]:
        async with make_worker_utils(connection, schema=schema) as utils:
            return await utils.list_pauses()

    found = run_async(list_them())
    if as_json:
        click.echo(json.dumps([_as_dict(one) for one in found]))
        return
    for one in found:
        click.echo(_describe(one))
    if not found:
        click.echo("Nothing is paused")


def _as_dict(pause: Pause) -> dict[str, Any]:
    """A pause for ``pauses --json`` (times in ISO 8601)."""
    return {
        "kind": pause.kind,
        "name": pause.name,
        "paused_at": pause.paused_at.isoformat(),
        "resume_at": pause.resume_at.isoformat() if pause.resume_at else None,
        "reason": pause.reason,
        "hold_queue_lock": pause.hold_queue_lock,
    }
