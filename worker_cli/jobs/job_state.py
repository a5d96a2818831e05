"""A job's state and result, as any process can read them.

One state model for every job id (the SQL function ``py_job_status`` decides
it; see migrations/py/functions.sql), the words every command prints:
``running``, ``failed`` (no attempts left), ``paused`` (held by a pause:
``paused_by`` says which), ``retrying``, ``scheduled``, ``waiting`` (due now,
never attempted), ``succeeded``, ``cancelled``, ``removed`` (by an operator:
``graphile-worker remove``, the dashboard's delete, ``remove_job``), and
``unknown`` (no row anywhere: finished by a Node worker, removed by Node's
functions, pruned from the history, or never added). :class:`JobResult` is
the record the utilities return (``get_job_result``, ``wait_for_job``), and
:class:`AttemptError` each failed attempt a Python worker kept (``get_job_errors``);
:func:`encode_result` is how a task's return value becomes its stored result.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, get_args

from ..errors import GraphileWorkerError, JobSpecError
from .last_error import describe

__all__ = [
    "FINAL_STATES",
    "JOB_RESULT_COLUMNS",
    "STATE_ALIASES",
    "AttemptError",
    "JobLog",
    "JobProgress",
    "JobResult",
    "JobState",
    "ResultUnavailable",
    "check_job_id",
    "encode_result",
]

JobState = Literal[
    "running",
    "failed",
    "paused",
    "retrying",
    "scheduled",
    "waiting",
    "succeeded",
    "cancelled",
    "removed",
    "unknown",
]
#: States a job does not leave by itself: waiting for the job ends there.
#: (``failed`` is final until someone revives it with ``reschedule_jobs``.)
FINAL_STATES: frozenset[str] = frozenset({"failed", "succeeded", "cancelled", "removed", "unknown"})
STATES: tuple[str, ...] = get_args(JobState)

#: The columns of ``py_job_status``, in its order.
JOB_RESULT_COLUMNS = (
    "state",
    "id",
    "task_identifier",
    "queue_name",
    "key",
    "attempts",
    "max_attempts",
    "last_error",
    "result",
    "result_error",
    "created_at",
    "run_at",
    "started_at",
    "finished_at",
    "locked_by",
    "cancel_requested_at",
    "cancel_reason",
    "timed_out",
    "paused_by",
)

#: Words of earlier versions, still accepted wherever a state is given (never
#: printed): ``available`` (now ``waiting``), ``locked`` (``running``),
#: ``permanently_failed`` (``failed``).
STATE_ALIASES: dict[str, str] = {
    "available": "waiting",
    "locked": "running",
    "permanently_failed": "failed",
}


class ResultUnavailable(GraphileWorkerError):
    """The job has no result to give: it has not succeeded (yet), or its
    result was not kept (too large, not JSON); the message says which."""


@dataclass(frozen=True)
class JobProgress:
    """How far a job has got, as its task last reported it
    (``helpers.progress``): ``done`` of ``total``, or a fraction from 0 to 1
    when ``total`` is None; kept across retries and once it has finished."""

    done: float
    total: float | None
    message: str | None
    updated_at: datetime

    @property
    def fraction(self) -> float:
        """From 0 to 1 (``done / total``, at most 1; 0 for a total of 0)."""
        if self.total is None:
            return min(1.0, self.done)
        return min(1.0, self.done / self.total) if self.total > 0 else 0.0

    def __str__(self) -> str:
        if self.total is None:
            shown = f"{self.fraction:.0%}"
        else:
            shown = f"{self.done:g}/{self.total:g} ({self.fraction:.0%})"
        return shown if self.message is None else f"{shown} {self.message}"

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``updated_at`` in ISO 8601)."""
        return {
            "done": self.done,
            "total": self.total,
            "message": self.message,
            "fraction": self.fraction,
            "updated_at": self.updated_at.isoformat(),
        }


@dataclass(frozen=True)
class JobLog:
    """The lines a task logged through ``helpers.logger`` during one attempt
    (``get_job_logs``; ``--job-logs``), kept 7 days."""

    attempt: int | None
    #: ``failed``, ``succeeded`` or ``cancelled``.
    outcome: str
    logged_at: datetime
    #: The lines, oldest first (the first says how many were dropped, if any).
    lines: list[str]
    #: Lines dropped to keep within the cap (the oldest).
    dropped: int

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> JobLog:
        attempt, outcome, logged_at, text, dropped = row
        return cls(attempt, outcome, logged_at, text.split("\n") if text else [], dropped)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``logged_at`` in ISO 8601)."""
        return {
            "attempt": self.attempt,
            "outcome": self.outcome,
            "logged_at": self.logged_at.isoformat(),
            "lines": self.lines,
            "dropped": self.dropped,
        }


@dataclass(frozen=True)
class JobResult:
    """What is known of a job: its state, and once it has succeeded, its result.

    ``result`` raises :class:`ResultUnavailable` unless the job succeeded and
    its result was kept (``result_error`` says why one was not). The times
    are those of its last attempt: ``started_at`` when it was locked,
    ``finished_at`` when its outcome was recorded (finished jobs only).
    """

    id: int
    state: JobState
    task_identifier: str | None = None
    queue_name: str | None = None
    key: str | None = None
    attempts: int | None = None
    max_attempts: int | None = None
    last_error: str | None = None
    result_error: str | None = None
    created_at: datetime | None = None
    run_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    #: The worker pool running it (``running`` only).
    locked_by: str | None = None
    cancel_requested_at: datetime | None = None
    cancel_reason: str | None = None
    timed_out: bool = False
    #: The pause holding it (``paused`` only): ``queue mail``, ``task
    #: send_email``, ``every queue`` or ``every task``.
    paused_by: str | None = None
    #: How far it has got (``helpers.progress``; None: it reported nothing).
    progress: JobProgress | None = None
    _result: Any = field(default=None, repr=False)

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> JobResult:
        """From a row of ``py_job_status`` (:data:`JOB_RESULT_COLUMNS`),
        optionally followed by its progress's four columns."""
        count = len(JOB_RESULT_COLUMNS)
        values = dict(zip(JOB_RESULT_COLUMNS, row[:count], strict=True))
        result = values.pop("result")
        extra = row[count:]
        progress = None
        if len(extra) == 4 and extra[0] is not None:
            progress = JobProgress(*extra)
        return cls(**values, progress=progress, _result=result)

    @property
    def finished(self) -> bool:
        """The job is in a state it does not leave by itself (:data:`FINAL_STATES`)."""
        return self.state in FINAL_STATES

    @property
    def result(self) -> Any:
        """What the task returned (a JSON value); see the class's docstring."""
        if self.state != "succeeded":
            raise ResultUnavailable(f"job {self.id} has no result: it is {self.state}")
        if self.result_error is not None:
            raise ResultUnavailable(
                f"job {self.id} succeeded, but its result was not kept: {self.result_error}"
            )
        return self._result

    def as_dict(self) -> dict[str, Any]:
        """The record as a JSON-ready dict (times in ISO 8601; ``result`` only
        when there is one)."""
        out: dict[str, Any] = {}
        for name in JOB_RESULT_COLUMNS:
            if name == "result":
                if self.state == "succeeded" and self.result_error is None:
                    out["result"] = self._result
                continue
            value = getattr(self, name)
            out[name] = value.isoformat() if isinstance(value, datetime) else value
        out["progress"] = None if self.progress is None else self.progress.as_dict()
        return out


@dataclass(frozen=True)
class AttemptError:
    """One failed attempt of a job, as the Python worker that ran it recorded
    it (``get_job_errors``; migrations/py/000018.sql, kept 7 days)."""

    #: The attempt's number (the job's ``attempts`` when it failed).
    attempt: int | None
    failed_at: datetime
    error: str | None
    #: The job was to run again (attempts left); false for its last attempt,
    #: a failure its retry policy does not retry, or a cancel.
    retried: bool
    task_identifier: str | None
    #: The worker pool that ran the attempt.
    pool_id: str | None
    #: The error's traceback (its last 8,000 characters at most: the
    #: innermost frames and the exception); None when the worker kept none
    #: (versions before, a pool declared dead).
    traceback: str | None = None
    #: Not a failed attempt but an operator's retry at ``failed_at``, which
    #: reset the job's attempts (the numbers after it start again at 1): how
    #: (``cli``, ``dashboard``, ``api``). None for a failed attempt.
    retried_by: str | None = None

    @property
    def operator_retry(self) -> bool:
        """This entry marks an operator's retry (see ``retried_by``)."""
        return self.retried_by is not None

    def as_dict(self) -> dict[str, Any]:
        """The attempt as a JSON-ready dict (``failed_at`` in ISO 8601)."""
        return {
            "attempt": self.attempt,
            "failed_at": self.failed_at.isoformat(),
            "error": self.error,
            "retried": self.retried,
            "task_identifier": self.task_identifier,
            "pool_id": self.pool_id,
            "traceback": self.traceback,
            "retried_by": self.retried_by,
        }


def encode_result(value: Any, limit: int) -> tuple[str | None, str | None]:
    """A task's return value as the JSON text stored with its history, and why
    it is not stored (None, None: nothing to store).

    ``None`` stores nothing. A value that is not JSON (a set, NaN, an object)
    or larger than ``limit`` bytes is not stored, and the reason is: the job
    still succeeds (its work is done; retrying would do it again); so does
    one whose encoding raises anything at all (a ``dict`` subclass whose
    ``items()`` raises, ``SystemExit`` included). Never raises. The text
    is ASCII (``\\uXXXX`` escapes), so nothing in it can be refused for its
    encoding.
    """
    if value is None:
        return None, None
    try:
        text = json.dumps(value, allow_nan=False)
    except BaseException as exc:  # a value's own code (a dict subclass's items()) too
        detail = " ".join(describe(exc).split())[:200]
        return None, f"not JSON: {detail}"
    if len(text) > limit:
        return None, f"too large: {len(text)} bytes, more than the limit of {limit}"
    return text, None


def check_job_id(job_id: int) -> None:
    """A job id: a whole number in ``bigint``'s range (else a JobSpecError naming it)."""
    if isinstance(job_id, bool) or not isinstance(job_id, int) or not 0 < job_id < 1 << 63:
        raise JobSpecError("job_id", f"is {job_id!r}; a job id is a whole number from 1 to 2**63-1")
