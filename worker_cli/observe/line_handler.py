"""The handler the command line logs through: a ``StreamHandler`` that also takes
lines formatted elsewhere (the success lines' fast path in :mod:`worker_cli.observe.log_output`)
and writes those of one event-loop iteration together.

A worker finishing thousands of jobs a second prints a success line for each;
one ``write`` and one ``flush`` per line cost as much as formatting it. A line
given to :meth:`LineHandler.write_line` on a running event loop is queued, and
the queue is written in one ``write`` (then one ``flush``) by a callback at the
loop's next iteration. Queued lines always go out before anything else the
handler writes: before the next record it emits (any logger, any thread), and
when it is flushed (``logging.shutdown()`` flushes every handler at exit). Off
an event loop, a line is written at once, as ``StreamHandler.emit`` writes.

So the handler writes the same bytes in the same order as one ``emit`` per
line would. What a line may now follow is output that bypasses ``logging``
and was written to the same file during the same loop iteration (a task's
``print`` to stderr, say), and a task that blocks the event loop delays the
lines queued before it until it returns.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["LineHandler"]

#: Builds the record ``logging`` would have made for a queued line, from what
#: was queued with it; only called to report a failed write (``handleError``).
RecordFor = Callable[[Any], logging.LogRecord]


class LineHandler(logging.StreamHandler[TextIO]):
    """A ``StreamHandler`` that also writes formatted lines, batched per
    event-loop iteration (see the module's docstring)."""

    def __init__(self, stream: TextIO, record_for: RecordFor) -> None:
        super().__init__(stream)
        self._record_for = record_for
        #: Lines not written yet, each with what ``record_for`` needs.
        self._queued: list[tuple[str, Any]] = []
        #: The loop on which a write of the queue is scheduled (None: none is).
        #: Read and set only by threads running an event loop.
        self._flush_loop: asyncio.AbstractEventLoop | None = None

    def write_line(self, line: str, details: Any) -> None:
        """Write ``line`` (terminator included) as ``emit`` writes a formatted
        record: queued until the running loop's next iteration, or now when
        no loop runs in this thread. ``details`` rebuilds its record if the
        write fails (``handleError``)."""
        self._queued.append((line, details))
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None and self._flush_loop is loop:
            return  # the scheduled write takes it
        if loop is not None and self._flush_loop is None:
            self._flush_loop = loop
            loop.call_soon(self._scheduled_write)
            return
        self.flush()  # no loop here, or another loop's write is scheduled

    def emit(self, record: logging.LogRecord) -> None:
        """Write the queued lines, then ``record`` (the lock is held, as
        ``Handler.handle`` holds it around ``emit``)."""
        if self._queued:
            self._write_queued()
        super().emit(record)

    def flush(self) -> None:
        """Write the queued lines, then flush the stream (as ``StreamHandler.flush``)."""
        self.acquire()
        try:
            if self._queued:
                self._write_queued()
            elif self.stream and hasattr(self.stream, "flush"):
                self.stream.flush()
        finally:
            self.release()

    def _scheduled_write(self) -> None:
        self._flush_loop = None
        self.flush()

    def _write_queued(self) -> None:
        """One write of every queued line, then a flush (the lock is held). If
        it fails, each line is reported to ``handleError``, as each record's
        failed ``emit`` would be."""
        queued = self._queued
        batch = queued[:]
        del queued[: len(batch)]  # lines queued meanwhile (other threads) stay
        try:
            stream = self.stream
            stream.write("".join([line for line, _ in batch]))
            if stream and hasattr(stream, "flush"):
                stream.flush()
        except RecursionError:  # as StreamHandler.emit does
            raise
        except Exception:
            for _, details in batch:
                self.handleError(self._record_for(details))
