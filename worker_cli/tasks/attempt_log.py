"""The lines a task logs through ``helpers.logger`` during one attempt, kept
for that attempt (``--job-logs``; migrations/py/000027.sql).

Bounded whatever the task does: at most :data:`LINES_MAX` lines and
:data:`BYTES_MAX` characters are held, the oldest dropped first (the kept text
starts with a line saying how many were); a line longer than
:data:`LINE_MAX` characters keeps its beginning. A task that logs a million
lines holds the last thousand, and costs each line one format and one append.
Any thread may add lines (a plain task's, or threads it starts).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import deque
from typing import Any, Literal

__all__ = ["BYTES_MAX", "LINES_MAX", "LINE_MAX", "AttemptLog", "JobLogs"]

#: What ``--job-logs`` keeps: ``failed`` attempts' lines (the default),
#: ``all`` attempts', or nothing (``off``).
JobLogs = Literal["all", "failed", "off"]

#: The most lines an attempt keeps (the newest).
LINES_MAX = 1000
#: The most characters an attempt keeps, its lines together.
BYTES_MAX = 64 * 1024
#: The most characters of one line (with its exception's traceback).
LINE_MAX = 4000


class AttemptLog:
    """One attempt's kept lines (see the module's docstring)."""

    __slots__ = ("_lines", "_lock", "_second", "_size", "_stamp", "dropped")

    def __init__(self) -> None:
        self._lines: deque[str] = deque()
        self._size = 0
        #: Lines dropped to keep within the bounds (the oldest).
        self.dropped = 0
        self._lock = threading.Lock()
        #: The last whole second a line was stamped in, and its text.
        self._second = -1
        self._stamp = ""

    def add(self, level: int, msg: object, args: tuple[Any, ...], exc_info: object) -> None:
        """Keep one line: its time (UTC), level and message (formatted as
        logging does); never raises."""
        try:
            text = str(msg) % args if args else str(msg)
        except BaseException as exc:  # a bad format, a __str__ raising anything
            text = f"<a line that could not be formatted: {type(exc).__name__}>"
        if exc_info:
            text += "\n" + _traceback(exc_info)
        now = time.time()
        stamp = (
            time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
        )
        line = f"{stamp} {logging.getLevelName(level)} {text[:LINE_MAX]}"
        with self._lock:
            self._lines.append(line)
            self._size += len(line) + 1
            while len(self._lines) > LINES_MAX or self._size > BYTES_MAX:
                self._size -= len(self._lines.popleft()) + 1
                self.dropped += 1

    def render(self) -> tuple[str, int] | None:
        """The kept text (storable) and how many lines were dropped; None
        when nothing was logged."""
        with self._lock:
            if not self._lines and not self.dropped:
                return None
            lines = list(self._lines)
            dropped = self.dropped
        if dropped:
            lines.insert(
                0,
                f"[{dropped} earlier line(s) dropped: an attempt keeps at most {LINES_MAX} "
                f"lines, {BYTES_MAX // 1024} KiB]",
            )
        text = "\n".join(lines)
        # As storable() does, without its cut (the text is bounded already).
        return text.encode("utf-8", "backslashreplace").decode().replace("\x00", "\\x00"), dropped


def _traceback(exc_info: object) -> str:
    """The traceback of a log call's ``exc_info`` (True: the exception being
    handled), its last :data:`LINE_MAX` characters; never raises."""
    try:
        if exc_info is True:
            import sys

            exc_info = sys.exc_info()
        if isinstance(exc_info, BaseException):
            lines = traceback.format_exception(exc_info)
        elif isinstance(exc_info, tuple) and len(exc_info) == 3 and exc_info[1] is not None:
            lines = traceback.format_exception(*exc_info)
        else:
            return ""
        return "".join(lines).rstrip()[-LINE_MAX:]
    except Exception:
        return "(traceback unavailable)"
