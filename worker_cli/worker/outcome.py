"""What running a job comes to: success, or a failure to write back."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ..errors import JobCancelled, PayloadError
from ..jobs.job import Job
from ..jobs.last_error import describe
from ..tasks.retry import Cancel, Discard, RetryPolicy, Snooze

__all__ = ["Failure", "apply_task_rules", "batch_failures"]

logger = logging.getLogger("graphile_worker")


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
    #: The attempt went past its timeout (recorded in the history's timed_out
    #: if the job ends there now).
    timed_out: bool = False
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

    def __post_init__(self) -> None:
        self.permanent = (
            isinstance(self.error, PayloadError | JobCancelled)
            or self.job.attempts >= self.job.max_attempts
        )


def apply_task_rules(failure: Failure, policy: RetryPolicy | None) -> None:
    """What the task said (it raised Snooze, Discard or Cancel) and its retry
    policy decide for a failure: given back for later, failed for good,
    cancelled, or retried after the policy's delay. A backoff function that
    fails is logged, and graphile-worker's backoff is used."""
    error, job = failure.error, failure.job
    if isinstance(error, Snooze):
        failure.permanent = False
        failure.snooze = error.seconds
        failure.max_snoozes = policy.max_snoozes if policy is not None else None
    elif isinstance(error, Discard):
        failure.permanent = True
    elif isinstance(error, Cancel):
        failure.permanent = failure.cancel = True
        failure.cancel_reason = error.reason
    elif policy is not None:
        if not policy.retries(error) or policy.last_attempt(job):
            failure.permanent = True
        elif not failure.permanent:
            try:
                failure.delay = policy.delay_for(job, error)
            except Exception as exc:
                logger.warning(
                    "Job %d (%s): its retry policy's backoff failed (%s); "
                    "graphile-worker's backoff is used",
                    job.id,
                    job.task_identifier,
                    describe(exc).splitlines()[0],
                )


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
