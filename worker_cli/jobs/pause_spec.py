"""Pauses of a named queue or a task identifier, as the utilities take and
return them (``pause``, ``resume``, ``list_pauses``).

A pause is fleet-wide and lives in the database (migrations/py/000014.sql):
every Python pool's fetch leaves the paused jobs alone, a pool started
later does too, and a restart does not undo it. :func:`pause_params` checks a
call's arguments before any SQL. :func:`parse_length` reads a length as
people write it (``10m``) and :func:`describe_target` names what a pause
holds back: the command line and the dashboard share them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from ..errors import JobSpecError
from .text_args import check_text

__all__ = [
    "MAX_PAUSE",
    "Pause",
    "PauseKind",
    "describe_target",
    "parse_length",
    "pause_params",
    "target",
]

PauseKind = Literal["queue", "task"]

#: At most this long ahead (a pause meant for ever has no ``until``).
MAX_PAUSE = timedelta(days=366)

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_LENGTH = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhd]?)")


@dataclass(frozen=True)
class Pause:
    """One pause in force: of the named queue or the task identifier ``name``
    (``*``: every named queue, or every task)."""

    kind: PauseKind
    name: str
    paused_at: datetime
    #: When it ends by itself (None: when resumed).
    resume_at: datetime | None
    reason: str | None
    #: Node workers are kept off the queue too (its lock is held).
    hold_queue_lock: bool

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Pause:
        kind, name, paused_at, resume_at, reason, hold = row
        return cls(kind, name, paused_at, resume_at, reason, bool(hold))


def target(queue: str | None, task: str | None) -> tuple[PauseKind, str]:
    """The (kind, name) of ``pause``/``resume``'s ``queue=`` or ``task=``:
    exactly one must be given, a non-empty name of at most 128 characters."""
    if (queue is None) == (task is None):
        raise JobSpecError("queue", "give either queue= or task= (one of them)")
    kind: PauseKind = "queue" if queue is not None else "task"
    name = queue if queue is not None else task
    if not isinstance(name, str) or not 1 <= len(name) <= 128:
        raise JobSpecError(kind, f"is {name!r}; it must be a name of 1 to 128 characters")
    check_text(name, kind)
    return kind, name


def pause_params(
    queue: str | None,
    task: str | None,
    until: datetime | timedelta | float | None,
    reason: str | None,
    hold_queue_lock: bool,
) -> dict[str, Any]:
    """The checked parameters of ``pause``. ``until``: an aware datetime, or
    how long from now (a timedelta or seconds; counted on the database's
    clock)."""
    kind, name = target(queue, task)
    resume_at: datetime | None = None
    resume_in: timedelta | None = None
    if until is None:
        pass
    elif isinstance(until, datetime):
        if until.tzinfo is None or until.utcoffset() is None:
            raise JobSpecError("until", f"is {until!r}: give a time zone (an aware datetime)")
        resume_at = until
    elif isinstance(until, timedelta | int | float) and not isinstance(until, bool):
        length = until if isinstance(until, timedelta) else timedelta(seconds=until)
        if not timedelta(0) < length <= MAX_PAUSE:
            raise JobSpecError(
                "until", f"is {until!r}; a length must be above 0 and at most 366 days"
            )
        resume_in = length
    else:
        raise JobSpecError("until", f"is {until!r}; give a datetime, a timedelta, seconds, or None")
    check_text(reason, "reason")
    if not isinstance(hold_queue_lock, bool):
        raise JobSpecError("hold_queue_lock", f"is {hold_queue_lock!r}; it must be True or False")
    if hold_queue_lock and (kind != "queue" or name == "*"):
        raise JobSpecError(
            "hold_queue_lock",
            "holds one named queue's lock (Node workers take only unlocked queues); "
            "it cannot hold a task or '*'",
        )
    return {
        "kind": kind,
        "name": name,
        "resume_at": resume_at,
        "resume_in": resume_in,
        "reason": reason,
        "hold_queue_lock": hold_queue_lock,
    }


def parse_length(text: str, *, what: str = "a pause", longest: timedelta = MAX_PAUSE) -> timedelta:
    """A pause's length as people write it (``pause --for``, the dashboard's
    forms): 90, 90s, 10m, 2h or 1d (seconds, minutes, hours, days), above 0
    and at most 366 days (``longest``; ``what``: what lasts that long, for
    the message). ValueError saying what is wrong (the caller names its
    field)."""
    shown = repr(text if len(text) <= 40 else text[:40] + "…")
    match = _LENGTH.fullmatch(text.strip())
    if not match:
        raise ValueError(f"{shown} is not a length such as 90s, 10m, 2h or 1d")
    seconds = float(match[1]) * _UNITS[match[2] or "s"]
    if not 0 < seconds <= longest.total_seconds():
        days = longest.total_seconds() / 86400
        most = "a day" if days == 1 else f"{days:g} days"
        raise ValueError(f"{shown}: {what} lasts above 0 and at most {most}")
    return timedelta(seconds=seconds)


def describe_target(kind: str, name: str) -> str:
    """``queue mail``, ``task charge``; ``every named queue`` or ``every
    task`` for ``*``."""
    if name == "*":
        return "every named queue" if kind == "queue" else "every task"
    return f"{kind} {name}"
