"""The worker's processes: where the jobs of ``process=True`` tasks run, so
that CPU-bound plain ``def`` tasks use every core.

:class:`ProcessPool` is their one owner: it starts them (the "spawn"
method: fresh interpreters, see :mod:`.process_child`), hands each job to an
idle one, watches them, replaces one that ends, and stops them all. A task
loaded with ``process=True`` is an ``async def`` for the slots
(:class:`~worker_cli.tasks.loader.Task`): its slot awaits the pool (the
pool is ``helpers.processes``), so a process job is a job like any other for
limits, the local queue, the completer and the outcome rules.

- Its result and its error come back pickled; the error keeps its type (a
  ``Snooze``, a ``Cancel`` work as in a thread), with the child's traceback
  as its cause (:class:`ProcessTraceback`).
- A child that dies while running a job (``os._exit``, a signal, a crash)
  fails that attempt alone with :class:`ProcessDied` (its exit code or
  signal); another process replaces it.
- A timeout, a cancel request, the graceful stop giving a job back and a
  forced stop all cancel the slot awaiting the job (as for any ``async def``
  job): its child is killed (SIGKILL), and replaced.
- :meth:`ProcessPool.close`, once the slots are done: each idle child is told
  to exit; one still there after ``within`` seconds is killed.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import multiprocessing
import os
import pickle
import signal
import threading
from collections import deque
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from typing import Any

from ...errors import ProcessDied
from ...jobs.last_error import describe
from ...tasks.helpers import Helpers
from ...tasks.loader import Task, TaskLocation
from .process_child import child_main

__all__ = ["ProcessPool", "ProcessTraceback", "default_size"]

logger = logging.getLogger("graphile_worker")

#: Processes in a row that end as they start before the jobs waiting for one fail.
_FAILED_STARTS = 3

#: The start method: a fresh interpreter, with none of the worker's state.
_CONTEXT = multiprocessing.get_context("spawn")


def default_size(processes: int | None, concurrency: int) -> int:
    """How many processes a worker runs: ``--processes`` (default: one per
    CPU), never more than its slots (``-j``), which is as many as may be busy."""
    return max(1, min(processes or os.cpu_count() or 1, concurrency))


class ProcessTraceback(Exception):
    """The traceback of a task's error in its worker process (its cause)."""


class _Child:
    """One child process, its pipe and the thread that reads it."""

    def __init__(self, pool: ProcessPool) -> None:
        self._pool = pool
        parent, child = _CONTEXT.Pipe(duplex=True)
        self.conn: Connection = parent
        self.process = _CONTEXT.Process(
            target=child_main, args=(child,), name="graphile-worker-process", daemon=False
        )
        self.process.start()
        child.close()
        self.pid = self.process.pid
        #: The job running here: its future (the ``done`` message) and helpers.
        self.future: asyncio.Future[tuple[Any, ...]] | None = None
        self.helpers: Helpers | None = None
        #: Killed by the pool (a timeout, a cancel, a stop): no job fails for it.
        self.killed = False
        #: It has started (imported the worker's code): it may take a job.
        self.ready = False
        self.ran = 0
        self.exited = asyncio.get_running_loop().create_future()
        threading.Thread(
            target=self._read, name=f"graphile-worker-process-{self.pid}", daemon=True
        ).start()

    def _read(self) -> None:
        """The reader thread: each message to the loop, then the exit code."""
        loop = self._pool.loop
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                break
            except BaseException as exc:  # a message it cannot read: the child is useless
                message = ("broken", describe(exc))
            try:
                loop.call_soon_threadsafe(self._pool.received, self, message)
            except RuntimeError:  # the loop is closed
                return
            if message[0] == "broken":
                self.process.kill()
                break
        self.process.join()
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._pool.ended, self, self.process.exitcode)

    def kill(self) -> None:
        """End it now (SIGKILL): a job it runs is not failed for it."""
        self.killed = True
        self.process.kill()

    def died(self, code: int | None) -> ProcessDied:
        """The error of the job it was running when it ended with ``code``."""
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            how = f"was killed by {name} (signal {-code})"
        else:
            how = f"exited with code {code}"
        return ProcessDied(f"the worker process (pid {self.pid}) running the job {how}")


class ProcessPool:
    """The worker's processes for ``process=True`` tasks (see the module)."""

    def __init__(
        self, size: int, tasks: Mapping[str, Task], stopping: Callable[[], bool] = lambda: False
    ) -> None:
        self.size = size
        #: The worker is stopping: a process that ends is replaced only for a
        #: job that waits for one (a replacement still starting as the stop
        #: ends would be killed).
        self._stopping = stopping
        self.loop = asyncio.get_running_loop()
        #: Where each process task is loaded from, and its source (for errors).
        self._located: dict[str, tuple[TaskLocation, str]] = {
            name: (task.location, task.source)
            for name, task in tasks.items()
            if task.location is not None
        }
        self._children: set[_Child] = set()
        self._idle: deque[_Child] = deque()
        self._waiters: deque[asyncio.Future[_Child]] = deque()
        self._closing = False
        #: Processes in a row that ended before they were ready.
        self._failed_starts = 0
        #: Whether every process has been ready once (logged then).
        self._all_ready = False

    @classmethod
    def of(
        cls, tasks: Mapping[str, Task], size: int, stopping: Callable[[], bool] = lambda: False
    ) -> ProcessPool | None:
        """The pool for ``tasks`` if any is a process task (None: none is)."""
        if not any(task.location is not None for task in tasks.values()):
            return None
        return cls(size, tasks, stopping)

    @property
    def pids(self) -> list[int]:
        """The children's process ids."""
        return sorted(child.pid for child in self._children if child.pid is not None)

    def start(self) -> None:
        """Start every process (each takes jobs once it has started)."""
        # Should close() never come (the worker's code failed around it), they
        # are killed as the interpreter exits: it would otherwise wait for them
        # (multiprocessing joins its processes then), and they for it.
        atexit.register(self._kill_all)
        for _ in range(self.size):
            self._spawn()

    def _kill_all(self) -> None:
        for child in list(self._children):
            child.kill()

    def _spawn(self) -> _Child:
        child = _Child(self)
        self._children.add(child)
        return child

    async def __call__(self, identifier: str, payload: Any, helpers: Helpers) -> Any:
        """Run the job of ``helpers`` in a process: what its task returned (or
        raise what it raised). Cancelled: its process is killed."""
        return await self.run(identifier, payload, helpers)

    async def run(
        self,
        identifier: str,
        payload: Any,
        helpers: Helpers,
        *,
        started: Callable[[], None] | None = None,
    ) -> Any:
        """:meth:`__call__`; ``started`` is called once a process has the job
        (its timeout counts from there: not while it waits for a process)."""
        location, source = self._located[identifier]
        message = ("run", identifier, location, source, helpers.job, helpers.worker_id)
        while True:
            child = await self._take()
            try:
                child.conn.send(message)
                break
            except OSError:  # it has just ended (ended() replaces it): another one
                continue
        if started is not None:
            started()
        future: asyncio.Future[tuple[Any, ...]] = self.loop.create_future()
        child.future, child.helpers = future, helpers
        try:
            answer = await future
        except asyncio.CancelledError:
            child.kill()  # replaced once it has ended (ended())
            raise
        finally:
            child.future = child.helpers = None
            child.ran += 1
            if not child.killed and child.process.exitcode is None and child in self._children:
                self._give_back(child)
        return _outcome(answer, child.pid)

    async def _take(self) -> _Child:
        """An idle child (a new one while there are fewer than ``size``)."""
        while True:
            while self._idle:
                child = self._idle.popleft()
                if child in self._children and not child.killed:
                    return child
            if len(self._children) < self.size and not self._closing:
                self._spawn()  # given to a waiter once it has started
            waiter: asyncio.Future[_Child] = self.loop.create_future()
            self._waiters.append(waiter)
            try:
                return await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._give_back(waiter.result())
                raise

    def _give_back(self, child: _Child) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(child)
                return
        self._idle.append(child)

    def received(self, child: _Child, message: tuple[Any, ...]) -> None:
        """On the loop: a message of ``child`` (its job's log, progress, end)."""
        kind = message[0]
        helpers, future = child.helpers, child.future
        if kind == "ready":
            child.ready = True
            self._failed_starts = 0
            if not self._all_ready and sum(c.ready for c in self._children) == self.size:
                self._all_ready = True
                logger.info(
                    "%d worker process(es) ready for process=True tasks (pids %s)",
                    self.size,
                    ", ".join(map(str, self.pids)),
                )
            if child in self._children and not child.killed:
                self._give_back(child)
        elif kind == "done":
            if future is not None and not future.done():
                future.set_result(message)
        elif helpers is None:
            return
        elif kind == "log":
            try:
                helpers.logger.log(message[1], message[2])
            except Exception:  # a logging filter or handler that raises: the line is lost
                logger.exception("A job's log line from its worker process could not be logged")
        elif kind == "progress":
            with contextlib.suppress(ValueError):  # checked in the child already
                helpers.progress(message[1], message[2], message[3])
        elif kind == "broken" and future is not None and not future.done():
            future.set_result(("done", False, None, f"ProcessDied: {message[1]}", ""))

    def ended(self, child: _Child, code: int | None) -> None:
        """On the loop: ``child`` has ended. Its job (if any) fails, and it is
        replaced (now if it ran or was killed; else at the next job)."""
        self._children.discard(child)
        if not child.exited.done():
            child.exited.set_result(code)
        future = child.future
        if future is not None and not future.done():
            error = child.died(code)
            future.set_result(("done", False, None, describe(error), ""))
        if not child.killed and future is None and not self._closing:
            logger.warning("Worker process %s exited with code %s while idle", child.pid, code)
        if self._closing:
            return
        if not child.ready and not child.killed:
            # Its traceback is in the worker's log (the processes share its stderr).
            self._failed_starts += 1
            logger.error("A worker process ended with code %s as it started", code)
            if self._failed_starts >= _FAILED_STARTS:  # the jobs waiting fail, not wait for ever
                while self._waiters:
                    waiter = self._waiters.popleft()
                    if not waiter.done():
                        waiter.set_exception(
                            ProcessDied(
                                f"the worker's processes end as they start (exit code {code}; "
                                "their error is in the worker's log). A script that starts "
                                "the worker must do it under if __name__ == '__main__':"
                            )
                        )
                return
        if self._stopping() and not self._waiters:
            return
        if child.killed or child.ran or future is not None or self._waiters:
            self._spawn()

    async def close(self, within: float) -> None:
        """Stop the processes: an idle one is told to exit; one still running
        ``within`` seconds later is killed. Waits for all to end."""
        self._closing = True
        children = list(self._children)
        for child in children:
            if child.future is None:
                with contextlib.suppress(OSError):
                    child.conn.send(None)
        exits = [child.exited for child in children]
        if exits:
            _, pending = await asyncio.wait(exits, timeout=within)
            if pending:
                logger.warning(
                    "%d worker process(es) did not exit within %.0fs of the stop; killed",
                    len(pending),
                    within,
                )
                for child in children:
                    if not child.exited.done():
                        child.kill()
                await asyncio.wait(exits, timeout=5.0)
        for child in children:
            child.conn.close()
        atexit.unregister(self._kill_all)


def _outcome(answer: tuple[Any, ...], pid: int | None) -> Any:
    """What a job's ``done`` message says: its result, or its error raised."""
    if answer[1]:
        try:
            return pickle.loads(answer[2])
        except BaseException as exc:
            raise TypeError(
                f"the task's return value could not be read from its worker process: "
                f"{describe(exc)}"
            ) from None
    _, _, blob, text, trace = answer
    error: BaseException | None = None
    if blob is not None:
        try:
            error = pickle.loads(blob)
        except BaseException:
            error = None
    if not isinstance(error, BaseException):
        if text.startswith("ProcessDied: "):
            error = ProcessDied(text.removeprefix("ProcessDied: "))
        else:
            error = ProcessDied(text) if not trace else RuntimeError(text)
    if trace:
        error.__cause__ = ProcessTraceback(f"in the worker process (pid {pid}):\n{trace}")
    raise error
