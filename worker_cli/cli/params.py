"""What the command line accepts: click types and callbacks that turn a bad
value into one line naming the option and what it allows (exit code 2),
before anything reaches the worker or PostgreSQL."""

from __future__ import annotations

import math
from typing import Any

import click

from ..config.database import schema_name_problem

__all__ = [
    "MAX_PROGRESS_INTERVAL",
    "MAX_REFRESH",
    "MAX_WAIT",
    "Number",
    "aware_datetime",
    "job_id",
    "json_payload",
    "number",
    "schema_name",
]

#: Seconds between ``--once`` progress lines at most (an hour).
MAX_PROGRESS_INTERVAL = 3600
#: Seconds between the dashboard pages' refreshes at most (an hour; a browser
#: timer cannot wait beyond about 24.8 days, and fires at once instead).
MAX_REFRESH = 3600
#: Seconds ``job --wait`` waits at most (a year).
MAX_WAIT = 31_536_000


class Number(click.FloatRange):
    """A number in a range, never NaN (every comparison with NaN is false, so
    a plain FloatRange lets it through); give the range a finite ``max`` and
    infinity is refused as well."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        converted = super().convert(value, param, ctx)
        if isinstance(converted, float) and math.isnan(converted):
            self.fail(
                f"{value!r} is not a number in the range {self._describe_range()}.", param, ctx
            )
        return converted


def number(
    low: int | None, high: int | None, *, whole: bool = False, low_open: bool = False
) -> click.IntRange | click.FloatRange:
    """The click type of a whole number, or any number, from ``low`` to ``high``."""
    if whole:
        return click.IntRange(low, high, min_open=low_open)
    return Number(low, high, min_open=low_open)


def schema_name(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """``-s/--schema``: refuse what PostgreSQL would refuse or change (an empty
    name too: it would silently mean the default schema)."""
    if value is None:
        return None
    problem = schema_name_problem(value)
    if problem:
        raise click.BadParameter(problem)
    return value


def job_id(_ctx: click.Context, _param: click.Parameter, value: str) -> int:
    """A job id: a whole number from 1 to 2**63-1 (``bigint``)."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 0 < number < 1 << 63:
        raise click.BadParameter(f"{value!r} is not a job id (a whole number from 1 to 2**63-1)")
    return number


def job_ids(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[int]:
    """Job ids (see :func:`job_id`), at least one."""
    if not values:
        raise click.BadParameter("give at least one job id")
    return [job_id(ctx, param, value) for value in values]


def json_payload(_ctx: click.Context, _param: click.Parameter, value: str | None) -> Any:
    if value is None:
        return None
    import json

    try:
        return json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON ({exc}): {value!r}") from None
    except RecursionError:
        raise click.BadParameter("JSON nested too deeply to be read") from None


def aware_datetime(_ctx: click.Context, _param: click.Parameter, value: str | None) -> Any:
    """``--run-at``: ISO 8601 with a time zone, that a job read back in any time
    zone can have (:func:`~worker_cli.jobs.job_spec.check_run_at_range`)."""
    if value is None:
        return None
    from datetime import datetime

    from ..errors import JobSpecError
    from ..jobs.job_spec import check_run_at_range

    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"not an ISO 8601 date and time (years 1 to 9999): {value!r}"
        ) from None
    if moment.tzinfo is None:
        raise click.BadParameter(
            f"{value!r} has no time zone; add one, e.g. {value}+00:00 or {value}Z"
        )
    try:
        check_run_at_range(moment)
    except JobSpecError as exc:
        raise click.BadParameter(exc.reason) from None
    return moment
