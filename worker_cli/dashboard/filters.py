"""The dashboard's bounds and state names: how many rows a window scan
examines at most, and the states the job list and the Finished view filter
by. Its statements, and the index each one reads, are in
:mod:`worker_cli.sql.dashboard`."""

from __future__ import annotations

from ..sql.admin import LIVE_STATES

__all__ = [
    "FINISHED_STATES",
    "JOB_STATES",
    "WINDOW",
]

#: Rows a window scan examines at most (newest jobs by id; named queues).
WINDOW = 10_000

#: The states a job in the jobs table can be in, as the state filter and the
#: counts name them: the words every command prints (py_job_state).
JOB_STATES: tuple[str, ...] = LIVE_STATES


#: The states of a finished job (the history's), as the Finished view's filter
#: and ``py_job_status`` name them.
FINISHED_STATES: tuple[str, ...] = ("succeeded", "cancelled", "failed", "removed")
