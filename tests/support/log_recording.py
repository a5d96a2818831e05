"""Log lines recorded through logging as the worker writes them, for the log
tests: a fixed clock, a recording handler."""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from worker_cli.jobs.job import Job
from worker_cli.observe import log_output as logs

SECOND = 1_718_710_000 * 1_000_000_000  # ns, a whole second (2024-06-18 11:26:40 UTC)


def _job(job_id: int = 123, task: str = "noop", queue: str | None = None, attempts: int = 1) -> Job:
    values: dict[str, Any] = dict.fromkeys(Job._fields)
    values.update(
        id=job_id, task_identifier=task, queue_name=queue, attempts=attempts, max_attempts=25
    )
    return Job(**values)


JOBS = [
    (_job(), 0.05),
    (_job(7, "tâche \"ü\" 'x' ✓ \\ \t", 'file "q" é', 3), 1234.5678),
    (_job(2**40, "a%sb%d", "q%(x)s", 25), 0.004999),
]


@contextmanager
def configured(log_format: logs.LogFormat = "text") -> Iterator[io.StringIO]:
    """``logs.configure`` to a StringIO; every logger and setting a test may touch
    is put back afterwards (inside the test, so pytest's own handlers stay as they were)."""
    root = logging.root
    loggers = [logs.outcome_logger, logs._parent_logger]
    saved = [
        (
            lg,
            lg.level,
            lg.handlers[:],
            lg.filters[:],
            lg.propagate,
            lg.disabled,
            lg.parent,
            set(vars(lg)),
        )
        for lg in loggers
    ]
    root_saved = (root.handlers[:], root.level, root.filters[:])
    installed, factory = logs._installed, logging.getLogRecordFactory()
    out = io.StringIO()
    try:
        logs.configure(log_format, debug=False, stream=out)
        yield out
    finally:
        root.handlers[:], root.level, root.filters[:] = root_saved
        for lg, level, handlers, filters, propagate, disabled, parent, attributes in saved:
            for added in set(vars(lg)) - attributes:  # a method set on the instance
                delattr(lg, added)
            lg.setLevel(level)
            lg.handlers[:], lg.filters[:] = handlers, filters
            lg.propagate, lg.disabled, lg.parent = propagate, disabled, parent
        logs._installed = installed
        logging.setLogRecordFactory(factory)
        logging.disable(logging.NOTSET)


def _clock(monkeypatch: pytest.MonkeyPatch, ns: int) -> None:
    monkeypatch.setattr(time, "time", lambda: ns / 1e9)
    monkeypatch.setattr(time, "time_ns", lambda: ns)


def _succeed(job: Job = JOBS[0][0], duration_ms: float = 0.05) -> None:
    logs.job_succeeded(job, "worker-1", "pool-1", duration_ms)


def _through_logging(
    log_format: logs.LogFormat,
    setup: Callable[[], object] = lambda: None,
    job: Job = JOBS[0][0],
    duration_ms: float = 0.05,
) -> str:
    """What real logging prints for the line, with the fast path switched off."""
    with pytest.MonkeyPatch.context() as patch, configured(log_format) as out:
        patch.setattr(logs, "_fast_target", lambda: None)
        setup()
        _succeed(job, duration_ms)
    return out.getvalue()


class _Recording(io.StringIO):
    """Notes each write and flush, and whether the handler's lock was held."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, str, bool]] = []

    def _locked(self) -> bool:
        return bool(logging.root.handlers[0].lock._is_owned())  # type: ignore[union-attr]

    def write(self, text: str) -> int:
        self.events.append(("write", text, self._locked()))
        return super().write(text)

    def flush(self) -> None:
        self.events.append(("flush", "", self._locked()))
