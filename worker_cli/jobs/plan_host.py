"""What the utilities' method groups need of their host: its plans and the
way it runs one. :class:`AsyncPlanHost` and :class:`SyncPlanHost` are the
bases of those groups (:mod:`.flow_control`, :mod:`.job_records`);
:class:`~worker_cli.jobs.worker_utils.WorkerUtils` and
:class:`~worker_cli.jobs.sync_worker_utils.SyncWorkerUtils` provide both."""

from __future__ import annotations

from typing import TypeVar

from ..db.plan import Plan
from .utils_plans import UtilsPlans

__all__ = ["AsyncPlanHost", "SyncPlanHost"]

T = TypeVar("T")


class AsyncPlanHost:
    """A host that runs plans on asyncio (``WorkerUtils``)."""

    _plans: UtilsPlans

    async def _run(self, plan: Plan[T], *, autocommit: bool = False) -> T:
        raise NotImplementedError  # the host's


class SyncPlanHost:
    """A host that runs plans blocking (``SyncWorkerUtils``)."""

    _plans: UtilsPlans

    def _run(self, plan: Plan[T], *, autocommit: bool = False) -> T:
        raise NotImplementedError  # the host's
