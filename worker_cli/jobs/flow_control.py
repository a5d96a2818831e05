"""The flow-control methods of the utilities: pauses and limits.

:class:`AsyncFlowControl` (a base of
:class:`~worker_cli.jobs.worker_utils.WorkerUtils`) and
:class:`SyncFlowControl` (of
:class:`~worker_cli.jobs.sync_worker_utils.SyncWorkerUtils`) hold them, name
for name; each builds its plan with :class:`~.utils_plans.UtilsPlans` and
runs it with the host's ``_run`` (:mod:`.plan_host`).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from .limits import Limit, LimitInfo
from .pauses import Pause
from .plan_host import AsyncPlanHost, SyncPlanHost

__all__ = ["AsyncFlowControl", "SyncFlowControl"]


class AsyncFlowControl(AsyncPlanHost):
    """Pauses and limits, for :class:`~worker_cli.jobs.worker_utils.WorkerUtils`."""

    async def pause(
        self,
        *,
        queue: str | None = None,
        task: str | None = None,
        until: datetime | timedelta | float | None = None,
        reason: str | None = None,
        hold_queue_lock: bool = False,
    ) -> Pause:
        """Pause a named queue or a task identifier (``*``: every queue, or
        every task) across every Python worker: their jobs do not start until
        :meth:`resume`, or ``until`` (an aware datetime, or how long: a
        timedelta or seconds). Running jobs finish; jobs can still be added.
        ``hold_queue_lock`` keeps Node workers off the queue too (README,
        "Pause and resume"). Pausing again replaces ``until``, ``reason`` and
        the hold. Returns the pause."""
        return await self._run(self._plans.pause(queue, task, until, reason, hold_queue_lock))

    async def resume(self, *, queue: str | None = None, task: str | None = None) -> bool:
        """End a pause (see :meth:`pause`); whether there was one."""
        return await self._run(self._plans.resume(queue, task))

    async def list_pauses(self) -> list[Pause]:
        """The pauses in force, by kind and name."""
        return await self._run(self._plans.list_pauses())

    async def set_limit(
        self,
        limit: Limit,
        *,
        queue: str | None = None,
        task: str | None = None,
        operation: str | None = None,
    ) -> LimitInfo:
        """Limit a task, a named queue, or an operation tasks do in their body
        (``helpers.limit``), across every Python worker (README, "Concurrency
        and rate limits"): ``Limit(max_running=..., max_starts=..., per=...,
        partition_by=...)``; replaces its limit if it had one, live. Returns
        the limit as stored, with its use."""
        return await self._run(self._plans.set_limit(limit, queue, task, operation))

    async def remove_limit(
        self, *, queue: str | None = None, task: str | None = None, operation: str | None = None
    ) -> bool:
        """Remove a task's, a queue's or an operation's limit; whether it had one."""
        return await self._run(self._plans.remove_limit(queue, task, operation))

    async def list_limits(self) -> list[LimitInfo]:
        """Every limit, with how much of it is in use now."""
        return await self._run(self._plans.list_limits())


class SyncFlowControl(SyncPlanHost):
    """Pauses and limits, for :class:`~worker_cli.jobs.sync_worker_utils.SyncWorkerUtils`."""

    def pause(
        self,
        *,
        queue: str | None = None,
        task: str | None = None,
        until: datetime | timedelta | float | None = None,
        reason: str | None = None,
        hold_queue_lock: bool = False,
    ) -> Pause:
        """Pause a named queue or a task identifier (``*``: every queue, or
        every task) across every Python worker: their jobs do not start until
        :meth:`resume`, or ``until`` (an aware datetime, or how long: a
        timedelta or seconds). Running jobs finish; jobs can still be added.
        ``hold_queue_lock`` keeps Node workers off the queue too (README,
        "Pause and resume"). Pausing again replaces ``until``, ``reason`` and
        the hold. Returns the pause."""
        return self._run(self._plans.pause(queue, task, until, reason, hold_queue_lock))

    def resume(self, *, queue: str | None = None, task: str | None = None) -> bool:
        """End a pause (see :meth:`pause`); whether there was one."""
        return self._run(self._plans.resume(queue, task))

    def list_pauses(self) -> list[Pause]:
        """The pauses in force, by kind and name."""
        return self._run(self._plans.list_pauses())

    def set_limit(
        self,
        limit: Limit,
        *,
        queue: str | None = None,
        task: str | None = None,
        operation: str | None = None,
    ) -> LimitInfo:
        """Limit a task, a named queue, or an operation tasks do in their body
        (``helpers.limit``), across every Python worker (README, "Concurrency
        and rate limits"): ``Limit(max_running=..., max_starts=..., per=...,
        partition_by=...)``; replaces its limit if it had one, live. Returns
        the limit as stored, with its use."""
        return self._run(self._plans.set_limit(limit, queue, task, operation))

    def remove_limit(
        self, *, queue: str | None = None, task: str | None = None, operation: str | None = None
    ) -> bool:
        """Remove a task's, a queue's or an operation's limit; whether it had one."""
        return self._run(self._plans.remove_limit(queue, task, operation))

    def list_limits(self) -> list[LimitInfo]:
        """Every limit, with how much of it is in use now."""
        return self._run(self._plans.list_limits())
