"""The loop watch: names the job whose ``async def`` task blocks the event loop.

Every job of a pool shares one event loop: an ``async def`` task that blocks
it (``time.sleep``, a blocking HTTP call, a long computation) stalls every
other job, the fetcher and the result writer, with nothing in the log. The
watch is a small thread: the loop marks each turn of a timer, and when no
mark has come for :data:`BLOCKED_AFTER` seconds the thread logs one warning
naming the job whose task is running on the loop (or, if none is, the line
the loop is stuck at), as asyncio's debug mode does for slow callbacks.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Callable

from ...jobs.job import Job

__all__ = ["BLOCKED_AFTER", "LoopWatch"]

logger = logging.getLogger("graphile_worker")

#: Seconds without a turn of the loop after which the watch warns.
BLOCKED_AFTER = 1.0
#: How often the loop marks a turn, and the thread looks (seconds).
_EVERY = BLOCKED_AFTER / 4


class LoopWatch:
    """Warns once per stall of ``loop`` longer than :data:`BLOCKED_AFTER`;
    ``job_of`` says which job (if any) an asyncio task is running."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        job_of: Callable[[asyncio.Task[object] | None], Job | None],
    ) -> None:
        self._loop = loop
        self._job_of = job_of
        self._loop_thread = threading.get_ident()
        self._turn = time.monotonic()
        self._warned = False
        self._stopped = threading.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Begin watching (on the loop's thread)."""
        self._mark()
        self._thread = threading.Thread(
            target=self._watch, name="graphile-worker-loop-watch", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (on the loop's thread); the thread ends within a look."""
        self._stopped.set()
        if self._timer is not None:
            self._timer.cancel()

    def _mark(self) -> None:
        self._turn = time.monotonic()
        self._warned = False
        if not self._stopped.is_set():
            self._timer = self._loop.call_later(_EVERY, self._mark)

    def _watch(self) -> None:
        while not self._stopped.wait(_EVERY):
            blocked = time.monotonic() - self._turn
            if blocked >= BLOCKED_AFTER and not self._warned:
                self._warned = True
                self._warn(blocked)

    def _warn(self, blocked: float) -> None:
        task = asyncio.current_task(self._loop)
        job = self._job_of(task) if task is not None else None
        if job is not None:
            logger.warning(
                "The event loop has been blocked for %.1fs by job %d (%s, an async def task): "
                "every other job of this worker waits meanwhile; make a task that blocks a "
                "plain def (run in a thread), or await asyncio.to_thread(...) for the "
                "blocking part",
                blocked,
                job.id,
                job.task_identifier,
            )
            return
        logger.warning(
            "The event loop has been blocked for %.1fs, at %s: every job of this worker "
            "waits meanwhile",
            blocked,
            self._where(),
        )

    def _where(self) -> str:
        frame = sys._current_frames().get(self._loop_thread)
        if frame is None:
            return "an unknown place"
        code = frame.f_code
        return f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"
