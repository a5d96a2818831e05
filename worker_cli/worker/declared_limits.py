"""The limits a pool's tasks declare (``@task_options(limit=...)``), written
to the database as the pool starts: the database is the single source of
truth, so a declared limit replaces a stored one that differs (the last
writer wins, and says so in a warning), and a task that declares none keeps
what is stored (set through the utilities, the CLI or the dashboard)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from ..client.worker_utils import WorkerUtils
from ..tasks.loader import Task

__all__ = ["declare_limits"]

logger = logging.getLogger("graphile_worker")


async def declare_limits(utils: WorkerUtils, tasks: Mapping[str, Task]) -> None:
    """Store each task's declared limit where the database holds another."""
    declared = {name: task.options.limit for name, task in tasks.items() if task.options.limit}
    if not declared:
        return
    stored = {(info.kind, info.name): info.limit for info in await utils.list_limits()}
    for name, limit in declared.items():
        old = stored.get(("task", name))
        if old == limit:
            continue
        if old is None:
            logger.info(
                "Task %s declares %s; the database had no limit for it, so it is set "
                "(`graphile-worker limit --remove` lasts until the next start)",
                name,
                limit,
            )
        else:
            logger.warning(
                "Task %s declares %s; it replaces the limit stored in the database, %s "
                "(the last writer wins)",
                name,
                limit,
                old,
            )
        await utils.set_limit(limit, task=name)
