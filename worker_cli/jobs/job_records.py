"""The record-reading methods of the utilities: a job's state, its record,
and every attempt's error.

:class:`AsyncJobRecords` (a base of
:class:`~worker_cli.jobs.worker_utils.WorkerUtils`) and :class:`SyncJobRecords`
(of :class:`~worker_cli.jobs.sync_worker_utils.SyncWorkerUtils`) hold them,
name for name; each builds its plan with :class:`~.utils_plans.UtilsPlans`
and runs it with the host's ``_run`` (:mod:`.plan_host`).
Waiting for a job (``wait_for_job``) stays with the hosts: it needs their
listener.
"""

from __future__ import annotations

from .plan_host import AsyncPlanHost, SyncPlanHost
from .results import AttemptError, JobResult, JobState

__all__ = ["AsyncJobRecords", "SyncJobRecords"]


class AsyncJobRecords(AsyncPlanHost):
    """What is known of a job, for :class:`~worker_cli.jobs.worker_utils.WorkerUtils`."""

    async def get_job_status(self, job_id: int) -> JobState:
        """The state of a job (see :data:`~worker_cli.jobs.results.JobState`)."""
        return (await self._run(self._plans.job_result(job_id))).state

    async def get_job_result(self, job_id: int) -> JobResult:
        """What is known of a job: its state, times, last error and, once it has
        succeeded, its result (``.result``; see :class:`JobResult`)."""
        return await self._run(self._plans.job_result(job_id))

    async def get_job_errors(self, job_id: int) -> list[AttemptError]:
        """Every failed attempt of a job that a Python worker recorded (kept 7
        days), oldest first; empty for a job that never failed on one."""
        return await self._run(self._plans.job_errors(job_id))


class SyncJobRecords(SyncPlanHost):
    """What is known of a job, for
    :class:`~worker_cli.jobs.sync_worker_utils.SyncWorkerUtils`."""

    def get_job_status(self, job_id: int) -> JobState:
        """The state of a job (see :data:`~worker_cli.jobs.results.JobState`)."""
        return self._run(self._plans.job_result(job_id)).state

    def get_job_result(self, job_id: int) -> JobResult:
        """What is known of a job: its state, times, last error and, once it has
        succeeded, its result (``.result``; see :class:`JobResult`)."""
        return self._run(self._plans.job_result(job_id))

    def get_job_errors(self, job_id: int) -> list[AttemptError]:
        """Every failed attempt of a job that a Python worker recorded (kept 7
        days), oldest first; empty for a job that never failed on one."""
        return self._run(self._plans.job_errors(job_id))
