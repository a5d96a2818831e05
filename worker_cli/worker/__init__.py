"""The worker: one :class:`WorkerPool` per process runs jobs as a pipeline.

1. The **fetcher** (``fetcher.py``) locks batches of runnable jobs with one
   autocommit statement, so no job starts before its lock is committed, and
   puts them in
2. the **local queue** (``local_queue.py``), highest priority first, holding
   about 50 ms of work ahead at the rate jobs finish;
3. N **slots** (``slots.py``) take jobs from it and run their tasks (``async
   def`` inline; plain ``def`` in the slot's thread, ``task_threads.py``,
   which goes on with the plain jobs after it), waking the fetcher when the
   queue runs short, and hand each outcome to
4. the **completer** (``completer.py``), which writes results back in
   batches (group commit) and tells the fetcher when they are written.

Beside the pipeline: the **listener** (``listener.py``, LISTEN for new
jobs), the **poller** and the **sweeper** (``maintenance.py``), the
**heartbeat** (``heartbeat.py``, its own thread) and **cron** (``cron.py``).
``pool.py`` wires them, and starts and stops them in order
(``stopping.py``: bounded waits of a forced stop).
"""

from __future__ import annotations

from .pool import WorkerPool
from .slots import TASK_THREAD_PREFIX, busy_task_threads

__all__ = ["TASK_THREAD_PREFIX", "WorkerPool", "busy_task_threads"]
