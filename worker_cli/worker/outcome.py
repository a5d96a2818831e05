"""What running a job comes to: success, or a failure to write back."""

from __future__ import annotations

from dataclasses import dataclass

from ..job import Job

__all__ = ["Failure", "describe"]


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
