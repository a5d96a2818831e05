"""The admin commands: ``jobs`` (the list), ``retry``, ``reschedule``,
``fail``, ``remove``, ``cancel`` and ``migrate``: graphile-worker's admin
functions (and ``py_cancel_jobs``) from the command line, on jobs chosen by
id, by key, or by filter (task, named queue, state: the words every
command prints). A filter's matches are counted and confirmed first (``--yes``
skips the question), then acted on in batches (:mod:`.admin_jobs`). A job a
worker holds is never changed: it is skipped and reported (``cancel`` tells
it to stop instead). When nothing matched (no such id, key or match) an
action changes nothing and exits with code 1, saying so in one line.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

import click

from ..jobs.job_spec import SMALLINT_MAX, SMALLINT_MIN
from ..jobs.job_state import STATE_ALIASES
from ..jobs.last_error import storable
from ..sql import admin as admin_sql
from .admin_jobs import Filters, Matches, Outcome, format_jobs, format_outcome, jobs_json, session
from .common import CONTEXT_SETTINGS, connection_option, run_async, schema_option, shared
from .params import aware_datetime
from .params import job_id as job_id_param

__all__ = ["cancel", "fail", "jobs", "migrate", "remove", "reschedule", "retry"]

F = TypeVar("F", bound=Callable[..., Any])

#: ``jobs --limit``: the default, and the most.
DEFAULT_LIMIT = 100
MAX_LIMIT = 10_000
#: ``fail``'s reason when none is given.
DEFAULT_FAIL_REASON = "permanently failed from the command line"
#: ``reschedule --in``: the longest delay.
MAX_DELAY = timedelta(days=366)


def _ids(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[int, ...]:
    """Job ids (arguments, or a repeated ``--id``), each checked as ``job ID``."""
    return tuple(job_id_param(ctx, param, value) for value in values)


def _delay(_ctx: click.Context, _param: click.Parameter, value: str | None) -> timedelta | None:
    """``--in``: 90, 90s, 10m, 2h or 1d (above 0, at most 366 days)."""
    from ..jobs.pause_spec import parse_length

    if value is None:
        return None
    try:
        return parse_length(value, what="a delay", longest=MAX_DELAY)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _reason(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not value.strip():
        raise click.BadParameter("must not be empty (leave --reason out for the default)")
    return None if value is None else storable(value.strip())


_task = click.option("--task", metavar="IDENTIFIER", help="Only jobs of this task.")
_queue = click.option("--queue", metavar="NAME", help="Only jobs in this named queue.")


class StateChoice(click.Choice):  # type: ignore[type-arg]
    """A state word, as every command prints it; an earlier version's word
    (``available``, ``locked``, ``permanently_failed``) is taken as its
    new one."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            value = STATE_ALIASES.get(value.strip().lower(), value)
        return super().convert(value, param, ctx)


_state = click.option(
    "--state",
    type=StateChoice(list(admin_sql.STATES), case_sensitive=False),
    help="Only jobs in this state, as `job ID`, `jobs` and `status` name it (waiting: "
    "due, never attempted; retrying: failed before, will run again; paused: held by "
    "a pause). A finished job's state (succeeded, cancelled, removed, unknown) selects "
    "nothing here.",
)
_json = click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")


def _selection(verb: str) -> Callable[[F], F]:
    """The options choosing the jobs of an action: ids, ``--key``, or filters."""

    def decorate(function: F) -> F:
        for option in reversed(
            [
                connection_option,
                schema_option,
                click.argument("ids", metavar="[ID]...", nargs=-1, callback=_ids),
                click.option("--key", metavar="KEY", help=f"{verb} the job with this job_key."),
                _task,
                _queue,
                _state,
                click.option(
                    "-y",
                    "--yes",
                    is_flag=True,
                    help="Do not ask for confirmation (filters only; ids and --key never ask).",
                ),
                _json,
            ]
        ):
            function = option(function)
        return function

    return decorate


@click.command("jobs", context_settings=CONTEXT_SETTINGS)
@connection_option
@schema_option
@_task
@_queue
@_state
@click.option("--key", metavar="KEY", help="Only the job with this job_key.")
@click.option(
    "--id", "ids", metavar="ID", multiple=True, callback=_ids, help="Only this job (repeatable)."
)
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_LIMIT),
    default=DEFAULT_LIMIT,
    show_default=True,
    help=f"Show at most this many jobs (at most {MAX_LIMIT:,}).",
)
@_json
@click.pass_context
def jobs(
    ctx: click.Context,
    /,
    connection: str | None,
    schema: str,
    limit: int,
    as_json: bool,
    **chosen: Any,
) -> None:
    """List jobs, newest (highest id) first: id, task, queue, state, attempts,
    run_at and the first line of the last error; filters combine. Read-only."""
    connection, schema = shared(ctx, connection, schema)
    filters = Filters(**chosen)

    async def read() -> tuple[list[dict[str, Any]], int]:
        async with session(connection, schema) as db:
            return await db.list_jobs(filters, limit), (await db.matches(filters)).count

    found, total = run_async(read())
    more = max(0, total - len(found))
    if as_json:
        click.echo(jobs_json(found))
        if more:
            click.echo(f"{more:,} more match: raise --limit to see them", err=True)
        return
    if not found:
        click.echo(f"No job matches ({filters.describe()}).")
        return
    click.echo("\n".join(format_jobs(found)))
    shown = f"{len(found):,} of {total:,} matching jobs, newest first"
    click.echo(shown + (f"; {more:,} more (raise --limit)." if more else "."))


def _filters(ids: tuple[int, ...], key: str | None, chosen: dict[str, Any]) -> Filters | None:
    """The filters of an action, or None when it was given ids or ``--key``;
    refuses none of the three ways, and more than one."""
    ways = [bool(ids), key is not None, any(value is not None for value in chosen.values())]
    if sum(ways) != 1:
        raise click.UsageError(
            "give job ids, --key KEY, or filters (--task, --queue, --state): "
            + ("only one of these" if any(ways) else "refusing to act on every job")
        )
    return Filters(**chosen) if ways[2] else None


def _confirmed(question: str) -> bool:
    """The answer to ``question`` (on stderr, so --json output stays clean);
    no answer (stdin closed) is no. An answer read from a pipe is not echoed:
    the prompt's line is ended then."""
    try:
        return click.confirm(question, err=True)
    except click.Abort:
        return False
    finally:
        if not sys.stdin.isatty():
            click.echo(err=True)


def _nothing(what: str) -> click.ClickException:
    """Nothing matched: exit code 1, one line (ids, ``--key`` and filters alike)."""
    return click.ClickException(f"{what}: nothing was changed")


def _no_such_ids(ids: tuple[int, ...] | list[int]) -> str:
    listed = ", ".join(str(one) for one in ids)
    return f"no job has the id {listed}" if len(ids) == 1 else f"no job has any of the ids {listed}"


async def _act_on_ids(
    connection: str | None,
    schema: str,
    outcome: Outcome,
    ids: tuple[int, ...],
    key: str | None,
    params: dict[str, Any],
) -> None:
    """The action on ``ids``, or on the job with ``key`` (``remove``: by
    graphile-worker's remove_job); a key no job has is an error."""
    async with session(connection, schema) as db:
        if key is not None and outcome.action == "remove":
            if not await db.remove_by_key(outcome, key):
                raise _nothing(f"no job has the key {key!r}")
            return
        if key is not None:
            found = await db.job_id_by_key(key)
            if found is None:
                raise _nothing(f"no job has the key {key!r}")
            ids = (found,)
        await db.act(outcome, await db.action(outcome.action), ids, **params)


async def _matches(connection: str | None, schema: str, filters: Filters) -> Matches:
    async with session(connection, schema) as db:
        return await db.matches(filters)


async def _act_on_matches(
    connection: str | None,
    schema: str,
    outcome: Outcome,
    filters: Filters,
    upto: int,
    params: dict[str, Any],
) -> None:
    async with session(connection, schema) as db:
        await db.act_on_matches(outcome, await db.action(outcome.action), filters, upto, **params)


def _run_action(
    ctx: click.Context,
    action: str,
    chosen: dict[str, Any],
    text: tuple[str, str, str],
    held: str = "locked by a worker: skipped",
    **params: Any,
) -> None:
    """An action on the jobs ``chosen`` (the values of :func:`_selection`'s
    options): ids or a key at once; a filter's matches after their count and
    the confirmation, up to the highest id counted. ``text``: the verb
    (``Retry``), what was done (``Retried``), why a job was left as it was;
    ``held``: what becomes of the matches a worker holds (for the question).
    Prints the outcome; nothing matched (every id missing, no job with the
    key, no match) is an error, exit code 1."""
    connection, schema = shared(ctx, chosen.pop("connection"), chosen.pop("schema"))
    yes, as_json = chosen.pop("yes"), chosen.pop("as_json")
    ids, key = chosen.pop("ids"), chosen.pop("key")
    filters = _filters(ids, key, chosen)
    verb, done, unchanged = text
    outcome = Outcome(action)
    if filters is None:
        run_async(_act_on_ids(connection, schema, outcome, ids, key, params))
        found = outcome.changed + outcome.locked + outcome.unchanged + outcome.stopped
        if ids and not found:
            raise _nothing(_no_such_ids(outcome.missing))
    else:
        matches = run_async(_matches(connection, schema, filters))
        if not matches.count:
            raise _nothing(f"no job matches ({filters.describe()})")
        if not yes:
            also = f"; {matches.held:,} of them {held}" if matches.held else ""
            count = f"{matches.count:,} job" + (" matches" if matches.count == 1 else "s match")
            if not _confirmed(f"{count} ({filters.describe()}){also}. {verb} them?"):
                raise click.ClickException("not confirmed: nothing was changed")
        run_async(_act_on_matches(connection, schema, outcome, filters, matches.upto, params))
    if as_json:
        click.echo(outcome.as_json())
    else:
        click.echo("\n".join(format_outcome(outcome, done, unchanged)))


@click.command("retry", context_settings=CONTEXT_SETTINGS)
@_selection("Retry")
@click.pass_context
def retry(ctx: click.Context, /, **chosen: Any) -> None:
    """Make jobs runnable now: attempts reset to 0 (so a permanently failed job
    gets all its attempts again), run_at now for a job due later (a due job
    keeps its place); the last error is kept. Jobs by ID, by --key, or every
    job the filters match (counted and confirmed first)."""
    _run_action(ctx, "retry", chosen, ("Retry", "Retried", "unchanged meanwhile"))


@click.command("reschedule", context_settings=CONTEXT_SETTINGS)
@_selection("Reschedule")
@click.option(
    "--at",
    "run_at",
    metavar="DATETIME",
    callback=aware_datetime,
    help="New run_at, ISO 8601 with a time zone.",
)
@click.option(
    "--in",
    "delay",
    metavar="LENGTH",
    callback=_delay,
    help="New run_at: now plus this (90s, 10m, 2h, 1d; at most 366 days).",
)
@click.option(
    "--priority",
    type=click.IntRange(SMALLINT_MIN, SMALLINT_MAX),
    help="New priority (lower runs first).",
)
@click.option(
    "--attempts", type=click.IntRange(0, SMALLINT_MAX), help="New attempts so far (0: none)."
)
@click.option("--max-attempts", type=click.IntRange(1, SMALLINT_MAX), help="New max_attempts.")
@click.pass_context
def reschedule(
    ctx: click.Context,
    /,
    run_at: datetime | None,
    delay: timedelta | None,
    priority: int | None,
    attempts: int | None,
    max_attempts: int | None,
    **chosen: Any,
) -> None:
    """Change jobs' run_at, priority, attempts and/or max_attempts (those
    given; graphile-worker's reschedule_jobs). Jobs by ID, by --key, or every
    job the filters match (counted and confirmed first)."""
    if run_at is not None and delay is not None:
        raise click.UsageError("give --at or --in, not both")
    if all(value is None for value in (run_at, delay, priority, attempts, max_attempts)):
        raise click.UsageError(
            "give what to change: --at or --in, --priority, --attempts, --max-attempts"
        )
    _run_action(
        ctx,
        "reschedule",
        chosen,
        ("Reschedule", "Rescheduled", "unchanged meanwhile"),
        run_at=run_at,
        delay=delay,
        priority=priority,
        attempts=attempts,
        max_attempts=max_attempts,
    )


@click.command("fail", context_settings=CONTEXT_SETTINGS)
@_selection("Fail")
@click.option(
    "--reason",
    metavar="TEXT",
    callback=_reason,
    help=f"Why; the last error becomes 'TEXT (was: <last error>)'. Default: "
    f"{DEFAULT_FAIL_REASON!r}.",
)
@click.pass_context
def fail(ctx: click.Context, /, reason: str | None, **chosen: Any) -> None:
    """Fail jobs permanently (their attempts used up; kept, so `retry` can
    revive them), keeping the last real error after the reason. A job already
    failed for good is left as it is. Jobs by ID, by --key, or every job the
    filters match (counted and confirmed first)."""
    _run_action(
        ctx,
        "fail",
        chosen,
        ("Fail", "Permanently failed", "already permanently failed"),
        reason=reason or DEFAULT_FAIL_REASON,
    )


@click.command("remove", context_settings=CONTEXT_SETTINGS)
@_selection("Remove")
@click.pass_context
def remove(ctx: click.Context, /, **chosen: Any) -> None:
    """Delete jobs (graphile-worker's complete_jobs; by --key, its remove_job:
    a job a worker holds keeps running but loses its key and is not retried).
    Jobs by ID, by --key, or every job the filters match (counted and
    confirmed first)."""
    _run_action(ctx, "remove", chosen, ("Remove", "Removed", "gone meanwhile"))


@click.command("cancel", context_settings=CONTEXT_SETTINGS)
@_selection("Cancel")
@click.option("--reason", metavar="TEXT", help="Why: kept with the job's record.")
@click.pass_context
def cancel(ctx: click.Context, /, reason: str | None, **chosen: Any) -> None:
    """Cancel jobs (py_cancel_jobs): a waiting one never runs (recorded as
    cancelled); a running one is told to stop (recorded as cancelled when it
    ends, unless it succeeds). Jobs by ID, by --key, or every job the filters
    match (counted and confirmed first)."""
    from ..errors import JobSpecError
    from ..jobs.text_args import check_text

    try:  # a byte that is not UTF-8 arrives as a lone surrogate
        check_text(reason, "reason")
    except JobSpecError as exc:
        raise click.BadParameter(exc.reason, ctx, param_hint="'--reason'") from None
    _run_action(
        ctx,
        "cancel",
        chosen,
        ("Cancel", "Cancelled", "finished already"),
        held="running: told to stop",
        reason=reason,
    )


@click.command("migrate", context_settings=CONTEXT_SETTINGS)
@connection_option
@schema_option
@_json
@click.pass_context
def migrate(ctx: click.Context, connection: str | None, schema: str, as_json: bool) -> None:
    """Install or upgrade the schema, then exit (as `--schema-only`)."""
    from ..runner import run_migrations
    from .commands import migrate_only

    connection, schema = shared(ctx, connection, schema)
    if not as_json:
        migrate_only(connection, schema)
        return
    report = run_async(run_migrations(connection, schema=schema))
    click.echo(
        json.dumps(
            {
                "schema": schema,
                "previous_revision": report.previous_revision,
                "revision": report.revision,
                "applied": list(report.applied),
                "applied_py": list(report.applied_py),
            }
        )
    )
