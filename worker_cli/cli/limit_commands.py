"""The commands about limits: ``limit`` (set or remove one) and ``limits`` (the list)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import click

from .common import CONTEXT_SETTINGS, connection_option, run_async, schema_option, shared

if TYPE_CHECKING:
    from ..jobs.limit_spec import Limit, LimitInfo

__all__ = ["limit", "limits"]


def window(_ctx: click.Context, _param: click.Parameter, value: str | None) -> timedelta | None:
    """``--per``: a window such as 1s, 10s, 1m or 1h (above 0, at most a day)."""
    from ..jobs.limit_spec import MAX_PERIOD
    from ..jobs.pause_spec import parse_length

    if value is None:
        return None
    try:
        return parse_length(value, what="a window", longest=MAX_PERIOD)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _describe(info: LimitInfo) -> str:
    limit = info.limit
    parts = []
    if limit.max_running is not None:
        parts.append(f"at most {limit.max_running} running ({info.running} now)")
    if limit.max_starts is not None and limit.period is not None:
        per = f"{limit.period.total_seconds():g}s"
        parts.append(
            f"at most {limit.max_starts} starts per {per} ({info.recent_starts} in the last {per})"
        )
    line = f"{info.kind} {info.name}: " + ", ".join(parts)
    if limit.partition_by is not None:
        line += f", per value of payload field {limit.partition_by!r}"
        line += f" ({info.partitions} seen)"
    return line


@click.command("limit", context_settings=CONTEXT_SETTINGS)
@connection_option
@schema_option
@click.option("--queue", metavar="NAME", help="A named queue.")
@click.option("--task", metavar="IDENTIFIER", help="A task identifier.")
@click.option("--operation", metavar="NAME", help="An operation (helpers.limit(NAME)).")
@click.option("--max-running", type=click.IntRange(1, 10_000), help="At most N running at once.")
@click.option("--max-starts", type=click.IntRange(1, 10_000), help="At most N starts per --per.")
@click.option(
    "--per", metavar="LENGTH", callback=window, help="The window: 1s, 10s, 1m, 1h (at most 1d)."
)
@click.option("--partition-by", metavar="FIELD", help="Each value of this payload field apart.")
@click.option("--remove", is_flag=True, help="Remove the limit instead.")
@click.pass_context
def limit(
    ctx: click.Context,
    connection: str | None,
    schema: str,
    queue: str | None,
    task: str | None,
    operation: str | None,
    max_running: int | None,
    max_starts: int | None,
    per: timedelta | None,
    partition_by: str | None,
    remove: bool,
) -> None:
    """Set (or --remove) the limit of a task, a named queue or an operation,
    across every Python worker, at once: at most N running, at most N starts
    in any window of --per."""
    from ..client.worker_utils import make_worker_utils
    from ..errors import JobSpecError
    from ..jobs.limit_spec import Limit

    targets = {"queue": queue, "task": task, "operation": operation}
    if sum(value is not None for value in targets.values()) != 1:
        raise click.UsageError("give one of --queue NAME, --task IDENTIFIER, --operation NAME")
    given = (max_running, max_starts, per, partition_by)
    if remove and any(value is not None for value in given):
        raise click.UsageError("--remove takes no other limit option")
    try:
        spec: Limit | None = None if remove else Limit(max_running, max_starts, per, partition_by)
    except JobSpecError as exc:
        raise click.UsageError(f"--{exc.field.replace('_', '-')}: {exc.reason}") from None
    connection, schema = shared(ctx, connection, schema)

    async def change() -> tuple[LimitInfo | bool, bool]:
        from ..worker.declared_limits import recorded_declaration

        async with make_worker_utils(connection, schema=schema) as utils:
            if spec is None:
                done: LimitInfo | bool = await utils.remove_limit(**targets)
            else:
                done = await utils.set_limit(spec, **targets)
            declared = task is not None and await recorded_declaration(utils, task) is not None
            return done, declared

    try:
        done, declared = run_async(change())
    except JobSpecError as exc:
        raise click.UsageError(str(exc)) from None
    what = next(f"{kind} {name}" for kind, name in targets.items() if name is not None)
    if isinstance(done, bool):
        click.echo(f"Removed the limit of {what}" if done else f"{what.capitalize()} had no limit")
    else:
        click.echo("Limited " + _describe(done))
    if declared and done is not False:
        # A worker applies the task's declaration again only when it changes.
        change_word = "removal" if isinstance(done, bool) else "limit"
        click.echo(
            f"Warning: task {task} declares a limit (@task_options(limit=...)); this "
            f"{change_word} stands until that declaration changes in the code, when the next "
            "worker start that loads it applies the new one",
            err=True,
        )


@click.command("limits", context_settings=CONTEXT_SETTINGS)
@connection_option
@schema_option
@click.option("--json", "as_json", is_flag=True, help="Print the limits as one JSON array.")
@click.pass_context
def limits(ctx: click.Context, connection: str | None, schema: str, as_json: bool) -> None:
    """List the limits, with how much of each is in use."""
    from ..client.worker_utils import make_worker_utils

    connection, schema = shared(ctx, connection, schema)

    async def list_them() -> list[LimitInfo]:
        async with make_worker_utils(connection, schema=schema) as utils:
            return await utils.list_limits()

    found = run_async(list_them())
    if as_json:
        click.echo(json.dumps([_as_dict(info) for info in found]))
        return
    for info in found:
        click.echo(_describe(info))
    if not found:
        click.echo("Nothing is limited")


def _as_dict(info: LimitInfo) -> dict[str, Any]:
    """A limit and its use for ``limits --json`` (the window in seconds)."""
    per = info.limit.per
    seconds = per.total_seconds() if isinstance(per, timedelta) else per
    return {
        "kind": info.kind,
        "name": info.name,
        "max_running": info.limit.max_running,
        "max_starts": info.limit.max_starts,
        "per_seconds": seconds,
        "partition_by": info.limit.partition_by,
        "updated_at": info.updated_at.isoformat(),
        "running": info.running,
        "recent_starts": info.recent_starts,
        "partitions": info.partitions,
    }
