"""The banner an action's redirect shows: what the action did, or that it was
refused and nothing changed.

Each notice is one of a fixed set of sentences (:data:`DONE`, :data:`REFUSED`),
filled with the job id, pool or finished state it is about (escaped like any
value). A refusal is shown as one: the page's banner gets the class
``notice-refused`` (``data-outcome="refused"``, ``role="alert"``), a success
``notice-done`` (``data-outcome="done"``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .queries import FINISHED_STATES

__all__ = ["DONE", "REFUSED", "Notice", "notice_of"]

#: What an action did.
DONE = {
    "run-now": "Job {job} will run now.",
    "reschedule": "Job {job} was rescheduled.",
    "fail": "Job {job} was permanently failed.",
    "delete": "Job {job} was deleted (completed).",
    "cancel": "Job {job} was cancelled: it will not run. The history records it as cancelled.",
    "cancel-running": (
        "Job {job} is running: its worker was asked to stop it, and it will not be retried. "
        "It is recorded as cancelled when it stops (as succeeded if its task returns normally)."
    ),
    "unlock": "Released the jobs and named queues that pool {pool} held.",
}

#: Why an action was refused: nothing was changed.
REFUSED = {
    "locked": (
        "Job {job} is locked by a worker that is running it: nothing was changed "
        "(the admin functions leave locked jobs alone until their lock is 4 hours old)."
    ),
    "gone": (
        "Job {job} is no longer in the jobs table (it finished, or was removed): "
        "nothing was changed."
    ),
    "finished": "Job {job} had already finished ({state}): nothing was changed.",
    "alive": "Pool {pool} has a live heartbeat: its jobs are running. Nothing was changed.",
}


@dataclass(frozen=True)
class Notice:
    """A banner: its sentence, and whether it reports a refusal."""

    text: str
    refused: bool

    @property
    def outcome(self) -> str:
        """``refused`` or ``done`` (the banner's ``data-outcome``)."""
        return "refused" if self.refused else "done"


def notice_of(kind: str, *, job: str = "", pool: str = "", state: str = "") -> Notice | None:
    """The notice ``kind`` names, filled in; None for a kind there is none of."""
    refused = kind in REFUSED
    template = REFUSED.get(kind) or DONE.get(kind)
    if template is None:
        return None
    state = state if state in (*FINISHED_STATES, "unknown") else "unknown"
    return Notice(template.format(job=job, pool=pool, state=state), refused)
