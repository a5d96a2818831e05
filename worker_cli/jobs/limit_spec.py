"""Concurrency and rate limits across every Python worker, as the utilities
and ``@task_options(limit=...)`` take them and the utilities return them.

A limit applies to a task identifier or a named queue, optionally per value
of a payload field, and lives in the database (migrations/py/000015.sql):
the fetch enforces it for every Python pool at once. :class:`Limit` is what
a limit says; :class:`LimitInfo` is a stored one with how much of it is in
use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from ..errors import JobSpecError

__all__ = ["Limit", "LimitInfo", "LimitKind", "limit_params", "limit_target"]

#: What a limit applies to: a task's jobs, a named queue's jobs, or an
#: operation that tasks do in their body (``helpers.limit``).
LimitKind = Literal["queue", "task", "operation"]

#: The bounds the database holds too (migrations/py/000015.sql).
MAX_RUNNING = 10_000
MAX_STARTS = 10_000
MAX_PERIOD = timedelta(days=1)


@dataclass(frozen=True, slots=True)
class Limit:
    """At most ``max_running`` jobs running at once and at most ``max_starts``
    job starts in any window of ``per`` (a timedelta, or seconds), across
    every Python worker; each value of the payload field ``partition_by``
    (e.g. ``"account_id"``) counted on its own. Give ``max_running``,
    ``max_starts`` with ``per``, or both."""

    max_running: int | None = None
    max_starts: int | None = None
    per: timedelta | float | None = None
    partition_by: str | None = None

    def __post_init__(self) -> None:
        _whole("max_running", self.max_running, MAX_RUNNING)
        _whole("max_starts", self.max_starts, MAX_STARTS)
        if self.max_running is None and self.max_starts is None:
            raise JobSpecError("max_running", "give max_running, max_starts (with per), or both")
        if (self.max_starts is None) != (self.per is None):
            raise JobSpecError("per", "max_starts and per go together (N starts per period)")
        if self.per is not None:
            per = self.per
            if isinstance(per, bool) or not isinstance(per, timedelta | int | float):
                raise JobSpecError("per", f"is {per!r}; give a timedelta or seconds")
            length = per if isinstance(per, timedelta) else timedelta(seconds=per)
            if not timedelta(0) < length <= MAX_PERIOD:
                raise JobSpecError("per", f"is {length}; it must be above 0 and at most a day")
            object.__setattr__(self, "per", length)
        field = self.partition_by
        if field is not None and (not isinstance(field, str) or not 1 <= len(field) <= 128):
            raise JobSpecError(
                "partition_by", f"is {field!r}; give a payload field name of 1 to 128 characters"
            )

    @property
    def period(self) -> timedelta | None:
        """``per`` as a timedelta."""
        return self.per if isinstance(self.per, timedelta) else None


def _whole(name: str, value: Any, high: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise JobSpecError(name, f"is {value!r}; it must be a whole number from 1 to {high:,}")


@dataclass(frozen=True, slots=True)
class LimitInfo:
    """A stored limit, and how much of it is in use now."""

    kind: LimitKind
    name: str
    limit: Limit
    updated_at: datetime
    #: Jobs it let start that are still running (all partitions).
    running: int
    #: Starts in the current window of ``limit.per`` (all partitions).
    recent_starts: int
    #: Partition values seen (1 without ``partition_by``, once used).
    partitions: int

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> LimitInfo:
        kind, name, max_running, max_starts, period, partition_by, updated_at = row[:7]
        running, recent, partitions = row[7:]
        limit = Limit(max_running, max_starts, period, partition_by)
        return cls(kind, name, limit, updated_at, running, recent, partitions)


def limit_target(
    queue: str | None, task: str | None, operation: str | None
) -> tuple[LimitKind, str]:
    """The (kind, name) of ``set_limit``/``remove_limit``'s ``queue=``,
    ``task=`` or ``operation=``: exactly one, a name of 1 to 128 characters."""
    kinds: tuple[LimitKind, ...] = ("queue", "task", "operation")
    given = [
        (kind, name)
        for kind, name in zip(kinds, (queue, task, operation), strict=True)
        if name is not None
    ]
    if len(given) != 1:
        raise JobSpecError("queue", "give one of queue=, task= or operation=")
    [(kind, name)] = given
    if not isinstance(name, str) or not 1 <= len(name) <= 128:
        raise JobSpecError(kind, f"is {name!r}; it must be a name of 1 to 128 characters")
    if name == "*":
        raise JobSpecError(kind, "a limit names one task, queue or operation, not '*'")
    return kind, name


def limit_params(
    limit: Limit, queue: str | None, task: str | None, operation: str | None
) -> dict[str, Any]:
    """The checked parameters of ``set_limit``."""
    kind, name = limit_target(queue, task, operation)
    if kind == "operation" and limit.partition_by is not None:
        raise JobSpecError(
            "partition_by", "an operation's partition is given to helpers.limit(name, partition)"
        )
    if not isinstance(limit, Limit):
        raise JobSpecError("limit", f"is {limit!r}; give a Limit(...)")
    return {
        "kind": kind,
        "name": name,
        "max_running": limit.max_running,
        "max_starts": limit.max_starts,
        "period": limit.period,
        "partition_by": limit.partition_by,
    }
