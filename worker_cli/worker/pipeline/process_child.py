"""A worker's child process: it runs the jobs of ``process=True`` tasks one at
a time (:mod:`.process_pool` starts and owns it).

It is started with the "spawn" method: a fresh interpreter, with none of the
worker's event loop, threads or connections. It says ``("ready",)``, then
reads ``("run", identifier, location, source, job, worker_id)`` messages from
its pipe (``None``: exit), loads the task from its file or module the first
time (as the task loader does), calls it, and answers with ``("log", level,
text)`` and ``("progress", done, total, message)`` while it runs, then
``("done", True, result)`` or ``("done", False, error, text, traceback)``.
The result and the error are pickled here, into bytes: one the worker cannot
read fails that job alone.

It ignores SIGINT and SIGTERM (a Ctrl-C reaches the whole process group: the
worker decides what its jobs become) and exits when its pipe closes or says
so. On Linux it is killed as soon as the worker dies (``PR_SET_PDEATHSIG``):
a task in an endless loop never outlives a killed worker.
"""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import inspect
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from ...errors import HelperUnavailable
from ...jobs.job import Job
from ...jobs.last_error import describe
from ...tasks.helpers import check_progress
from ...tasks.loader import TaskFunction, TaskLocation, load_located

__all__ = ["AVAILABLE", "ChildHelpers", "child_main"]

#: What a task run in a process has of its helpers.
AVAILABLE = (
    "job",
    "logger",
    "progress",
    "worker_id",
    "cancelled",
    "timed_out",
    "cancel_reason",
    "raise_if_cancelled",
    "get_queue_name",
)

#: Seconds between two progress reports sent to the worker (the last is always sent).
_PROGRESS_EVERY = 0.1


class ChildLogger:
    """``helpers.logger`` in a child: each line goes to the worker, which logs
    it as its job's (``[job(...)]`` prefix, the attempt's kept lines)."""

    def __init__(self, send: Any) -> None:
        self._send = send

    def isEnabledFor(self, level: int) -> bool:
        return True

    def log(self, level: int, msg: Any, *args: Any, exc_info: Any = None, **kwargs: Any) -> None:
        text = str(msg) % args if args else str(msg)
        if exc_info:
            if isinstance(exc_info, BaseException):
                exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
            elif not isinstance(exc_info, tuple):
                exc_info = sys.exc_info()
            if exc_info[0] is not None:
                text += "\n" + "".join(traceback.format_exception(*exc_info)).rstrip("\n")
        self._send(("log", level, text))

    def debug(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        self.log(logging.DEBUG, msg, *args, **kwargs)

    def info(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        self.log(logging.INFO, msg, *args, **kwargs)

    def warning(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        self.log(logging.WARNING, msg, *args, **kwargs)

    warn = warning

    def error(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        self.log(logging.ERROR, msg, *args, **kwargs)

    def exception(self, msg: Any, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        self.log(logging.ERROR, msg, *args, exc_info=exc_info, **kwargs)

    def critical(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        self.log(logging.CRITICAL, msg, *args, **kwargs)

    fatal = critical


class ChildHelpers:
    """What a task run in a worker process receives as ``helpers``: the job,
    its logger, ``progress``; any other helper raises :class:`HelperUnavailable`
    naming it. A cancel request or a timeout ends the process itself, so
    ``cancelled`` stays false."""

    cancelled = False
    timed_out = False
    cancel_reason: str | None = None

    def __init__(self, job: Job, worker_id: str, conn: Connection) -> None:
        self.job = job
        self.worker_id = worker_id
        self._conn = conn
        self.logger = ChildLogger(conn.send)
        self._pending: tuple[Any, ...] | None = None
        self._sent = 0.0

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise HelperUnavailable(name, AVAILABLE)

    def raise_if_cancelled(self) -> None:
        """Never raises here: a cancelled job's process is ended."""

    def get_queue_name(self) -> str | None:
        """The name of the job's queue, or None."""
        return self.job.queue_name

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """As ``Helpers.progress``: sent to the worker at most every 0.1 s
        (the latest report of a job always is)."""
        check_progress(done, total, message)
        self._pending = ("progress", done, total, message)
        now = time.monotonic()
        if now - self._sent >= _PROGRESS_EVERY:
            self._sent = now
            self.flush()

    def flush(self) -> None:
        """Send the progress report held back, if any."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._conn.send(pending)


def child_main(conn: Connection) -> None:
    """The child's loop: run each job it is sent, answer, until told to exit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_the_worker()
    functions: dict[str, TaskFunction] = {}
    pid = os.getpid()
    conn.send(("ready",))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the worker is gone
        if message is None:
            return
        _, identifier, location, source, job, worker_id = message
        helpers = ChildHelpers(job, worker_id, conn)
        answer = _run(functions, identifier, location, source, job, helpers)
        if os.getpid() != pid:  # a process the task forked came back here
            os._exit(0)
        helpers.flush()
        conn.send(answer)


#: prctl's option: the signal a process gets when its parent dies (Linux).
_PR_SET_PDEATHSIG = 1


def _die_with_the_worker() -> None:
    """On Linux: be killed when the worker dies (else, once its pipe closes)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:
        os._exit(1)  # it died before prctl took effect


def _run(
    functions: dict[str, TaskFunction],
    identifier: str,
    location: TaskLocation,
    source: str,
    job: Job,
    helpers: ChildHelpers,
) -> tuple[Any, ...]:
    """Run one job: the ``done`` message to send."""
    try:
        function = functions.get(identifier)
        if function is None:
            function = functions[identifier] = load_located(identifier, location, source)
        given: Any = helpers  # what the task has of Helpers
        result = contextvars.Context().run(function, job.payload, given)
        if result is not None and inspect.iscoroutine(result):
            result = asyncio.run(result)
    except BaseException as exc:  # SystemExit, KeyboardInterrupt...: the job failed
        return _failed(exc)
    try:
        return ("done", True, pickle.dumps(result, pickle.HIGHEST_PROTOCOL))
    except BaseException as exc:
        return _failed(
            TypeError(
                "the task's return value cannot be sent back from its worker process "
                f"(process=True: it must be picklable): {describe(exc)}"
            )
        )


def _failed(error: BaseException) -> tuple[Any, ...]:
    """The ``done`` message of a failed job: the error pickled if it can be
    (and read back: the worker must be able to), its text, its traceback."""
    try:
        text = "".join(traceback.format_exception(error)).rstrip("\n")
    except BaseException:
        text = ""
    blob: bytes | None
    try:
        blob = pickle.dumps(error, pickle.HIGHEST_PROTOCOL)
        pickle.loads(blob)
    except BaseException:
        blob = None
    return ("done", False, blob, describe(error), text)
