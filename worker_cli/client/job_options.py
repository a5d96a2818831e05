"""Options of single jobs, written beside the job by the statement that adds it.

``add_job(..., timeout=30)`` (and a spec's ``timeout`` in ``add_jobs``) is
stored in ``_private_py_job_options`` (``migrations/py/000007.sql``), keyed by
the job's id, never in the jobs table Node reads. It is written only when
given, by the same statement that adds the job (:func:`worker_cli.sql.carried.options_cte`, which
:func:`~worker_cli.client.trace_context.carry` puts beside the add), so a worker
never sees the job without it; a job added without options costs nothing
more. The worker's fetch (``py_fetch_jobs``, ``migrations/py/000009.sql``)
returns each job's timeout with the job.

A ``job_key`` follows graphile-worker's rules for the options too:

- ``replace`` and ``preserve_run_at`` (and ``add_jobs``) make the job what the
  latest call says: its timeout is the call's, none if the call gives none,
  and its count of snoozes starts again from 0 (as its attempts do). A
  waiter registered on it (``wait_for_job``) stays registered.
- ``unsafe_dedupe`` leaves an existing job as it was: a call's timeout is
  written only if the call added the job.
- A job that was running when the call came keeps its options; the call's
  job is a new one (a new id), with the call's options only.

The add functions tell which happened: a job they insert has revision 0, a
job they update (replace) or return (dedupe) has a higher one. Node workers
never read the table: they run the job without a timeout. In a schema Node
installed alone (no table), a keyed call without a timeout has nothing to
clear and writes nothing (:class:`OptionsTable` tells).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..db.plan import Plan, query
from ..sql import jobs as jobs_sql
from ..sql.carried import OptionRows

__all__ = ["OptionRows", "OptionsTable", "job_options", "spec_options"]


def job_options(timeout: bool, job_key: str | None, job_key_mode: str) -> OptionRows | None:
    """What ``add_job`` writes beside its job (None: nothing): ``timeout``
    whether the call gives one."""
    dedupe = job_key is not None and job_key_mode == "unsafe_dedupe"
    if timeout:
        return "one_if_added" if dedupe else "one"
    return "replaced" if job_key is not None and not dedupe else None


def spec_options(records: Sequence[dict[str, Any]]) -> OptionRows | None:
    """What ``add_jobs`` writes beside its jobs (None: nothing): ``each`` if any
    spec record carries a timeout, ``replaced`` if none does but one has a
    job key (the job it replaces may have had a timeout)."""
    if any("timeout" in record for record in records):
        return "each"
    return "replaced" if any(record.get("job_key") is not None for record in records) else None


class OptionsTable:
    """Whether a schema has the options table (Python migration 7): asked until
    it has (a migration may add it), then known for good."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self._installed = False

    def installed(self) -> Plan[bool]:
        """Whether the table exists."""
        if not self._installed:
            rows = yield from query(jobs_sql.JOB_OPTIONS_INSTALLED, {"schema": self.schema})
            self._installed = bool(rows and rows[0][0])
        return self._installed

    def writes(self, rows: OptionRows | None) -> Plan[OptionRows | None]:
        """``rows``, or None for ``replaced`` without the table (no job can have
        options: there is nothing to clear)."""
        if rows == "replaced" and not (yield from self.installed()):
            return None
        return rows
