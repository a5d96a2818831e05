"""The limits a pool's tasks declare (``@task_options(limit=...)``), applied
to the database as the pool starts, when they are new or changed.

The database is the single source of truth, and an operator's word on a
limit (the CLI, the dashboard, the utilities) stands until the code's changes:
each declaration applied is recorded (``_private_py_declared_limits``,
migrations/py/000024.sql), and a pool applies a declaration only when it
differs from the one recorded for its task (a new or changed declaration),
replacing whatever the database holds. A declaration already recorded leaves
the stored limit as it is: removed, changed or untouched since. A task that
no longer declares a limit keeps what is stored, and its record goes, so
that a later declaration applies again. On a schema before that revision,
every declaration that differs from the stored limit is applied, at each
start."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from psycopg.types.json import Jsonb

from ..client.worker_utils import WorkerUtils
from ..jobs.limit_spec import Limit
from ..sql import compose
from ..sql import limits as limits_sql
from ..tasks.loader import Task

__all__ = ["declaration_of", "declare_limits", "recorded_declaration"]

logger = logging.getLogger("graphile_worker")


def declaration_of(limit: Limit) -> dict[str, Any]:
    """A limit as its declaration is recorded (JSON: the window in seconds)."""
    per = limit.per
    return {
        "max_running": limit.max_running,
        "max_starts": limit.max_starts,
        "per_seconds": per.total_seconds() if isinstance(per, timedelta) else per,
        "partition_by": limit.partition_by,
    }


async def _recorded(utils: WorkerUtils, tasks: list[str]) -> dict[str, Any] | None:
    """The declarations recorded for ``tasks``; None on a schema without the table."""
    async with utils.connection() as conn:
        cur = await conn.execute(
            compose(limits_sql.DECLARED_LIMITS_INSTALLED, utils.schema), {"schema": utils.schema}
        )
        installed = await cur.fetchone()
        if not (installed and installed[0]):
            return None
        cur = await conn.execute(
            compose(limits_sql.DECLARED_LIMITS, utils.schema), {"tasks": tasks}
        )
        return {str(task): declaration for task, declaration in await cur.fetchall()}


async def recorded_declaration(utils: WorkerUtils, task: str) -> dict[str, Any] | None:
    """The limit declaration recorded for ``task`` (see :func:`declaration_of`),
    if a pool applied one that it still declares."""
    recorded = await _recorded(utils, [task])
    return None if recorded is None else recorded.get(task)


async def declare_limits(utils: WorkerUtils, tasks: Mapping[str, Task]) -> None:
    """Apply each task's declared limit that is new or changed; forget the
    declarations of the tasks that declare none."""
    declared = {name: task.options.limit for name, task in tasks.items() if task.options.limit}
    recorded = await _recorded(utils, list(tasks))
    if recorded is not None:
        gone = [name for name in recorded if name not in declared]
        if gone:
            async with utils.connection() as conn:
                await conn.execute(
                    compose(limits_sql.FORGET_DECLARED_LIMITS, utils.schema), {"tasks": gone}
                )
    if not declared:
        return
    stored = {(info.kind, info.name): info.limit for info in await utils.list_limits()}
    for name, limit in declared.items():
        old = stored.get(("task", name))
        declaration = declaration_of(limit)
        if recorded is not None and recorded.get(name) == declaration:
            # Applied before: what the database holds now stands (an
            # operator's change or removal included).
            logger.debug(
                "Task %s declares %s, as when it was applied; the stored limit stands: %s",
                name,
                limit,
                old or "none",
            )
            continue
        if old is None:
            logger.info(
                "Task %s declares %s; the database had no limit for it, so it is set%s",
                name,
                limit,
                " (a later change or removal stands until the declaration changes)"
                if recorded is not None
                else "",
            )
        elif old != limit:
            logger.warning(
                "Task %s declares %s, %s; it replaces the limit stored in the database, %s",
                name,
                limit,
                "a new or changed declaration" if recorded is not None else "at every start",
                old,
            )
        if old != limit:
            await utils.set_limit(limit, task=name)
        if recorded is not None:
            async with utils.connection() as conn:
                await conn.execute(
                    compose(limits_sql.RECORD_DECLARED_LIMIT, utils.schema),
                    {"task": name, "declaration": Jsonb(declaration)},
                )
