"""What an add statement writes beside the jobs it adds, in the same statement:
the caller's trace context (``_private_py_job_trace_contexts``,
migrations/py/000006.sql; :mod:`worker_cli.client.trace_context`) and the
jobs' options (``_private_py_job_options``, migrations/py/000007.sql;
:mod:`worker_cli.client.job_options`).

The one place here that composes SQL text at run time: an add statement
(:data:`~worker_cli.sql.jobs.ADD_JOB`, ``ADD_JOBS``, ``ADD_UNIQUE_JOB``,
``ADD_UNIQUE_JOBS``) is wrapped in a ``with added as (...)`` and followed by
the CTEs below, by :func:`carrying`: some 28 combinations (4 adds, trace
context or not, 5 kinds of options), too many to write out whole.
"""

from __future__ import annotations

from functools import cache
from typing import Literal, LiteralString, TypeAlias

__all__ = ["OptionRows", "carrying", "options_cte"]

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


@cache
def carrying(
    statement: LiteralString,
    unique: bool,
    trace: bool,
    options: OptionRows | None,
    forget: bool = False,
) -> LiteralString:
    """``statement`` (an add, its rows the CTE ``added``) wrapped so that it also
    stores the trace context (``trace``: %(trace_context)s) and writes the
    jobs' options (``options``, see :func:`options_cte`) of the jobs it adds;
    ``unique``: it returns unique results. ``forget`` (without ``trace``): the
    jobs it replaced through their key lose the context an earlier call
    stored (the latest call, traced or not, is the job's)."""
    # One WITH for both: a data-modifying CTE must be at the top level.
    # A job updated through its job_key takes the context of the latest call.
    job_id: LiteralString = "added.job_id" if unique else "added.id"
    added: LiteralString = " where not added.conflict" if unique else ""
    carried: LiteralString = (
        """,
  carried as (
    insert into {schema}._private_py_job_trace_contexts (job_id, context)
    select """
        + job_id
        + ", %(trace_context)s::jsonb from added"
        + added
        + """
    on conflict (job_id) do update set context = excluded.context, added_at = now()
  )"""
        if trace
        else ""
    )
    if forget and not trace:
        carried = (
            """,
  forgot as (
    delete from {schema}._private_py_job_trace_contexts as c
    using added
    where c.job_id = """
            + job_id
            + " and added.revision > 0"
            + (" and not added.conflict" if unique else "")
            + """
  )"""
        )
    optioned = options_cte(options, unique) if options is not None else ""
    return (
        "with added as (\n" + statement + "\n  )" + carried + optioned + "\n  select * from added"
    )


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
