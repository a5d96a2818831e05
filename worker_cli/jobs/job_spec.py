"""What a caller may ask for when adding a job, checked before it reaches SQL.

The limits are the schema's: a bad value raises :class:`JobSpecError` naming
the field and the limit, instead of a constraint violation from PostgreSQL.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeAlias, TypedDict

from ..errors import JobSpecError
from .payloads import check_named_task, json_default, json_ready, named_task
from .text_args import check_text

__all__ = [
    "JOB_KEY_MODES",
    "MAX_TIMEOUT",
    "AddJobOptions",
    "JobKeyMode",
    "JobSpec",
    "TaskSpec",
    "check_run_at_range",
    "check_timeout",
    "encode_payload",
    "local_run_at",
    "with_local_run_at",
]

JobKeyMode: TypeAlias = Literal["replace", "preserve_run_at", "unsafe_dedupe"]
JOB_KEY_MODES: tuple[str, ...] = ("replace", "preserve_run_at", "unsafe_dedupe")

IDENTIFIER_MAX = 128  # _private_tasks.identifier and _private_job_queues.queue_name
KEY_MAX = 512  # _private_jobs.key
SMALLINT_MIN, SMALLINT_MAX = -32768, 32767
#: The earliest and latest run_at (see check_run_at_range).
RUN_AT_MIN = datetime(1, 1, 2, tzinfo=UTC)
RUN_AT_MAX = datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=UTC)
#: The longest timeout a job or a task may have.
MAX_TIMEOUT = timedelta(days=365)


class AddJobOptions(TypedDict, total=False):
    """The options of ``add_job`` as keyword arguments (the fields of :class:`TaskSpec`)."""

    queue_name: str | None
    run_at: datetime | None
    max_attempts: int | None
    job_key: str | None
    job_key_mode: JobKeyMode | None
    priority: int | None
    flags: Sequence[str] | None
    timeout: float | timedelta | None


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskSpec:
    """The options of one job, as in graphile-worker's ``TaskSpec``."""

    queue_name: str | None = None
    run_at: datetime | None = None
    max_attempts: int | None = None
    job_key: str | None = None
    job_key_mode: JobKeyMode | None = None
    priority: int | None = None
    flags: Sequence[str] | None = None
    #: The job's own timeout (seconds or a timedelta; None: its task's, if any),
    #: stored beside it in ``_private_py_job_options``.
    timeout: float | timedelta | None = None

    def validate(self) -> None:
        """Raise JobSpecError if any option is outside the schema's limits."""
        _check_text("queue_name", self.queue_name, 1, IDENTIFIER_MAX)
        _check_text("job_key", self.job_key, 1, KEY_MAX)
        if self.run_at is not None:
            if not isinstance(self.run_at, datetime):
                raise JobSpecError(
                    "run_at", f"must be a datetime, not {type(self.run_at).__name__}"
                )
            if self.run_at.tzinfo is None or self.run_at.utcoffset() is None:
                raise JobSpecError(
                    "run_at", "must be timezone-aware (for example datetime.now(timezone.utc))"
                )
            if self.run_at.year in (1, 9999):  # the only years it can be out of range in
                check_run_at_range(self.run_at)
        _check_int("max_attempts", self.max_attempts, 1, SMALLINT_MAX)
        _check_int("priority", self.priority, SMALLINT_MIN, SMALLINT_MAX)
        if self.job_key_mode is not None and self.job_key_mode not in JOB_KEY_MODES:
            raise JobSpecError(
                "job_key_mode",
                f"{self.job_key_mode!r} is not one of {', '.join(JOB_KEY_MODES)}",
            )
        flags = self.flags
        if flags is not None and (
            isinstance(flags, str | bytes) or not all(isinstance(flag, str) for flag in flags)
        ):
            raise JobSpecError("flags", "must be a list of strings")
        for flag in flags or ():
            check_text(flag, "flags")
        check_timeout(self.timeout)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec(TaskSpec):
    """A whole job for ``add_jobs``: the fields of the SQL type ``job_spec``.

    ``job_key_mode`` is not part of it: ``add_jobs`` takes
    ``job_key_preserve_run_at`` for the whole batch, as the SQL function does.
    """

    identifier: str
    payload: Any = None

    @classmethod
    def coerce(cls, spec: JobSpec | Mapping[str, Any], index: int) -> JobSpec:
        """Accept a JobSpec or a dict with the same field names."""
        if isinstance(spec, JobSpec):
            return spec
        if not isinstance(spec, Mapping):
            raise JobSpecError(f"specs[{index}]", "must be a JobSpec or a dict")
        unknown = set(spec) - _SPEC_FIELDS
        if unknown:
            raise JobSpecError(f"specs[{index}]", f"unknown field(s) {', '.join(sorted(unknown))}")
        if "identifier" not in spec:
            named = named_task(spec.get("payload"))
            if named is None:
                raise JobSpecError(
                    f"specs[{index}]",
                    "identifier is required (unless the payload's class names its task)",
                )
            spec = {**spec, "identifier": named}
        return cls(**spec)

    def validate(self) -> None:
        validate_identifier(self.identifier)
        check_named_task(self.identifier, self.payload)
        TaskSpec.validate(self)
        if self.job_key_mode is not None:
            raise JobSpecError(
                "job_key_mode",
                "add_jobs takes job_key_preserve_run_at for the whole batch, not a per-job mode",
            )

    def to_json_record(self) -> dict[str, Any]:
        """The spec as a JSON object whose keys are ``job_spec``'s attributes,
        and ``timeout`` (seconds) when it has one (``job_spec`` has no such
        attribute: the SQL reads it from the JSON, see ``job_options``)."""
        record = {
            "identifier": self.identifier,
            "payload": json_ready(self.payload),
            "queue_name": self.queue_name,
            "run_at": self.run_at.isoformat() if self.run_at else None,
            "max_attempts": self.max_attempts,
            "job_key": self.job_key,
            "priority": self.priority,
            "flags": list(self.flags) if self.flags is not None else None,
        }
        timeout = check_timeout(self.timeout)
        if timeout is not None:
            record["timeout"] = timeout.total_seconds()
        return record


_SPEC_FIELDS = frozenset(f.name for f in fields(JobSpec))


def local_run_at(run_at: datetime | None, use_local_time: bool) -> datetime | None:
    """``run_at``, or with ``use_local_time`` this process's time (UTC) in
    place of a missing one; None lets the database use its now()."""
    if run_at is None and use_local_time:
        return datetime.now(UTC)
    return run_at


def with_local_run_at(
    specs: Sequence[JobSpec | Mapping[str, Any]],
) -> list[JobSpec | Mapping[str, Any]]:
    """``add_jobs``' specs, those without ``run_at`` given this process's time
    (one reading for the whole call). Anything else is left for validation."""
    now = datetime.now(UTC)
    filled: list[JobSpec | Mapping[str, Any]] = []
    for spec in specs:
        if isinstance(spec, JobSpec) and spec.run_at is None:
            spec = replace(spec, run_at=now)
        elif isinstance(spec, Mapping) and spec.get("run_at") is None:
            spec = {**spec, "run_at": now}
        filled.append(spec)
    return filled


def validate_identifier(identifier: object) -> None:
    """Check a task identifier: a non-empty string of at most 128 characters."""
    if not isinstance(identifier, str):
        raise JobSpecError("identifier", f"must be a string, not {type(identifier).__name__}")
    _check_text("identifier", identifier, 1, IDENTIFIER_MAX)


def encode_payload(payload: Any, field: str = "payload") -> str | None:
    """Encode a payload as JSON text, or raise JobSpecError saying why it cannot be.

    Dataclass instances, pydantic models and Enums are encoded as JSON data
    wherever they are in the payload (see :mod:`worker_cli.jobs.payloads`)."""
    if payload is None:
        return None
    try:
        return json.dumps(payload, default=json_default, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise JobSpecError(field, f"cannot be encoded as JSON ({exc})") from None


def check_run_at_range(run_at: datetime) -> None:
    """A job is read back with its run_at in the session's time zone, which
    must still be a datetime (years 1 to 9999): refuse a run_at a day or less
    from those ends (time zones are at most 16 hours from UTC)."""
    if not RUN_AT_MIN <= run_at <= RUN_AT_MAX:
        raise JobSpecError(
            "run_at",
            f"{run_at.isoformat()} is not from {RUN_AT_MIN.date()} to {RUN_AT_MAX.date()} (UTC); "
            "a job's run_at must be a datetime in every time zone it may be read back in",
        )


def check_timeout(value: object, field: str = "timeout") -> timedelta | None:
    """A timeout (seconds, or a timedelta) as a timedelta, or None; raises
    JobSpecError naming ``field`` unless it is more than 0 and at most
    :data:`MAX_TIMEOUT`."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        timeout = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT.total_seconds():
            raise JobSpecError(field, f"is {value!r}; it must be more than 0 and at most a year")
        timeout = timedelta(seconds=value)
    else:
        raise JobSpecError(
            field, f"must be a number of seconds or a timedelta, not {type(value).__name__}"
        )
    if not timedelta(0) < timeout <= MAX_TIMEOUT:
        raise JobSpecError(field, f"is {timeout}; it must be more than 0 and at most a year")
    return timeout


def _check_text(field: str, value: object, minimum: int, maximum: int) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        raise JobSpecError(field, f"must be a string, not {type(value).__name__}")
    if len(value) < minimum:
        raise JobSpecError(field, "must not be empty")
    if len(value) > maximum:
        raise JobSpecError(field, f"is {len(value)} characters long; the limit is {maximum}")
    check_text(value, field)  # no NUL, no lone surrogate


def _check_int(field: str, value: object, minimum: int, maximum: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise JobSpecError(field, f"must be an integer, not {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise JobSpecError(field, f"is {value}; it must be between {minimum} and {maximum}")
