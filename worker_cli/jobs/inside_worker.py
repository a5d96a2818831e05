"""Whether the caller runs inside a job of this process's worker.

The worker's slots run ``async def`` jobs in asyncio tasks named
``SLOT_TASK_PREFIX-<worker id>`` and plain ``def`` jobs in threads named
``TASK_THREAD_PREFIX-<worker id>`` (:mod:`worker_cli.worker.pipeline.slots`,
:mod:`worker_cli.worker.pipeline.task_threads`). The names are given once, when a slot
or its thread starts, so telling costs nothing per job; they are defined here,
below the worker, so that the utilities can tell without importing it.

A job's own sub-tasks and threads carry other names: they are not recognised.
"""

from __future__ import annotations

import asyncio
import threading

__all__ = ["SLOT_TASK_PREFIX", "TASK_THREAD_PREFIX", "in_worker_task"]

#: Name prefix of the threads that run plain (``def``) tasks.
TASK_THREAD_PREFIX = "graphile-worker-task"
#: Name prefix of the slots' asyncio tasks, which run ``async def`` tasks inline.
SLOT_TASK_PREFIX = "graphile-worker-slot"


def in_worker_task() -> bool:
    """The caller runs in a job of a worker pool of this process: in a slot's
    asyncio task (or in sync code it calls), or in a slot's task thread."""
    if threading.current_thread().name.startswith(TASK_THREAD_PREFIX):
        return True
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no event loop runs in this thread
        return False
    return task is not None and task.get_name().startswith(SLOT_TASK_PREFIX)
