"""What running a job comes to, and the boundary around everything done on
its behalf.

A slot (or its task thread) calls the task inside a guard that turns
whatever it raises into the job's error; what the call gave is a
:class:`Ran`. Everything after that still runs code a job brings with it:
its returned value's encoding (a ``dict`` subclass's ``items()``), its batch
results, the Snooze/Cancel/Discard it raised, its task's retry policy and
backoff function, the text of its error. :meth:`Settler.settle` does all of
it in one place, which never raises: anything raised there (``SystemExit``,
``KeyboardInterrupt``, a ``CancelledError`` nobody asked for, ``MemoryError``
included) becomes that job's failure, with an error saying what failed.
Nothing in it awaits, so no cancellation of the worker's own can arrive
there.

What comes out is ready to write: a success (:class:`Ran`, its result
encoded) or a :class:`Failure` whose every value the failure statement takes
is of the type and range it expects and can be stored (text without NUL or
lone surrogates, bounded: :func:`~worker_cli.jobs.last_error.storable`).
A write the server or the client library still refuses is isolated to its
job by :mod:`.result_writer`.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...errors import JobCancelled, PayloadError
from ...jobs.job import Job
from ...jobs.job_state import encode_result
from ...jobs.last_error import describe, storable, traceback_of
from ...jobs.workflow import is_step
from ...tasks.attempt_log import AttemptLog
from ...tasks.loader import Task
from ...tasks.retry_policy import MAX_DELAY, Cancel, Discard, RetryPolicy, Snooze, TaskSignal

__all__ = ["Failure", "Ran", "Settler", "apply_task_rules", "batch_failures", "text_of"]

logger = logging.getLogger("graphile_worker")


@dataclass(slots=True)
class Ran:
    """One run of a job's task, and once settled (:meth:`Settler.settle`), its
    success ready to write."""

    job: Job
    worker_id: str
    #: None: the task returned.
    error: BaseException | None
    #: How long it ran, in milliseconds.
    duration_ms: float
    #: What the task returned (None once settled).
    returned: Any = None
    #: It went past its timeout: what its task says follows (``on_timeout``).
    timed_out: str | None = None
    #: What it returned, as JSON text to keep (None: nothing, or not kept).
    result: str | None = None
    #: Why what it returned was not kept (see ``encode_result``).
    result_error: str | None = None
    #: The lines its task logged through helpers.logger (--job-logs), and
    #: once settled, their text and how many were dropped (a success's are
    #: written with --job-logs all only).
    log: AttemptLog | None = None
    logs: tuple[str, int] | None = None


@dataclass(slots=True)
class Failure:
    """A failed job waiting to be written back."""

    job: Job
    worker_id: str
    error: BaseException
    #: The text stored as the job's last_error (see :func:`~worker_cli.jobs.last_error.describe`).
    message: str
    #: A batch job's failed items, by position (0-based): its payload becomes
    #: them, as they are stored (None: the payload is unchanged).
    failed_items: list[int] | None = None
    #: No retry follows: its attempts are used up, or its payload does not fit
    #: its task (a PayloadError), which no retry can change: it is failed for
    #: good now (attempts set to max_attempts; reschedule_jobs revives it).
    permanent: bool = field(init=False)
    #: How long it ran, in milliseconds.
    duration_ms: float = 0.0
    #: The attempt went past its timeout: what its task says follows
    #: (``on_timeout``; recorded in the history's timed_out if the job ends
    #: there now).
    on_timeout: str | None = None
    #: Recorded as cancelled (a cancel request is written with the failure):
    #: a timeout whose task says on_timeout="cancel", or a task raising
    #: Cancel (with ``cancel_reason``).
    cancel: bool = False
    cancel_reason: str | None = None
    #: Seconds before the next attempt, from the task's retry policy (None:
    #: graphile-worker's formula).
    delay: float | None = None
    #: The task raised Snooze: seconds before it runs again, its attempt given
    #: back (unless it has snoozed ``max_snoozes`` times already).
    snooze: float | None = None
    max_snoozes: int | None = None
    #: The error's traceback, kept with the attempt's error (bounded:
    #: :func:`~worker_cli.jobs.last_error.traceback_of`); last_error keeps
    #: ``message`` only.
    traceback: str | None = field(init=False)
    #: The lines its task logged during the attempt (text, lines dropped).
    logs: tuple[str, int] | None = None

    def __post_init__(self) -> None:
        self.traceback = traceback_of(self.error)
        self.permanent = (
            isinstance(self.error, PayloadError | JobCancelled)
            or self.job.attempts >= self.job.max_attempts
        )

    @property
    def timed_out(self) -> bool:
        """The attempt went past its timeout."""
        return self.on_timeout is not None


class Settler:
    """Settles the runs of one pool's jobs (see the module's docstring); any
    thread may call :meth:`settle`."""

    def __init__(
        self,
        tasks: Mapping[str, Task],
        *,
        result_limit: int | None,
        cancelling: Mapping[int, str | None],
        step_result_limit: int | None = None,
    ) -> None:
        #: The tasks' retry policies, by identifier (only those that have one).
        self._policies = {
            name: task.options.retry for name, task in tasks.items() if task.options.retry
        }
        #: The largest result kept, in bytes (None: results are not kept).
        self._result_limit = result_limit
        #: The same for a workflow step's job, whose result its children read
        #: (kept with history off too).
        self._step_result_limit = step_result_limit
        #: The pool's cancel requests: a job in it is cancelled, whatever it raised.
        self._cancelling = cancelling

    def settle(self, ran: Ran) -> Ran | Failure:
        """The outcome of ``ran`` ready to write (a success comes back as
        ``ran`` itself, its result encoded). Never raises."""
        step = "settle its outcome"
        try:
            log, ran.log = ran.log, None
            if log is not None:
                step = "keep its log lines"
                ran.logs = log.render()
            if ran.error is None:
                returned, ran.returned = ran.returned, None
                if returned is None:
                    return ran
                if isinstance(returned, list) and isinstance(ran.job.payload, list):
                    step = "read its batch results"
                    error, failed_items = batch_failures(ran.job, returned)
                    if error is not None:
                        return self._failed(ran, error, failed_items)
                limit = self._result_limit
                if limit is None and is_step(ran.job.flags):
                    limit = self._step_result_limit
                if limit is not None:
                    # Never raises: a value it cannot encode is not kept.
                    ran.result, ran.result_error = encode_result(returned, limit)
                return ran
            return self._failed(ran, ran.error, None)
        except BaseException as exc:  # a job's code, whatever it raised: the job fails
            return self._unsettled(ran, step, exc)

    def _failed(self, ran: Ran, error: BaseException, failed_items: list[int] | None) -> Failure:
        job = ran.job
        failure = Failure(job, ran.worker_id, error, describe(error), failed_items, ran.duration_ms)
        failure.logs = ran.logs
        policy = self._policies.get(job.task_identifier) if self._policies else None
        if isinstance(error, TaskSignal):
            step = f"act on the {type(error).__name__} it raised"
        elif policy is not None:
            step = "apply its task's retry policy"
        else:
            step = ""
        if step:
            try:
                apply_task_rules(failure, policy)
            except BaseException as exc:  # a job's code, as in settle()
                return self._unsettled(ran, step, exc)
        if ran.timed_out is not None:
            self._timed_out(failure, ran.timed_out)
        return failure

    def _timed_out(self, failure: Failure, on_timeout: str) -> None:
        """The attempt went past its timeout: its task's ``on_timeout`` decides."""
        cancelled = bool(self._cancelling) and failure.job.id in self._cancelling
        failure.on_timeout = on_timeout
        failure.permanent = failure.permanent or on_timeout != "retry"
        failure.cancel = on_timeout == "cancel" and not cancelled

    def _unsettled(self, ran: Ran, step: str, exc: BaseException) -> Failure:
        """The failure of a job whose outcome raised ``exc`` on the way (while
        the worker tried to ``step``): retried as any failure, its error saying
        what happened."""
        job = ran.job
        what = "" if ran.error is None else f"{describe(ran.error)}; then "
        message = storable(f"{what}the worker could not {step}: {describe(exc)}")
        error = RuntimeError(message)
        error.__cause__ = exc
        _warn(
            "Job %d (%s): the worker could not %s (%s); failed the attempt",
            job.id,
            job.task_identifier,
            step,
            describe(exc).splitlines()[0],
        )
        failure = Failure(job, ran.worker_id, error, message, None, ran.duration_ms)
        failure.logs = ran.logs
        if ran.timed_out is not None:
            self._timed_out(failure, ran.timed_out)
        return failure


def apply_task_rules(failure: Failure, policy: RetryPolicy | None) -> None:
    """What the task said (it raised Snooze, Discard or Cancel) and its retry
    policy decide for a failure: given back for later, failed for good,
    cancelled, or retried after the policy's delay. Every value set here is
    checked as the failure statement takes it: a Snooze whose ``seconds`` is
    not a duration raises (the caller fails the attempt instead). A backoff
    function that fails is logged, and graphile-worker's backoff is used."""
    error, job = failure.error, failure.job
    if isinstance(error, Snooze):
        failure.permanent = False
        failure.snooze = _seconds_or_raise("Snooze: seconds", error.seconds)
        failure.max_snoozes = policy.max_snoozes if policy is not None else None
    elif isinstance(error, Discard):
        failure.permanent = True
    elif isinstance(error, Cancel):
        failure.permanent = failure.cancel = True
        failure.cancel_reason = text_of(error.reason)
    elif policy is not None:
        if not policy.retries(error) or policy.last_attempt(job):
            failure.permanent = True
        elif not failure.permanent:
            try:
                failure.delay = _seconds_or_raise(
                    "the backoff's delay", policy.delay_for(job, error), none=True
                )
            except BaseException as exc:  # the backoff function's own: the failure stands
                _warn(
                    "Job %d (%s): its retry policy's backoff failed (%s); "
                    "graphile-worker's backoff is used",
                    job.id,
                    job.task_identifier,
                    describe(exc).splitlines()[0],
                )


def _warn(message: str, *args: object) -> None:
    """Log a warning about a job; never raises (a user's logging filter may)."""
    with contextlib.suppress(BaseException):
        logger.warning(message, *args)


def _seconds_or_raise(name: str, value: object, *, none: bool = False) -> float | None:
    """``value`` as the seconds the failure statement stores (0 to a year);
    ValueError naming ``name`` for anything else."""
    if value is None and none:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= MAX_DELAY
    ):
        raise ValueError(f"{name} must be from 0 to {MAX_DELAY:g} seconds, not {value!r}")
    return float(value)


def text_of(value: object) -> str | None:
    """``value`` (a reason a task or a user gave) as text PostgreSQL can store:
    a string made storable, an exception described, anything else by its
    ``str()`` (or its type's name if that fails); None stays None. Never raises."""
    if value is None:
        return None
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, BaseException):
        return describe(value)
    try:
        text = str(value)
    except BaseException:
        text = f"<unprintable {type(value).__name__} object>"
    return storable(text if isinstance(text, str) else repr(type(value)))


def batch_failures(job: Job, result: list[Any]) -> tuple[Exception | None, list[int] | None]:
    """A list payload answered by a list of results: retry only the failed items.

    Returns the job's error and the positions of its failed items (None, None:
    success). The failure statement keeps those items of the stored payload,
    as they were written: the worker never re-encodes a payload (a number
    like ``1e400`` reads as ``inf`` in Python, which is not JSON).
    A list of another length is a bug in the task: as graphile-worker does, it
    is logged and the job counts as a success.
    """
    payload: list[Any] = job.payload
    if len(result) != len(payload):
        logger.warning(
            "Task %r (job %d) returned a list of %d result(s) for a payload of %d item(s): "
            "a batch task returns nothing, or one result per item (an exception for those "
            "that failed). Treated as a full success; this is a bug in the task.",
            job.task_identifier,
            job.id,
            len(result),
            len(payload),
        )
        return None, None
    failed = [index for index, entry in enumerate(result) if isinstance(entry, BaseException)]
    if not failed:
        return None, None
    error = RuntimeError(
        f"Batch failures ({len(failed)} of {len(result)} items):\n"
        + "\n".join(describe(result[index]) for index in failed)
    )
    return error, failed
