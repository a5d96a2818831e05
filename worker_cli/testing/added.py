"""What was added: the jobs in the queue, as the worker reads them, and the
assertions on them (:func:`~worker_cli.testing.assert_job_added`, ...).

They read the jobs table itself, so a job counts however it was added: by
the application's code, a SQL trigger, a Node worker, a task; with the
caller's connection, those its open transaction added too (each read in a
savepoint: a missing schema never aborts that transaction).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..db.plan import Plan, protected, query
from ..jobs.job import Job
from ..jobs.payloads import job_identity, json_default
from ..sql import compose
from ..sql import testing as testing_sql

__all__ = ["LISTED", "READ_AT_MOST", "Match", "added_jobs_plan", "describe_jobs"]

#: The most jobs read (oldest first): a test's queue holds far fewer.
READ_AT_MOST = 10_000
#: The most jobs a failed assertion lists.
LISTED = 20

#: The fields a job is matched on (``job_key`` is ``add_job``'s name for ``key``).
_FIELDS = frozenset(Job._fields) - {"payload", "task_identifier"}
_ALIASES = {"job_key": "key"}


class Match:
    """What an assertion looks for: a task, maybe a payload, maybe fields."""

    def __init__(
        self, function: str, task_identifier: Any, payload: Any, fields: Mapping[str, Any]
    ) -> None:
        if task_identifier is None:
            self.task: str | None = None
            self.payload_given = payload is not None
            self.payload = payload
        else:
            self.task, self.payload = job_identity(task_identifier, payload)
            self.payload_given = payload is not None or not isinstance(task_identifier, str)
        if self.payload_given:
            # As add_job stores it: dataclasses, models and enums as JSON data.
            self.payload = json.loads(json.dumps(self.payload, default=json_default))
        self.fields = {}
        for name, value in fields.items():
            field = _ALIASES.get(name, name)
            if field not in _FIELDS:
                known = ", ".join(sorted(_FIELDS | set(_ALIASES)))
                raise TypeError(f"{function}() got an unknown field {name!r} (fields: {known})")
            self.fields[field] = value

    def matches(self, job: Job) -> bool:
        """Whether ``job`` is one of those looked for."""
        if self.task is not None and job.task_identifier != self.task:
            return False
        if self.payload_given and job.payload != self.payload:
            return False
        return all(getattr(job, name) == value for name, value in self.fields.items())

    def describe(self) -> str:
        """What is looked for, in words."""
        parts = [f"of task {self.task!r}" if self.task is not None else "of any task"]
        if self.payload_given:
            parts.append(f"with payload {self.payload!r}")
        parts += [f"{name}={value!r}" for name, value in self.fields.items()]
        return " ".join(parts)


def added_jobs_plan(schema: str, task: str | None) -> Plan[list[Job]]:
    """The jobs in the queue (of ``task``, or all), oldest first. A row
    Python cannot read whole (a payload nested 5,000 deep or holding a
    5,000-digit number; a ``run_at`` of -infinity) is read as far as it can
    be, never failing the others: its payload as its JSON text, its times as
    the earliest or latest datetime."""
    rows = yield from protected(
        query(
            compose(testing_sql.ADDED_JOBS, schema),
            {"task": task, "limit": READ_AT_MOST},
            raw_payloads=True,
            lenient_times=True,
        )
    )
    return [Job(*row)._replace(payload=_payload(row[3])) for row in rows]


def _payload(raw: bytes | str | None) -> Any:
    """A payload loaded as its JSON text: parsed, or that text if Python
    cannot parse it."""
    if raw is None:
        return None
    text = raw.decode() if isinstance(raw, bytes) else raw
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def describe_jobs(jobs: Sequence[Job]) -> str:
    """The jobs of a failed assertion, one a line (at most :data:`LISTED`)."""
    if not jobs:
        return "the queue holds no job"
    lines = [f"the queue holds {len(jobs)} job(s):"]
    for job in jobs[:LISTED]:
        extra = "".join(
            f", {name} {getattr(job, name)!r}"
            for name in ("queue_name", "key", "locked_by")
            if getattr(job, name) is not None
        )
        lines.append(
            f"  job {job.id}: {job.task_identifier} {job.payload!r} "
            f"(run_at {job.run_at.isoformat()}, attempts {job.attempts}/{job.max_attempts}"
            f"{extra})"
        )
    if len(jobs) > LISTED:
        lines.append(f"  ... and {len(jobs) - LISTED} more")
    return "\n".join(lines)
