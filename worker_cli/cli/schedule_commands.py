"""The commands about schedules in the database (``_private_py_schedules``):
``schedules`` (the list, ``--json`` too) and ``schedule add``, ``remove``,
``pause`` and ``resume``, through the utilities (``add_schedule`` and the
others). Each change prints one line saying what happened; bad input is one
line naming the field (exit code 1), nothing written; an identifier no
schedule has is one line (exit code 1).

A schedule's next run is the scheduler's own instant: the crontab code's item
(:func:`~worker_cli.jobs.schedule.schedule_item`) and its instants
(:func:`~worker_cli.jobs.cron_zones.fire_instants`, daylight saving as the
scheduler applies it), as the dashboard's Crontab page computes them."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

import click
from click.core import ParameterSource

from .common import CONTEXT_SETTINGS, connection_option, run_async, schema_option

if TYPE_CHECKING:
    from ..jobs.schedule import Schedule

__all__ = ["next_run", "schedule", "schedules"]

#: How far ahead a next run is looked for (a 29 February schedule waits up to
#: eight years around 2100), as the dashboard's Crontab page.
HORIZON = timedelta(days=366 * 9)
#: The largest file ``@PATH`` reads as a payload (a schedule's payload is at
#: most 64 KiB of compact JSON; this leaves room for indentation).
PAYLOAD_FILE_MAX = 16 << 20
UTC_ZONE = ZoneInfo("UTC")


def _shared(ctx: click.Context, connection: str | None, schema: str) -> tuple[str | None, str]:
    """A subcommand's connection and schema (as ``common.shared``): its own,
    unless an option was only given on the command line before it, to
    ``graphile-worker`` (``graphile-worker -c URL schedule add ...``)."""
    root = ctx.find_root()

    def value(name: str, own: Any) -> Any:
        if (
            ctx.get_parameter_source(name) is not ParameterSource.COMMANDLINE
            and root.get_parameter_source(name) is ParameterSource.COMMANDLINE
        ):
            return root.params[name]
        return own

    return value("connection", connection), value("schema", schema)


def next_run(schedule: Schedule, now: datetime) -> datetime | None:
    """The first instant at or after ``now`` a worker fires ``schedule`` at
    (UTC): None when it is paused, or never fires. A schedule without a zone
    runs in UTC, whatever the workers' ``--cron-timezone`` (the worker asks
    ``item.matches`` of each UTC minute: the instants of UTC's timetable).
    Raises CrontabError when what is stored no longer parses (a zone gone
    from the zone database)."""
    from ..jobs.cron_zones import fire_instants
    from ..jobs.schedule import schedule_item

    if schedule.paused:
        return None
    item = schedule_item(schedule)
    start = max(now, schedule.known_since)
    if schedule.last_execution is not None:  # an instant never fires twice
        start = max(start, schedule.last_execution + timedelta(seconds=1))
    return next(fire_instants(item, item.tz or UTC_ZONE, start, start + HORIZON), None)


def _next_run(schedule: Schedule) -> tuple[datetime | None, str]:
    """The next run, and how the commands show it (UTC, to the minute)."""
    from ..jobs.crontab import CrontabError

    if schedule.paused:
        return None, "paused"
    try:
        when = next_run(schedule, datetime.now(UTC))
    except (CrontabError, ValueError, TypeError) as exc:  # a zone gone from the database
        return None, f"unknown ({exc})"
    return when, "never" if when is None else _minute(when)


def _minute(instant: datetime) -> str:
    return instant.astimezone(UTC).strftime("%Y-%m-%d %H:%M")


def _summary(schedule: Schedule) -> str:
    """``nightly (0 3 * * * in Europe/Paris, task report)``."""
    zone = f" in {schedule.tz}" if schedule.tz else ""
    return f"{schedule.identifier} ({schedule.pattern}{zone}, task {schedule.task_identifier})"


def _when(schedule: Schedule) -> str:
    """What follows a schedule's summary: its next run, or that it is paused."""
    if schedule.paused:
        resume = f"graphile-worker schedule resume {schedule.identifier}"
        return f", paused: it adds no job until `{resume}`"
    when, shown = _next_run(schedule)
    return f": next run {shown} UTC" if when is not None else f": next run {shown}"


def _refused(exc: ValueError) -> click.ClickException:
    """Bad input (a JobSpecError: ``field: reason``): one line, exit code 1."""
    return click.ClickException(str(exc))


def _payload(text: str | None) -> Any:
    """PAYLOAD_JSON: a JSON document, or ``@PATH`` (``@-``: stdin) to read it
    from a file; a JobSpecError naming ``payload`` when it cannot be read."""
    from ..errors import JobSpecError
    from ..jobs.schedule import PAYLOAD_MAX

    if text is None:
        return None
    if text.startswith("@"):
        path = text[1:]
        try:
            if path == "-":
                raw = sys.stdin.buffer.read(PAYLOAD_FILE_MAX + 1)
            else:
                with Path(path).open("rb") as file:
                    raw = file.read(PAYLOAD_FILE_MAX + 1)
        except OSError as exc:
            raise JobSpecError("payload", f"cannot read {path!r}: {exc.strerror}") from None
        if len(raw) > PAYLOAD_FILE_MAX:
            raise JobSpecError(
                "payload",
                f"{path!r} is over {PAYLOAD_FILE_MAX:,} bytes; a schedule's payload is at most "
                f"{PAYLOAD_MAX:,} bytes of JSON",
            )
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            raise JobSpecError("payload", f"{path!r} is not UTF-8 text") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise JobSpecError("payload", f"not JSON ({exc})") from None
    except RecursionError:
        raise JobSpecError("payload", "JSON nested too deeply to be read") from None


@click.command("schedules", context_settings=CONTEXT_SETTINGS)
@connection_option
@schema_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the schedules as one JSON array (each with its next_run).",
)
@click.pass_context
def schedules(
    ctx: click.Context,
    connection: str | None,
    schema: str,
    as_json: bool,
) -> None:
    """List the schedules in the database, by identifier: pattern, zone,
    task, paused, next run (UTC), last run and its lag (how long after its
    instant the job was added)."""
    from ..client.worker_utils import make_worker_utils

    connection, schema = _shared(ctx, connection, schema)

    async def list_them() -> list[Schedule]:
        async with make_worker_utils(connection, schema=schema) as utils:
            return await utils.list_schedules()

    found = run_async(list_them())
    if as_json:
        documents = []
        for one in found:
            when, _shown = _next_run(one)
            documents.append({**one.as_dict(), "next_run": when.isoformat() if when else None})
        click.echo(json.dumps(documents))
        return
    if not found:
        click.echo("No schedules.")
        return
    header = ("IDENTIFIER", "PATTERN", "TZ", "TASK", "PAUSED", "NEXT RUN (UTC)", "LAST RUN (UTC)")
    table: list[tuple[str, ...]] = [(*header, "LAG")]
    for one in found:
        table.append(
            (
                one.identifier,
                one.pattern,
                one.tz or "UTC",
                one.task_identifier,
                "yes" if one.paused else "no",
                _next_run(one)[1],
                "-" if one.last_execution is None else _minute(one.last_execution),
                "-" if one.lag is None else f"{one.lag:.1f}s",
            )
        )
    click.echo(_table(table))


@click.group("schedule", context_settings=CONTEXT_SETTINGS)
@click.pass_context
def schedule(ctx: click.Context) -> None:
    """Add, replace, remove, pause or resume a schedule in the database:
    every Python worker fires it as a crontab line, within a second or two,
    without a restart (see `schedules` for the list)."""
    group = ctx.command
    if ctx.default_map and isinstance(group, click.Group):
        # The config file's connection and schema (given to this group by
        # graphile-worker's -C) reach its subcommands.
        ctx.default_map = {name: dict(ctx.default_map) for name in group.commands}


@schedule.command("add", context_settings=CONTEXT_SETTINGS)
@connection_option
@schema_option
@click.argument("identifier")
@click.argument("pattern")
@click.argument("task")
@click.argument("payload", metavar="[PAYLOAD_JSON]", required=False)
@click.option("--tz", metavar="ZONE", help="The IANA zone of the pattern (Europe/Paris).")
@click.option(
    "--fill",
    metavar="PERIOD",
    help="Backfill period (crontab's ?fill=): a worker starting after a gap adds the missed "
    "runs of this period, e.g. 2d, 1h30m. Default: none.",
)
@click.option("--queue", "queue_name", metavar="NAME", help="Named queue of its jobs.")
@click.option(
    "--priority", type=int, help="Priority of its jobs, -32768 to 32767 (lower runs first)."
)
@click.option("--max-attempts", type=int, help="Max attempts of its jobs, 1 to 32767.")
@click.option("--job-key", metavar="KEY", help="Job key of its jobs (replace mode).")
@click.option("--paused", is_flag=True, help="Add it paused: no job until `schedule resume`.")
@click.pass_context
def add(
    ctx: click.Context,
    connection: str | None,
    schema: str,
    identifier: str,
    pattern: str,
    task: str,
    payload: str | None,
    tz: str | None,
    fill: str | None,
    queue_name: str | None,
    priority: int | None,
    max_attempts: int | None,
    job_key: str | None,
    paused: bool,
) -> None:
    """Add schedule IDENTIFIER, or replace the one of that identifier:
    PATTERN is a crontab line's five time fields ("0 3 * * *", quoted), TASK
    the task of its jobs, PAYLOAD_JSON a JSON object (default {}; @PATH reads
    it from a file, @- from stdin) each job gets, with _cron added. An
    identifier a crontab item uses, a pattern that never fires, an unknown
    zone, a payload over 64 KiB... is refused with one line naming the field
    (exit code 1), nothing written."""
    from ..client.worker_utils import make_worker_utils
    from ..jobs.text_args import check_text

    connection, schema = _shared(ctx, connection, schema)
    try:
        for value, field in ((task, "task_identifier"), (queue_name, "queue_name"),
                             (job_key, "job_key"), (tz, "tz"), (fill, "fill")):  # fmt: skip
            check_text(value, field)
        document = _payload(payload)
    except ValueError as exc:
        raise _refused(exc) from None

    async def add_it() -> Schedule:
        async with make_worker_utils(connection, schema=schema) as utils:
            return await utils.add_schedule(
                identifier,
                pattern,
                task,
                document,
                tz=tz,
                fill=fill,
                queue_name=queue_name,
                priority=priority,
                max_attempts=max_attempts,
                job_key=job_key,
                paused=paused,
            )

    try:
        saved = run_async(add_it())
    except ValueError as exc:  # JobSpecError: the one line naming the field
        raise _refused(exc) from None
    done = "Replaced" if saved.version > 1 else "Added"  # a replace counts a version
    click.echo(f"{done} schedule {_summary(saved)}{_when(saved)}")


def _unknown(identifier: str) -> click.ClickException:
    return click.ClickException(
        f"no schedule has the identifier {identifier!r}: nothing was changed"
    )


@schedule.command("remove", context_settings=CONTEXT_SETTINGS)
@connection_option
@schema_option
@click.argument("identifier")
@click.pass_context
def remove(ctx: click.Context, connection: str | None, schema: str, identifier: str) -> None:
    """Remove schedule IDENTIFIER: it adds no more jobs (those it added stay)."""
    from ..client.worker_utils import make_worker_utils

    connection, schema = _shared(ctx, connection, schema)

    async def remove_it() -> bool:
        async with make_worker_utils(connection, schema=schema) as utils:
            return await utils.remove_schedule(identifier)

    try:
        removed = run_async(remove_it())
    except ValueError as exc:
        raise _refused(exc) from None
    if not removed:
        raise _unknown(identifier)
    click.echo(f"Removed schedule {identifier} (the jobs it added stay)")


def _set_paused(
    ctx: click.Context, connection: str | None, schema: str, identifier: str, paused: bool
) -> tuple[Schedule, bool]:
    """Pause or resume schedule ``identifier``: the schedule, and whether it
    was paused before."""
    from ..client.worker_utils import make_worker_utils

    connection, schema = _shared(ctx, connection, schema)

    async def change() -> tuple[Schedule | None, bool]:
        async with make_worker_utils(connection, schema=schema) as utils:
            before = await utils.get_schedule(identifier)
            if before is None:
                return None, False
            if paused:
                return await utils.pause_schedule(identifier), before.paused
            return await utils.resume_schedule(identifier), before.paused

    try:
        changed, was_paused = run_async(change())
    except ValueError as exc:
        raise _refused(exc) from None
    if changed is None:
        raise _unknown(identifier)
    return changed, was_paused


@schedule.command("pause", context_settings=CONTEXT_SETTINGS)
@connection_option
@schema_option
@click.argument("identifier")
@click.pass_context
def pause(ctx: click.Context, connection: str | None, schema: str, identifier: str) -> None:
    """Pause schedule IDENTIFIER: it adds no job until `schedule resume`
    (the paused time is never backfilled)."""
    changed, was_paused = _set_paused(ctx, connection, schema, identifier, True)
    if was_paused:
        click.echo(f"Schedule {_summary(changed)} was paused already")
    else:
        click.echo(f"Paused schedule {_summary(changed)}: it adds no job until resumed")


@schedule.command("resume", context_settings=CONTEXT_SETTINGS)
@connection_option
@schema_option
@click.argument("identifier")
@click.pass_context
def resume(
    ctx: click.Context,
    connection: str | None,
    schema: str,
    identifier: str,
) -> None:
    """Resume schedule IDENTIFIER from now on (the instants it missed while
    paused are not backfilled)."""
    changed, was_paused = _set_paused(ctx, connection, schema, identifier, False)
    if was_paused:
        click.echo(f"Resumed schedule {_summary(changed)}{_when(changed)}")
    else:
        click.echo(f"Schedule {_summary(changed)} was not paused{_when(changed)}")


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )
