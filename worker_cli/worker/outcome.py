"""What running a job comes to: success, or a failure to write back."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from ..errors import PayloadError
from ..job import Job

__all__ = ["Failure", "batch_failures", "describe"]

logger = logging.getLogger("graphile_worker")


@dataclass(slots=True)
class Failure:
    """A failed job waiting to be written back."""

    job: Job
    worker_id: str
    error: BaseException
    #: The text stored as the job's last_error (see :func:`describe`).
    message: str
    #: A batch job's new payload: the items that failed (None: unchanged).
    replacement_payload: str | None = None
    #: No retry follows: its attempts are used up, or its payload does not fit
    #: its task (a PayloadError), which no retry can change: it is failed for
    #: good now (attempts set to max_attempts; reschedule_jobs revives it).
    permanent: bool = field(init=False)

    def __post_init__(self) -> None:
        self.permanent = (
            isinstance(self.error, PayloadError) or self.job.attempts >= self.job.max_attempts
        )


def describe(error: BaseException) -> str:
    """The text stored as a job's last_error. Never raises: an exception whose
    ``__str__`` fails is described as ``<unprintable ...>``. NUL characters and
    lone surrogates, which a PostgreSQL text value cannot hold, are written as
    escapes: stored raw, they would fail the write of every result in the
    batch, again and again."""
    name = type(error).__name__
    try:
        text = str(error)
    except BaseException:
        text = f"<unprintable {name} object>"
    described = f"{name}: {text}" if text else name
    return described.encode("utf-8", "backslashreplace").decode().replace("\x00", "\\x00")


def batch_failures(job: Job, result: list[Any]) -> tuple[Exception | None, str | None]:
    """A list payload answered by a list of results: retry only the failed items.

    Returns the job's error and its replacement payload (None, None: success).
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
    failed = [
        (item, entry)
        for item, entry in zip(payload, result, strict=True)
        if isinstance(entry, BaseException)
    ]
    if not failed:
        return None, None
    error = RuntimeError(
        f"Batch failures ({len(failed)} of {len(result)} items):\n"
        + "\n".join(describe(entry) for _, entry in failed)
    )
    return error, json.dumps([item for item, _ in failed])
