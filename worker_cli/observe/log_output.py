"""Log output: one line per job outcome, text or JSON lines, debug switch.

The worker pool calls :func:`job_succeeded` and :func:`job_failed` once per
job; both return at once when their logger would drop the line, so nothing is
formatted on the hot path unless it is printed. Every line carries its scope
(``pool_id``, ``worker_id``, ``job_id``, ``task_identifier``, ``attempt``,
``max_attempts``, ``duration_ms``, ...) as ``logging`` record attributes
(``extra=``), which :class:`JsonFormatter` writes out as fields.

Success lines have a fast path: when the line would go only through the
handler and formatter that :func:`configure` installed, untouched (no filter,
other handler, replaced formatter, record factory or patched ``logging``
method on its way), it is formatted and written here without a ``LogRecord``,
to the same bytes ``logging`` would write. In any other set-up it goes
through ``logging`` as usual.

:func:`configure` is what the command line uses: text or JSON lines on
stderr, and debug lines of the ``graphile_worker`` loggers when
``GRAPHILE_LOGGER_DEBUG`` is set (the variable graphile-worker for Node reads).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Literal, TextIO

from ..errors import JobCancelled, PayloadError, UnreadableJobError
from . import line_handler
from .line_handler import LineHandler

if TYPE_CHECKING:
    from ..jobs.job import Job

__all__ = [
    "LOG_FORMATS",
    "JsonFormatter",
    "LogFormat",
    "configure",
    "debug_from_env",
    "job_failed",
    "job_succeeded",
    "outcome_not_logged",
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
#: The parent of both, between them and the root logger.
_parent_logger = logging.getLogger(ROOT_LOGGER)

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


_SUCCESS = "Completed task %d (%s, %.2fms, attempt %d/%d) with success"
#: A text success line in one formatting step: TEXT_FORMAT's "%(asctime)s
#: %(levelname)s %(message)s" with _SUCCESS as the message (all str), and
#: asctime as Formatter.default_msec_format ("%s,%03d") makes it.
_TEXT_SUCCESS = "%s %s " + _SUCCESS
_DEFAULT_MSEC_FORMAT = "%s,%03d"
_TEXT_SUCCESS_MSECS = _DEFAULT_MSEC_FORMAT + " %s " + _SUCCESS


def job_succeeded(job: Job, worker_id: str, pool_id: str, duration_ms: float) -> None:
    """Log ``Completed task <id> (<task>, <ms>ms, attempt a/m) with success``
    (written directly when :func:`_fast_target` allows, else through ``logging``)."""
    if not outcome_logger.isEnabledFor(_INFO):
        return
    target = _fast_target()
    if target is not None:
        _write_success(target, job, worker_id, pool_id, duration_ms)
        return
    outcome_logger.info(
        _SUCCESS,
        job.id,
        job.task_identifier,
        duration_ms,
        job.attempts,
        job.max_attempts,
        extra=_scope(job, worker_id, pool_id, duration_ms),
    )


def outcome_not_logged(job_id: int) -> None:
    """A user's logging code (a filter, a handler) raised on a job's outcome
    line: say so, if even that can be said. Never raises: the outcome is
    written whatever happens here."""
    with contextlib.suppress(BaseException):
        logging.getLogger(ROOT_LOGGER).exception("Job %d: its outcome could not be logged", job_id)


def job_failed(
    job: Job,
    worker_id: str,
    pool_id: str,
    duration_ms: float,
    message: str,
    error: BaseException,
    *,
    cancelled: bool = False,
    timed_out: str | None = None,
    for_good: bool = False,
    delay: float | None = None,
) -> None:
    """Log ``Failed task <id> (...) with error '<message>'; retrying in Ns`` (or
    ``no attempts left: failed permanently``), with the traceback. A payload that
    does not fit its task fails permanently at once, without a traceback.
    ``timed_out``: the attempt went past its timeout, and its task's
    ``on_timeout`` (``fail`` and ``cancel`` end the job now). ``for_good``:
    the task's retry policy (or its Discard) ends the job now; ``delay``:
    the policy's seconds before the next attempt."""
    if _quiet_end(job, worker_id, pool_id, duration_ms, message, error, cancelled, timed_out):
        return
    if not outcome_logger.isEnabledFor(_ERROR):
        return
    misfit = isinstance(error, PayloadError)
    permanent = misfit or isinstance(error, JobCancelled) or job.attempts >= job.max_attempts
    extra = _scope(job, worker_id, pool_id, duration_ms)
    extra["error"] = message
    if isinstance(error, UnreadableJobError):
        fate = "its row cannot be read: failed permanently (no retry)"
        extra["retry_in_s"] = None
    elif cancelled or timed_out == "cancel":
        fate = (
            "the job was cancelled: recorded as cancelled (no retry)"
            if cancelled
            else "timed out: recorded as cancelled (on_timeout='cancel')"
        )
        extra["retry_in_s"] = None
        permanent = True
    elif timed_out == "fail":
        fate = "timed out: failed permanently (on_timeout='fail')"
        extra["retry_in_s"] = None
        permanent = True
    elif misfit:
        fate = "the payload does not fit the task: failed permanently (no retry)"
        extra["retry_in_s"] = None
    elif permanent:
        fate = "no attempts left: failed permanently"
        extra["retry_in_s"] = None
    elif for_good:
        fate = "failed permanently by its task's retry policy (no retry)"
        extra["retry_in_s"] = None
        permanent = True
    else:
        # The same delay the failure statement stores: the policy's, else
        # exp(min(attempts, 10)) s.
        delay = math.exp(min(job.attempts, 10)) if delay is None else delay
        fate = f"retrying in {delay:.0f}s"
        extra["retry_in_s"] = round(delay, 3)
    extra["permanent"] = permanent
    args = (job.id, job.task_identifier, duration_ms, job.attempts, job.max_attempts, message, fate)
    if misfit:
        outcome_logger.error(_FAILED, *args, extra=extra)
        return
    # The traceback is formatted here, with NUL characters and lone surrogates
    # escaped (an exception's message may hold anything): a formatter uses a
    # record's exc_text when it has one.
    record = outcome_logger.makeRecord(
        outcome_logger.name,
        _ERROR,
        __file__,
        0,
        _FAILED,
        args,
        (type(error), error, error.__traceback__),
        extra=extra,
    )
    record.exc_text = printable("".join(traceback.format_exception(error)).rstrip("\n"))
    outcome_logger.handle(record)


_FAILED = "Failed task %d (%s, %.2fms, attempt %d/%d) with error %r; %s"


def _quiet_end(
    job: Job,
    worker_id: str,
    pool_id: str,
    duration_ms: float,
    message: str,
    error: BaseException,
    cancelled: bool,
    timed_out: str | None,
) -> bool:
    """An ending the task or an operator chose, logged as one line without a
    traceback (it is no bug): the task raised ``Cancel`` (INFO) or ``Discard``
    (WARNING: the job stays failed until retried), or the job was cancelled
    while it ran (``cancel_job``, ``graphile-worker cancel``: INFO, with what
    the task raised as it stopped). Whether it was one of these."""
    from ..tasks.retry_policy import Cancel, Discard

    if isinstance(error, Cancel):
        level, what = logging.INFO, f"cancelled by its task ({error.reason})"
        fate = "recorded as cancelled (no retry)"
    elif isinstance(error, Discard) and not cancelled and timed_out is None:
        level, what = logging.WARNING, f"discarded by its task ({error.reason})"
        fate = "failed permanently (no retry; `graphile-worker retry` revives it)"
    elif cancelled and timed_out is None:
        level, what = logging.INFO, f"cancelled while it ran (it stopped with {message!r})"
        fate = "recorded as cancelled (no retry)"
    else:
        return False
    if outcome_logger.isEnabledFor(level):
        extra = _scope(job, worker_id, pool_id, duration_ms)
        extra.update(error=message, retry_in_s=None, permanent=True)
        outcome_logger.log(
            level,
            _ENDED,
            job.id,
            job.task_identifier,
            duration_ms,
            job.attempts,
            job.max_attempts,
            what,
            fate,
            extra=extra,
        )
    return True


_ENDED = "Job %d (%s, %.2fms, attempt %d/%d) %s: %s"


def printable(text: str) -> str:
    """``text`` with NUL characters and lone surrogates written as escapes."""
    return text.encode("utf-8", "backslashreplace").decode().replace("\x00", "\\x00")


# --- Output -----------------------------------------------------------------------

# Attributes every LogRecord has; anything else on a record came from extra=.
_RECORD_ATTRIBUTES = frozenset(
    (*logging.LogRecord("", 0, "", 0, "", (), None).__dict__, "message", "asctime", "taskName")
)


def _utc_time(created: float) -> str:
    return (
        datetime.fromtimestamp(created, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


# What json.dumps(document, default=str, ensure_ascii=False) builds on every call.
_JSON_ENCODER = json.JSONEncoder(default=str, ensure_ascii=False)
# Record attributes that are not fields of the JSON line: the standard ones, and
# those named like the four keys every line starts with.
_NOT_FIELDS = _RECORD_ATTRIBUTES | {"time", "level", "logger", "message"}


def _json_line(
    created: float,
    levelname: str,
    logger: str,
    message: str,
    fields: Mapping[str, Any],
    record: logging.LogRecord | None = None,
    formatter: logging.Formatter | None = None,
) -> str:
    """One JSON line: the time, level, logger and message, then ``fields`` (the
    ``extra=`` attributes, none of them in ``_NOT_FIELDS``), then ``record``'s
    traceback and stack (formatted by ``formatter``). Shared by
    :class:`JsonFormatter` and the success fast path, so both print the same."""
    document: dict[str, Any] = {
        "time": _utc_time(created),
        "level": levelname.lower(),
        "logger": logger,
        "message": message,
    }
    document.update(fields)
    if record is not None and formatter is not None:
        if record.exc_info:
            document["exception"] = formatter.formatException(record.exc_info)
        elif record.exc_text:
            document["exception"] = record.exc_text
        if record.stack_info:
            document["stack"] = formatter.formatStack(record.stack_info)
    return _JSON_ENCODER.encode(document)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, then every ``extra=`` field of the record, then ``exception``
    (the traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {k: v for k, v in record.__dict__.items() if k not in _NOT_FIELDS}
        return _json_line(
            record.created, record.levelname, record.name, record.getMessage(), fields, record, self
        )


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
    logger's handlers: meant for the command line. Remembers the handler and
    formatter for the success lines' fast path (:func:`_fast_target`)."""
    global _installed
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log_format must be one of {', '.join(LOG_FORMATS)}")
    if debug is None:
        debug = debug_from_env()
    handler = LineHandler(stream or sys.stderr, _success_record)
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    logging.getLogger(ROOT_LOGGER).setLevel(logging.DEBUG if debug else logging.NOTSET)
    _installed = None
    if _record_time is not None and _GENUINE_METHODS is not None:
        _installed = (
            handler,
            formatter,
            frozenset(vars(handler)) | _HANDLER_SETTINGS,
            frozenset(vars(formatter)) | _FORMATTER_SETTINGS,
        )


# --- Success lines without a LogRecord -------------------------------------------
#
# The fast path writes what StreamHandler.emit would write after Formatter.format
# or JsonFormatter.format of the record Logger.info would make, and only when
# nothing else on the record's way could see or change it (_fast_target).

_Target = tuple[LineHandler, logging.Formatter]


def _time_until_3_12() -> tuple[float, float]:
    """``created`` and ``msecs`` as a LogRecord of Python 3.11 and 3.12 sets them."""
    ct = time.time()
    return ct, int((ct - int(ct)) * 1000) + 0.0


def _time_from_3_13() -> tuple[float, float]:
    """``created`` and ``msecs`` as a LogRecord of Python 3.13 sets them (from
    nanoseconds; ``msecs`` is 0 when ``created`` rounds up to the next second)."""
    ns = time.time_ns()
    created = ns / 1e9
    msecs = (ns % 1_000_000_000) // 1_000_000 + 0.0
    if msecs == 999.0 and int(created) != ns // 1_000_000_000:
        msecs = 0.0
    return created, msecs


def _record_time_for(version: tuple[Any, ...]) -> Callable[[], tuple[float, float]] | None:
    """The clock reading of LogRecords in Python ``version`` (``sys.version_info``),
    or None for a version whose formula is not mirrored here (no fast path): the
    pre-releases (3.13.0b2 still lacked the 0 ms correction, gh-120683) and
    3.14 and later, not checked yet."""
    if version[3] != "final":
        return None
    if (3, 11) <= version[:2] <= (3, 12):
        return _time_until_3_12
    if version[:2] == (3, 13):
        return _time_from_3_13
    return None


_record_time = _record_time_for(sys.version_info)

# The classes a success line goes through, as this module was imported with them,
# and a reader of the methods it runs in each: the methods must still be these
# (a library that wraps, say, Logger.callHandlers must see every line).
_Logger, _StreamHandler, _Formatter = logging.Logger, logging.StreamHandler, logging.Formatter
_LineHandler = LineHandler
_PercentStyle, _LogRecord = logging.PercentStyle, logging.LogRecord
_RLock = type(threading.RLock())
_logger_methods = attrgetter("info", "_log", "makeRecord", "handle", "filter", "callHandlers")
_handler_methods = attrgetter("handle", "filter", "emit", "format", "flush", "acquire", "release")
_formatter_methods = attrgetter("format", "formatTime", "usesTime", "formatMessage")
_style_methods = attrgetter("format", "_format", "usesTime")
_record_methods = attrgetter("__init__", "getMessage")


def _path_methods() -> tuple[Any, ...]:
    """The methods a success line would run in ``logging`` and :class:`JsonFormatter`,
    as the classes hold them now."""
    return (
        _logger_methods(_Logger),
        # LineHandler's own and inherited methods, and the emit it calls for
        # other records (its flush and write_line run for success lines too).
        _handler_methods(_LineHandler),
        (_StreamHandler.emit,),
        _formatter_methods(_Formatter),
        _style_methods(_PercentStyle),
        _record_methods(_LogRecord),
        (JsonFormatter.format,),
    )


def _genuine_methods() -> tuple[Any, ...] | None:
    """:func:`_path_methods` now, if each is defined in ``logging`` or here
    (not already wrapped by another library), else None (no fast path)."""
    methods = _path_methods()
    functions = [f for group in methods for f in group]
    origins = {getattr(getattr(f, "__code__", None), "co_filename", None) for f in functions}
    return methods if origins <= {logging.__file__, __file__, line_handler.__file__} else None


_GENUINE_METHODS = _genuine_methods()

# Instance attributes a user may set on the handler or formatter that the fast
# path reads just as logging does; any other new one (emit, format, ...) means
# no fast path.
_HANDLER_SETTINGS = frozenset({"terminator"})
_FORMATTER_SETTINGS = frozenset({"converter", "default_time_format", "default_msec_format"})
_LOGGER_ATTRIBUTES = frozenset((*vars(logging.Logger("")), "manager"))

#: What :func:`configure` installed: handler, formatter, and the attribute names
#: each may have (None: not configured, or no fast path in this Python).
_installed: tuple[LineHandler, logging.Formatter, frozenset[str], frozenset[str]] | None = None


def _fast_target() -> _Target | None:
    """The handler and formatter :func:`configure` installed, when a success line
    of ``outcome_logger`` would reach them and nothing else: no handler or filter
    on the loggers but theirs, no filter or higher level on the handler, the same
    formatter, the standard record factory, no ``logging`` method replaced.
    None otherwise (the line then goes through ``logging``). The caller has
    checked ``outcome_logger.isEnabledFor(INFO)`` (levels, ``disabled``,
    ``logging.disable``)."""
    installed = _installed
    if installed is None:
        return None
    handler, formatter, handler_attributes, formatter_attributes = installed
    logger, parent, root = outcome_logger, _parent_logger, logging.root
    root_handlers = root.handlers
    if not (
        type(logger) is _Logger
        and logger.propagate
        and not logger.handlers
        and not logger.filters
        and logger.parent is parent
        and _LOGGER_ATTRIBUTES.issuperset(logger.__dict__)
        and parent.propagate
        and not parent.handlers
        and not parent.filters
        and not parent.disabled
        and parent.parent is root
        and not root.filters
        and len(root_handlers) == 1
        and root_handlers[0] is handler
        and type(handler) is _LineHandler
        and type(handler.lock) is _RLock
        and not handler.filters
        and handler.level <= _INFO
        and handler.formatter is formatter
        and handler_attributes.issuperset(handler.__dict__)
        and formatter_attributes.issuperset(formatter.__dict__)
        and logging.getLogRecordFactory() is _LogRecord
        and _path_methods() == _GENUINE_METHODS
    ):
        return None
    kind = type(formatter)
    if kind is JsonFormatter:
        return handler, formatter
    style = formatter._style
    if (
        kind is _Formatter
        and formatter.datefmt is None
        and type(style) is _PercentStyle
        and style._fmt is TEXT_FORMAT
    ):
        return handler, formatter
    return None


#: ``Formatter.formatTime``'s text before the milliseconds for one second, and
#: the key of everything that text depends on (see :func:`_asctime`); one
#: tuple, replaced whole, so that a thread never sees one's key with another's text.
_second: tuple[tuple[Any, ...], str] = ((), "")

#: Converters whose result depends only on the whole second and the time zone.
_WHOLE_SECOND_CONVERTERS = (time.localtime, time.gmtime)
#: The default time format: digits only, whatever the locale.
_DEFAULT_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


def _asctime(formatter: logging.Formatter, created: float, msecs: float) -> str:
    """What ``formatter.formatTime`` returns for a record made at ``created``
    (``msecs``): the text of its second (:func:`_second_text`) with the
    milliseconds, or, for a converter or format that text cannot be cached
    for, ``formatTime`` itself."""
    text = _second_text(formatter, created)
    if text is None:
        return formatter.formatTime(_Stamp(created, msecs))  # type: ignore[arg-type]
    msec_format = formatter.default_msec_format
    return msec_format % (text, msecs) if msec_format else text


def _second_text(formatter: logging.Formatter, created: float) -> str | None:
    """``formatter.formatTime``'s text before the milliseconds, for a record made
    at ``created``; None unless its converter is ``time.localtime``/``gmtime``
    and its time format the default. Those depend only on the whole seconds
    (rounded down) and the time zone (``time.tzset`` changes ``time.timezone``,
    ``altzone``, ``daylight``, ``tzname``), and the default format only prints
    digits: so the text is computed once per second."""
    global _second
    converter = formatter.converter
    if converter not in _WHOLE_SECOND_CONVERTERS or (
        formatter.default_time_format != _DEFAULT_TIME_FORMAT
    ):
        return None
    key = (
        math.floor(created),
        converter,
        time.timezone,
        time.altzone,
        time.daylight,
        time.tzname,
    )
    cached_key, text = _second
    if key != cached_key:
        text = time.strftime(_DEFAULT_TIME_FORMAT, converter(created))
        _second = (key, text)
    return text


class _Stamp:
    """The two record attributes ``Formatter.formatTime`` reads."""

    __slots__ = ("created", "msecs")

    def __init__(self, created: float, msecs: float) -> None:
        self.created = created
        self.msecs = msecs


def _write_success(
    target: _Target, job: Job, worker_id: str, pool_id: str, duration_ms: float
) -> None:
    """Format the success line as the installed formatter would, and give it
    to the handler, which writes it as ``StreamHandler.emit`` would (queued
    until the end of this event-loop iteration: see :mod:`.line_handler`). An
    error goes to ``handleError`` with the record logging would have made."""
    handler, formatter = target
    assert _record_time is not None  # _installed is None without it
    created, msecs = _record_time()
    levelname = logging.getLevelName(_INFO)
    try:
        if type(formatter) is JsonFormatter:
            message = _SUCCESS % (
                job.id,
                job.task_identifier,
                duration_ms,
                job.attempts,
                job.max_attempts,
            )
            fields = _scope(job, worker_id, pool_id, duration_ms)  # none in _NOT_FIELDS
            line = _json_line(created, levelname, outcome_logger.name, message, fields)
        elif (second := _second_text(formatter, created)) is not None and (
            formatter.default_msec_format == _DEFAULT_MSEC_FORMAT
        ):
            line = _TEXT_SUCCESS_MSECS % (
                second,
                msecs,
                levelname,
                job.id,
                job.task_identifier,
                duration_ms,
                job.attempts,
                job.max_attempts,
            )
        else:
            line = _TEXT_SUCCESS % (
                _asctime(formatter, created, msecs),
                levelname,
                job.id,
                job.task_identifier,
                duration_ms,
                job.attempts,
                job.max_attempts,
            )
    except RecursionError:  # as StreamHandler.emit does
        raise
    except Exception:
        handler.flush()  # the lines before it came first
        handler.handleError(_success_record((job, worker_id, pool_id, duration_ms, created, msecs)))
        return
    handler.write_line(
        line + handler.terminator, (job, worker_id, pool_id, duration_ms, created, msecs)
    )


def _success_record(details: tuple[Job, str, str, float, float, float]) -> logging.LogRecord:
    """The record ``logging`` would have made for a success line (for ``handleError``)."""
    job, worker_id, pool_id, duration_ms, created, msecs = details
    record = outcome_logger.makeRecord(
        outcome_logger.name,
        _INFO,
        __file__,
        0,
        _SUCCESS,
        (job.id, job.task_identifier, duration_ms, job.attempts, job.max_attempts),
        None,
        "job_succeeded",
        _scope(job, worker_id, pool_id, duration_ms),
    )
    record.created, record.msecs = created, msecs
    return record
