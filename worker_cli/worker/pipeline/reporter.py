"""The reporter: what happens to each settled outcome a slot or a task thread brings.

A success goes to the completer (with its result, when kept), then to the
success line and the ``job:success`` event; a failure goes to the completer,
the failure line and the ``job:error`` (and ``job:failed``) events. The
outcome is handed to the completer first: what raises after that (a user's
logging filter, say) is logged, and an outcome is never lost. A job whose
cancel request this pool knows of is logged as cancelled (the failure
statement records it so). Everything that runs a job's own code on the way
(its result's encoding, its retry policy, ...) was done before, by
:class:`~.outcome.Settler`.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from ...jobs.workflow import is_step
from ...observe import log_output as logs
from ...observe.events import Events
from ..supervision.stuck import StuckJobs
from .completer import Completer
from .outcome import Failure, Ran

__all__ = ["Reporter"]

logger = logging.getLogger("graphile_worker")


class Reporter:
    """Hands one pool's outcomes on (see the module's docstring)."""

    def __init__(
        self,
        completer: Completer,
        *,
        pool_id: str,
        log_success: bool,
        events: Events,
        cancelling: Collection[int],
        stuck: StuckJobs,
    ) -> None:
        self._completer = completer
        self._pool_id = pool_id
        self._log_success = log_success
        self._events = events
        #: Ids of the jobs with a cancel request this pool knows of.
        self._cancelling = cancelling
        #: The pool's stuck jobs: one that reaches an outcome is no longer.
        self._stuck = stuck
        #: Jobs run to an outcome (success or failure).
        self.done = 0

    def report(self, outcome: Ran | Failure) -> None:
        """Hand a settled outcome on, then log and emit it. Never raises."""
        self.done += 1
        job, worker_id = outcome.job, outcome.worker_id
        if self._stuck:
            self._stuck.ended(job.id)
        if isinstance(outcome, Failure):
            self._report_failure(outcome)
            return
        if outcome.result is not None or outcome.result_error is not None:
            self._completer.writer.keep_result(
                job.id, outcome.result, outcome.result_error, step=is_step(job.flags)
            )
        if outcome.logs is not None:
            self._completer.writer.keep_logs(job, outcome.logs)
        if outcome.timed_out is not None:  # it returned after its timeout
            self._completer.writer.record_timed_out(job.id)
        self._completer.succeeded(job, worker_id)
        try:
            if outcome.result_error is not None:
                logger.warning(
                    "Job %d (%s) succeeded, but its result is not kept: %s",
                    job.id,
                    job.task_identifier,
                    outcome.result_error,
                )
            if self._log_success:
                logs.job_succeeded(job, worker_id, self._pool_id, outcome.duration_ms)
            if self._events.wants("job:success"):
                self._events.emit(
                    "job:success", worker_id=worker_id, job=job, duration_ms=outcome.duration_ms
                )
        except BaseException:  # a user's logging code: the outcome is handed on already
            logs.outcome_not_logged(job.id)

    def _report_failure(self, failure: Failure) -> None:
        job, worker_id, error = failure.job, failure.worker_id, failure.error
        cancelled = bool(self._cancelling) and job.id in self._cancelling
        if cancelled:
            failure.permanent = True
        self._completer.failed(failure)
        try:
            if failure.snooze is not None and not cancelled:
                logger.info(
                    "Job %d (%s) snoozed for %gs: it runs again then, with no attempt spent",
                    job.id,
                    job.task_identifier,
                    failure.snooze,
                )
                return
            logs.job_failed(
                job,
                worker_id,
                self._pool_id,
                failure.duration_ms,
                failure.message,
                error,
                cancelled=cancelled or failure.cancel_reason is not None,
                timed_out=failure.on_timeout,
                for_good=failure.permanent,
                delay=failure.delay,
            )
            self._events.emit(
                "job:error",
                worker_id=worker_id,
                job=job,
                error=error,
                duration_ms=failure.duration_ms,
            )
            if failure.permanent:
                self._events.emit("job:failed", worker_id=worker_id, job=job, error=error)
        except BaseException:  # as above
            logs.outcome_not_logged(job.id)
