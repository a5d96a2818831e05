"""The Finished view's filter and page: the finished jobs of the history
(``_private_py_job_history``), newest job first, by a keyset on its primary
key, ``job_id`` (:data:`worker_cli.sql.dashboard.FINISHED_PAGE`): the history has no index on
the finish time, which every completed job would pay for. Jobs finish in
about the order they were added; one that waited (scheduled, retried) is
listed by when it was added, with its finish time shown.

The cursor is the id of the last job a page showed (``?cursor=1234``),
independent of that job still being in the history (the pruning may delete
it meanwhile).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .filters import FINISHED_STATES
from .formatting import datetime_input
from .inputs import BadInput, checked_text, parse_job_id, parse_time, shown

__all__ = [
    "FinishedFilter",
    "FinishedPage",
    "finished_filter_of",
    "parse_finished_cursor",
]

Row = dict[str, Any]


def parse_finished_cursor(text: str) -> int:
    """The Finished view's ``?cursor=``: a job id."""
    job_id = parse_job_id(text)
    if job_id is None:
        raise BadInput(f"bad cursor {shown(text)}; showing the newest finished jobs")
    return job_id


@dataclass(frozen=True)
class FinishedFilter:
    """The Finished view's filters and cursor (from the query string)."""

    task: str | None = None
    state: str | None = None
    #: Finished strictly after / before these times.
    after: datetime | None = None
    before: datetime | None = None
    #: The last job of the previous page: this page shows the ones before it.
    cursor: int | None = None

    @property
    def filtered(self) -> bool:
        return bool(self.task or self.state or self.after or self.before)

    def query(self, **changes: Any) -> dict[str, str]:
        """The query string of this filter (with ``changes``), without empty values."""
        values = {
            "task": self.task,
            "state": self.state,
            "after": datetime_input(self.after),
            "before": datetime_input(self.before),
            "cursor": self.cursor,
            **changes,
        }
        return {name: str(value) for name, value in values.items() if value not in (None, "")}


@dataclass
class FinishedPage:
    """One page of the Finished view."""

    filter: FinishedFilter
    rows: list[Row]
    #: History rows the window examined below the cursor.
    examined: int
    #: The cursor of the next page (older jobs), or None at the oldest.
    next_cursor: int | None
    #: True when the window ran out before the page was full: the next page
    #: searches older jobs (a rare filter on a long history).
    window_ran_out: bool
    #: The newest job of the whole history (None: it is empty).
    latest: Row | None


def finished_filter_of(params: Any) -> tuple[FinishedFilter, list[str]]:
    """The Finished view's filter from a query string (``request.query_params``),
    and what was wrong with it (each wrong value left out: the page shows the
    rest, with a 400)."""
    problems = []
    task = None
    try:
        task = checked_text(params.get("task") or "", "task") or None
    except BadInput as exc:
        problems.append(f"{exc}; showing every task")
    state = params.get("state") or None
    if state is not None and state not in FINISHED_STATES:
        problems.append(f"unknown state {shown(state)}; showing every state")
        state = None
    times: dict[str, datetime | None] = {}
    for name in ("after", "before"):
        times[name] = None
        if params.get(name):
            try:
                times[name] = parse_time(params[name], f"finished {name}")
            except BadInput as exc:
                problems.append(f"{exc}; not filtering by it")
    cursor = None
    if params.get("cursor"):
        try:
            cursor = parse_finished_cursor(params["cursor"])
        except BadInput as exc:
            problems.append(str(exc))
    return FinishedFilter(task, state, times["after"], times["before"], cursor), problems
