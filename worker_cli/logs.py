"""Log output: one line per job outcome, text or JSON lines, debug switch.

The worker pool calls :func:`job_succeeded` and :func:`job_failed` once per
job; both return at once when their logger would drop the line, so nothing is
formatted on the hot path unless it is printed. Every line carries its scope
(``pool_id``, ``worker_id``, ``job_id``, ``task_identifier``, ``attempt``,
``max_attempts``, ``duration_ms``, ...) as ``logging`` record attributes
(``extra=``), which :class:`JsonFormatter` writes out as fields.

:func:`configure` is what the command line uses: text or JSON lines on
stderr, and debug lines of the ``graphile_worker`` loggers when
``GRAPHILE_LOGGER_DEBUG`` is set (the variable graphile-worker for Node reads).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, TextIO

if TYPE_CHECKING:
    from .events import EventHandler, Events
    from .job import Job

__all__ = [
    "LOG_FORMATS",
    "JsonFormatter",
    "LogFormat",
    "attach_debug_logging",
    "configure",
    "debug_from_env",
    "job_failed",
    "job_succeeded",
]

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")

TEXT_FORMAT = "%(asctime)s %(levelname)s %(message)s"

#: The loggers' common parent: its level is DEBUG when debug output is on.
ROOT_LOGGER = "graphile_worker"
#: Job outcomes ("Completed task ...", "Failed task ...").
outcome_logger = logging.getLogger("graphile_worker.worker")
#: Debug lines about the pool's life (fetches, listening, jobs starting).
debug_logger = logging.getLogger("graphile_worker.debug")

_INFO = logging.INFO
_ERROR = logging.ERROR

# --- Job outcomes ----------------------------------------------------------------


def _scope(job: Job, worker_id: str, pool_id: str, duration_ms: float) -> dict[str, Any]:
    return {
        "pool_id": pool_id,
        "worker_id": worker_id,
        "job_id": job.id,
        "task_identifier": job.task_identifier,
        "queue_name": job.queue_name,
        "attempt": job.attempts,
        "max_attempts": job.max_attempts,
        "duration_ms": round(duration_ms, 2),
    }


def job_succeeded(job: Job, worker_id: str, pool_id: str, duration_ms: float) -> None:
    """Log ``Completed task <id> (<task>, <ms>ms, attempt a/m) with success``."""
    if not outcome_logger.isEnabledFor(_INFO):
        return
    outcome_logger.info(
        "Completed task %d (%s, %.2fms, attempt %d/%d) with success",
        job.id,
        job.task_identifier,
        duration_ms,
        job.attempts,
        job.max_attempts,
        extra=_scope(job, worker_id, pool_id, duration_ms),
    )


def job_failed(
    job: Job,
    worker_id: str,
    pool_id: str,
    duration_ms: float,
    message: str,
    error: BaseException,
) -> None:
    """Log ``Failed task <id> (...) with error '<message>'; retrying in Ns`` (or
    ``no attempts left: failed permanently``), with the traceback."""
    if not outcome_logger.isEnabledFor(_ERROR):
        return
    permanent = job.attempts >= job.max_attempts
    extra = _scope(job, worker_id, pool_id, duration_ms)
    extra["error"] = message
    if permanent:
        fate = "no attempts left: failed permanently"
        extra["retry_in_s"] = None
    else:
        # The same delay the failure statement stores: exp(min(attempts, 10)) s.
        delay = math.exp(min(job.attempts, 10))
        fate = f"retrying in {delay:.0f}s"
        extra["retry_in_s"] = round(delay, 3)
    extra["permanent"] = permanent
    outcome_logger.error(
        "Failed task %d (%s, %.2fms, attempt %d/%d) with error %r; %s",
        job.id,
        job.task_identifier,
        duration_ms,
        job.attempts,
        job.max_attempts,
        message,
        fate,
        exc_info=(type(error), error, error.__traceback__),
        extra=extra,
    )


# --- Debug lines from the pool's events ------------------------------------------


def attach_debug_logging(events: Events) -> None:
    """Log the pool's life at debug level (called only when debug is on, so the
    events cost nothing otherwise)."""
    log = debug_logger.debug

    def pool_event(text: str) -> EventHandler:
        def handler(data: dict[str, Any]) -> None:
            pool_id = data["pool"].id
            log("Worker pool %s: %s", pool_id, text, extra={"pool_id": pool_id})

        return handler

    events.on("pool:create", pool_event("connected"))
    events.on("pool:listen:success", pool_event("listening for new jobs"))
    events.on("worker:getJob:empty", pool_event("no runnable job found"))
    events.on("pool:release", pool_event("released its connections"))

    def worker_create(data: dict[str, Any]) -> None:
        worker_id = data["worker_id"]
        log("Worker %s: started", worker_id, extra={"worker_id": worker_id})

    def job_start(data: dict[str, Any]) -> None:
        job, worker_id = data["job"], data["worker_id"]
        log(
            "Worker %s: running job %d (%s, attempt %d/%d)",
            worker_id,
            job.id,
            job.task_identifier,
            job.attempts,
            job.max_attempts,
            extra={
                "worker_id": worker_id,
                "job_id": job.id,
                "task_identifier": job.task_identifier,
                "attempt": job.attempts,
                "max_attempts": job.max_attempts,
            },
        )

    def job_complete(data: dict[str, Any]) -> None:
        job = data["job"]
        log(
            "Job %d (%s): result recorded",
            job.id,
            job.task_identifier,
            extra={"job_id": job.id, "task_identifier": job.task_identifier},
        )

    events.on("worker:create", worker_create)
    events.on("job:start", job_start)
    events.on("job:complete", job_complete)


# --- Output -----------------------------------------------------------------------

# Attributes every LogRecord has; anything else on a record came from extra=.
_RECORD_ATTRIBUTES = frozenset(
    (*logging.LogRecord("", 0, "", 0, "", (), None).__dict__, "message", "asctime", "taskName")
)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, then every ``extra=`` field of the record, then ``exception``
    (the traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRIBUTES and key not in document:
                document[key] = value
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            document["exception"] = record.exc_text
        if record.stack_info:
            document["stack"] = self.formatStack(record.stack_info)
        return json.dumps(document, default=str, ensure_ascii=False)


def debug_from_env() -> bool:
    """Whether ``GRAPHILE_LOGGER_DEBUG`` asks for debug output (set, and not
    ``0``/``false``/``no``/``off``)."""
    value = os.environ.get("GRAPHILE_LOGGER_DEBUG", "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


def configure(
    log_format: LogFormat = "text", *, debug: bool | None = None, stream: TextIO | None = None
) -> None:
    """Send log lines to ``stream`` (stderr) as text or JSON lines, at INFO and
    above; with ``debug`` (default: from ``GRAPHILE_LOGGER_DEBUG``) the
    ``graphile_worker`` loggers also print DEBUG lines. Replaces the root
    logger's handlers: meant for the command line."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log_format must be one of {', '.join(LOG_FORMATS)}")
    if debug is None:
        debug = debug_from_env()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    logging.getLogger(ROOT_LOGGER).setLevel(logging.DEBUG if debug else logging.NOTSET)
