"""Options of single jobs, written beside the job by the statement that adds it.

``add_job(..., timeout=30)`` (and a spec's ``timeout`` in ``add_jobs``) is
stored in ``_private_py_job_options`` (``migrations/py/000007.sql``), keyed by
the job's id, never in the jobs table Node reads. It is written only when
given, by the same statement that adds the job (:func:`options_cte`, which
:func:`~worker_cli.jobs.trace_context.carry` puts beside the add), so a worker
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
from typing import Any, Literal, LiteralString, TypeAlias

from ..db.plan import Plan, query

__all__ = ["OptionRows", "OptionsTable", "job_options", "options_cte", "spec_options"]

#: What the statement writes beside the jobs it adds:
#:
#: - ``one``: one job's timeout, ``%(timeout)s`` (an existing job the call
#:   replaced takes it);
#: - ``one_if_added``: the same, only if the call added the job (not for the
#:   existing job ``unsafe_dedupe`` returns);
#: - ``replaced``: no timeout given; the jobs the call replaced lose theirs;
#: - ``each``: each spec of an ``add_jobs`` call, from the ``timeout`` of its
#:   record in ``%(specs)s`` (the JSON array the statement inserts): the
#:   timeout of a spec that has one, none for the job a spec without one
#:   replaced.
OptionRows: TypeAlias = Literal["one", "one_if_added", "replaced", "each"]


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
            rows = yield from query(_INSTALLED, {"schema": self.schema})
            self._installed = bool(rows and rows[0][0])
        return self._installed

    def writes(self, rows: OptionRows | None) -> Plan[OptionRows | None]:
        """``rows``, or None for ``replaced`` without the table (no job can have
        options: there is nothing to clear)."""
        if rows == "replaced" and not (yield from self.installed()):
            return None
        return rows


def options_cte(rows: OptionRows, unique: bool) -> LiteralString:
    """The CTEs writing the options of the jobs of the CTE ``added`` (``with``
    items, preceded by a comma). ``unique``: ``added`` holds unique results
    (``job_id``, ``conflict``, ``spec_index``, then the job's columns): a
    spec that added no job (a conflict) writes nothing."""
    job_id: LiteralString = "added.job_id" if unique else "added.id"
    added: LiteralString = " and not added.conflict" if unique else ""
    if rows == "replaced":
        return _CLEAR.replace("<source>", "added").replace(
            "<condition>", "o.job_id = " + job_id + " and added.revision > 0" + added
        )
    if rows == "each":
        # add_jobs returns one row per spec, in the order of the specs (its
        # insert is ordered by them); a unique add numbers its rows itself,
        # and may return one job for two specs (the second replaced the job
        # the first added): the latest spec says what the job has.
        numbered: LiteralString = (
            "select added.job_id, added.spec_index as n, added.revision from added"
            " where not added.conflict"
            if unique
            else "select added.id as job_id, row_number() over () as n, added.revision from added"
        )
        return (
            """,
  option_specs as (
    select distinct on (a.job_id) a.job_id, a.revision, s.spec ->> 'timeout' as timeout
    from ("""
            + numbered
            + """) as a
    join json_array_elements(%(specs)s::json) with ordinality as s (spec, n) on s.n = a.n
    order by a.job_id, a.n desc
  )"""
            + _UPSERT.replace(
                "<source>",
                "select a.job_id, make_interval(secs => a.timeout::float8)\n"
                "    from option_specs as a where a.timeout is not null",
            )
            + _CLEAR.replace("<source>", "option_specs as a").replace(
                "<condition>", "o.job_id = a.job_id and a.revision > 0 and a.timeout is null"
            )
        )
    source: LiteralString = "select " + job_id + ", %(timeout)s::interval from added"
    if rows == "one_if_added":
        # revision 0: the job is the call's; an existing one is left as it was.
        return _INSERT_NEW.replace("<source>", source + " where added.revision = 0" + added)
    return _UPSERT.replace("<source>", source + (" where not added.conflict" if unique else ""))


_INSTALLED: LiteralString = (
    "select to_regclass(format('%%I._private_py_job_options', %(schema)s::text)) is not null"
)

# The timeouts given; a job the call replaced takes the call's options.
_UPSERT: LiteralString = """,
  optioned as (
    insert into {schema}._private_py_job_options as o (job_id, timeout)
    <source>
    on conflict (job_id) do update
    set timeout = excluded.timeout, snoozes = 0, added_at = now()
  )"""

# A new job's timeout (its id is new: nothing to update).
_INSERT_NEW: LiteralString = """,
  optioned as (
    insert into {schema}._private_py_job_options as o (job_id, timeout)
    <source>
    on conflict (job_id) do nothing
  )"""

# The jobs the call replaced without giving a timeout: none, as for a new job.
# A waiter's notify_on_finish stays. (The statement's snapshot does not see
# the rows inserted by the CTE above: the two touch different jobs.)
_CLEAR: LiteralString = """,
  cleared as (
    update {schema}._private_py_job_options as o
    set timeout = null, snoozes = 0
    from <source>
    where <condition>
      and (o.timeout is not null or o.snoozes <> 0)
  )"""
