"""The reporter: what happens to each outcome a slot or a task thread brings.

A success goes to the completer (with its result, when kept), then to the
success line and the ``job:success`` event; a failure goes to the completer,
the failure line and the ``job:error`` (and ``job:failed``) events. What
raises on the way (a user's logging filter, say) is logged: an outcome is
never lost. A job whose cancel request this pool knows of is logged as
cancelled (the failure statement records it so). A job that went past its
timeout is recorded so, and failed as its task's ``on_timeout`` says.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

from ..jobs.last_error import describe
from ..observe import logs
from ..observe.events import Events
from ..tasks.loader import Task
from ..tasks.retry import TaskSignal
from .completer import Completer
from .outcome import Failure, apply_task_rules
from .stuck import StuckJobs
from .task_threads import Ran

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
        tasks: Mapping[str, Task],
    ) -> None:
        #: The tasks' retry policies, by identifier (only those that have one).
        self._policies = {
            name: task.options.retry for name, task in tasks.items() if task.options.retry
        }
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

    def report(self, ran: Ran) -> None:
        """Hand an outcome on, then log and emit it."""
        self.done += 1
        job, worker_id, error = ran.job, ran.worker_id, ran.error
        if self._stuck:
            self._stuck.ended(job.id)
        try:
            if error is None:
                if ran.result is not None or ran.result_error is not None:
                    self._keep_result(ran)
                if ran.timed_out is not None:  # it returned after its timeout
                    self._completer.writer.record_timed_out(job.id)
                self._completer.succeeded(job, worker_id)
                if self._log_success:
                    logs.job_succeeded(job, worker_id, self._pool_id, ran.duration_ms)
                if self._events.wants("job:success"):
                    self._events.emit(
                        "job:success", worker_id=worker_id, job=job, duration_ms=ran.duration_ms
                    )
                return
            failure = Failure(job, worker_id, error, describe(error), ran.failed_items)
            if self._policies or isinstance(error, TaskSignal):
                apply_task_rules(failure, self._policies.get(job.task_identifier))
            cancelled = bool(self._cancelling) and job.id in self._cancelling
            if ran.timed_out is not None:
                failure.timed_out = True
                failure.permanent = failure.permanent or ran.timed_out != "retry"
                failure.cancel = ran.timed_out == "cancel" and not cancelled
            if cancelled:
                failure.permanent = True
            self._completer.failed(failure)
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
                ran.duration_ms,
                failure.message,
                error,
                cancelled=cancelled or failure.cancel_reason is not None,
                timed_out=ran.timed_out,
                for_good=failure.permanent,
                delay=failure.delay,
            )
            self._events.emit(
                "job:error", worker_id=worker_id, job=job, error=error, duration_ms=ran.duration_ms
            )
            if failure.permanent:
                self._events.emit("job:failed", worker_id=worker_id, job=job, error=error)
        except Exception:
            logger.exception("Job %d: its outcome could not be logged", job.id)

    def _keep_result(self, ran: Ran) -> None:
        """Hand a success's result to the completer; say why one is not kept."""
        job = ran.job
        self._completer.writer.keep_result(job.id, ran.result, ran.result_error)
        if ran.result_error is not None:
            logger.warning(
                "Job %d (%s) succeeded, but its result is not kept: %s",
                job.id,
                job.task_identifier,
                ran.result_error,
            )
