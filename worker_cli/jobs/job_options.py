"""Options of single jobs, written beside the job by the statement that adds it.

``add_job(..., timeout=30)`` (and a spec's ``timeout`` in ``add_jobs``) is
stored in ``_private_py_job_options`` (``migrations/py/000007.sql``), keyed by
the job's id, never in the jobs table Node reads. It is written only when
given, by the same statement that adds the job (:func:`options_cte`, which
:func:`~worker_cli.jobs.trace_context.carry` puts beside the add), so a worker
never sees the job without it; a job added without options costs nothing
more. The worker's fetch (``py_fetch_jobs``, ``migrations/py/000009.sql``)
returns each job's timeout with the job.

A job updated through its ``job_key`` takes the timeout of the latest call
that gives one; a call without one leaves it as it was. Node workers never
read the table: they run the job without a timeout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, LiteralString, TypeAlias

__all__ = ["OptionRows", "options_cte", "spec_options"]

#: How the options reach the statement: ``one`` job, from ``%(timeout)s``; or
#: ``each`` spec of an add_jobs call, from the ``timeout`` of its record in
#: ``%(specs)s`` (the JSON array the statement inserts).
OptionRows: TypeAlias = Literal["one", "each"]


def spec_options(records: Sequence[dict[str, Any]]) -> OptionRows | None:
    """``each`` if any spec record carries a timeout, else None (nothing to write)."""
    return "each" if any("timeout" in record for record in records) else None


def options_cte(rows: OptionRows, unique: bool) -> LiteralString:
    """The CTE writing the options of the jobs of the CTE ``added`` (a ``with``
    item, preceded by a comma). ``unique``: ``added`` holds unique results
    (``job_id``, ``conflict``, ``spec_index``): a spec that added no job
    (a conflict) writes nothing."""
    job_id: LiteralString = "added.job_id" if unique else "added.id"
    added: LiteralString = " where not added.conflict" if unique else ""
    if rows == "one":
        source: LiteralString = "select " + job_id + ", %(timeout)s::interval from added" + added
    else:
        # add_jobs returns one row per spec, in the order of the specs (its
        # insert is ordered by them); a unique add numbers its rows itself.
        numbered: LiteralString = (
            "(select added.job_id, added.spec_index as n from added" + added + ")"
            if unique
            else "(select added.id as job_id, row_number() over () as n from added)"
        )
        source = (
            "select a.job_id, make_interval(secs => (s.spec ->> 'timeout')::float8)\n"
            "    from " + numbered + " as a\n"
            "    join json_array_elements(%(specs)s::json) with ordinality as s (spec, n)\n"
            "      on s.n = a.n\n"
            "    where s.spec ->> 'timeout' is not null"
        )
    return (
        """,
  optioned as (
    insert into {schema}._private_py_job_options as o (job_id, timeout)
    """
        + source
        + """
    on conflict (job_id) do update set timeout = excluded.timeout, added_at = now()
  )"""
    )
