"""The worker: one :class:`WorkerPool` per process runs jobs as a pipeline.

1. The **fetcher** (``pipeline/fetcher.py``) locks batches of runnable jobs
   with one autocommit statement, so no job starts before its lock is
   committed, and puts them in
2. the **local queue** (``pipeline/local_queue.py``), highest priority first,
   holding about 200 ms of work ahead at the rate jobs finish;
3. N **slots** (``pipeline/slots.py``) take jobs from it and run their tasks
   (``async def`` inline; plain ``def`` in the slot's thread,
   ``pipeline/task_threads.py``, which goes on with the plain jobs after it),
   settle each outcome inside the per-job boundary (``pipeline/outcome.py``),
   wake the fetcher when the queue runs short, and hand each outcome to
4. the **completer** (``pipeline/completer.py``), which writes results back
   in batches (group commit) and tells the fetcher when they are written.

``supervision/`` watches the running jobs (deadlines, cancel requests, stuck
jobs, a blocked event loop). ``background/`` holds the loops beside the
pipeline: the listener (LISTEN for new jobs), the poller and the sweeper, the
pruner, the pause watch, the heartbeat (its own thread), the lock refresh and
cron. ``pool.py`` wires them, and starts and stops them in order
(``stopping.py``: bounded waits of a forced stop); ``declared_limits.py``
writes the limits the tasks declare as the pool starts.
"""

from __future__ import annotations

from .pipeline.slots import TASK_THREAD_PREFIX, busy_task_threads
from .pool import WorkerPool

__all__ = ["TASK_THREAD_PREFIX", "WorkerPool", "busy_task_threads"]
