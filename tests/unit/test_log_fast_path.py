"""The success line's fast path (worker_cli.observe.log_output): it prints the bytes logging
would, and steps aside whenever anything else could see or change the line."""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from log_recording import JOBS, SECOND, _clock, _Recording, _succeed, _through_logging, configured

from worker_cli.observe import log_output as logs

pytestmark = pytest.mark.unit

#: Clock readings (ns) whose milliseconds a wrong formula gets wrong: a whole
#: second, .0005 s, .1 s (not exact in binary), .9995 s, and two that round up to
#: the next second as floats.
INSTANTS = [
    SECOND,
    SECOND + 500_000,
    SECOND + 100_000_000,
    SECOND + 999_500_000,
    SECOND + 999_999_900,
    SECOND + 999_999_999,
]


@pytest.fixture
def fast_calls(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Records each success line the fast path writes."""
    calls: list[object] = []
    write = logs._write_success

    def spy(*args: Any) -> None:
        calls.append(args)
        write(*args)

    monkeypatch.setattr(logs, "_write_success", spy)
    return calls


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines printed one after the other show the same time."""
    _clock(monkeypatch, SECOND + 123_456_789)


# --- Same bytes ----------------------------------------------------------------------


@pytest.mark.parametrize("log_format", logs.LOG_FORMATS)
@pytest.mark.parametrize("ns", INSTANTS)
def test_the_fast_path_prints_what_logging_prints(
    monkeypatch: pytest.MonkeyPatch, fast_calls: list[object], log_format: logs.LogFormat, ns: int
) -> None:
    _clock(monkeypatch, ns)
    for job, duration_ms in JOBS:
        with configured(log_format) as out:
            _succeed(job, duration_ms)
        assert out.getvalue() == _through_logging(log_format, job=job, duration_ms=duration_ms)
    assert len(fast_calls) == len(JOBS)
    if log_format == "json":
        document = json.loads(out.getvalue())
        assert document["task_identifier"] == JOBS[-1][0].task_identifier
        assert document["time"].startswith("2024-06-18T11:26:4")


def test_the_clock_reading_is_the_log_records(monkeypatch: pytest.MonkeyPatch) -> None:
    assert logs._record_time is not None, f"no fast path on {sys.version}"
    for ns in INSTANTS:
        _clock(monkeypatch, ns)
        record = logging.LogRecord("x", logging.INFO, "", 0, "", (), None)
        assert logs._record_time() == (record.created, record.msecs)


def test_the_clock_formulas_by_python_version(monkeypatch: pytest.MonkeyPatch) -> None:
    final = logs._record_time_for
    assert final((3, 11, 7, "final", 0)) is final((3, 12, 1, "final", 0)) is logs._time_until_3_12
    assert final((3, 13, 0, "final", 0)) is logs._time_from_3_13
    for unknown in [(3, 10, 13, "final", 0), (3, 13, 0, "beta", 2), (3, 14, 0, "final", 0)]:
        assert final(unknown) is None
    # Python 3.13 reads nanoseconds: .1 s is 100 ms (3.11 says 99), and a reading
    # whose float rounds up to the next second has 0 ms.
    expected = {
        SECOND + 100_000_000: (1_718_710_000.1, 100.0),
        SECOND + 999_500_000: (1_718_710_000.9995, 999.0),
        SECOND + 999_999_999: (1_718_710_001.0, 0.0),
    }
    for ns, reading in expected.items():
        _clock(monkeypatch, ns)
        assert logs._time_from_3_13() == reading
    _clock(monkeypatch, SECOND + 100_000_000)
    assert logs._time_until_3_12() == (1_718_710_000.1, 99.0)


def test_settings_the_fast_path_reads_are_followed(
    monkeypatch: pytest.MonkeyPatch, fast_calls: list[object]
) -> None:
    _clock(monkeypatch, SECOND + 999_500_000)
    monkeypatch.setattr(logging.Formatter, "converter", time.gmtime)
    monkeypatch.setitem(logging._levelToName, logging.INFO, "INFORMATION")  # type: ignore[attr-defined]

    def tune() -> None:
        handler = logging.root.handlers[0]
        handler.terminator = "\r\n"  # type: ignore[attr-defined]
        assert handler.formatter is not None
        handler.formatter.default_msec_format = "%s.%03d"

    with configured() as out:
        tune()
        _succeed()
    assert out.getvalue() == _through_logging("text", tune)
    assert out.getvalue() == (
        "2024-06-18 11:26:40.999 INFORMATION "
        "Completed task 123 (noop, 0.05ms, attempt 1/25) with success\r\n"
    )
    with configured("json") as out:
        _succeed()
    assert out.getvalue() == _through_logging("json")
    assert json.loads(out.getvalue())["level"] == "information"
    assert len(fast_calls) == 2


def test_the_time_text_follows_the_second_and_the_time_zone(
    monkeypatch: pytest.MonkeyPatch, fast_calls: list[object]
) -> None:
    """The text before the milliseconds is kept for a second: lines in a row
    across second boundaries, and after the time zone changes, are still the
    ones logging prints."""

    def lines() -> list[str]:
        printed = []
        # Starts in the second the previous call ended in (a cached text).
        for ns in (SECOND + 1_500_000_000, SECOND + 999_000_000, SECOND + 1_000_000_000):
            _clock(monkeypatch, ns)
            with configured() as out:
                _succeed()
            assert out.getvalue() == _through_logging("text")
            printed.append(out.getvalue()[:23])
        return printed

    assert lines() == [
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(SECOND // 10**9 + s)) + f",{ms:03d}"
        for s, ms in ((1, 500), (0, 999), (1, 0))
    ]
    saved = os.environ.get("TZ")
    for zone in ("UTC0", "XXX-5:30", "YYY+7"):
        os.environ["TZ"] = zone
        time.tzset()
        try:
            shown = lines()
        finally:
            if saved is None:
                del os.environ["TZ"]
            else:
                os.environ["TZ"] = saved
            time.tzset()
        assert shown[0][11:19] == time.strftime(
            "%H:%M:%S", time.gmtime(SECOND // 10**9 + 1 + _offset(zone))
        )
    assert len(fast_calls) == 4 * 3


def _offset(zone: str) -> int:
    """Seconds east of UTC of a POSIX TZ value such as ``XXX-5:30`` (west is +)."""
    sign = -1 if zone[3] == "-" else 1
    hours, _, minutes = zone[3:].lstrip("+-").partition(":")
    return -sign * (int(hours) * 3600 + int(minutes or 0) * 60)


# --- When the fast path steps aside ----------------------------------------------------


def _assert_logging_only(fast_calls: list[object]) -> None:
    assert fast_calls == [], "the fast path wrote a line it should have left to logging"


def _drop(record: logging.LogRecord) -> bool:
    return False


def _edit(record: logging.LogRecord) -> bool:
    record.msg, record.args = "edited %s", ("line",)
    return True


@pytest.mark.parametrize("where", ["outcome", "handler"])
def test_a_filter_on_the_logger_or_handler_takes_effect(
    fast_calls: list[object], where: str
) -> None:
    for filter_ in (_drop, _edit):
        with configured() as out:
            target = logs.outcome_logger if where == "outcome" else logging.root.handlers[0]
            target.addFilter(filter_)
            _succeed()
        lines = out.getvalue().splitlines(keepends=True)
        if filter_ is _drop:
            assert lines == []
        else:
            [line] = lines
            assert line.endswith(" INFO edited line\n")
    _assert_logging_only(fast_calls)


@pytest.mark.parametrize("where", ["root", "graphile_worker"])
def test_a_filter_on_a_parent_logger_sends_the_line_through_logging(
    fast_calls: list[object], where: str
) -> None:
    # logging itself applies only the first logger's filters (a parent's do not
    # see propagated records), so the line is printed, but by logging.
    seen: list[logging.LogRecord] = []

    def add_filter() -> None:
        logger = logging.root if where == "root" else logs._parent_logger
        logger.addFilter(lambda record: bool(seen.append(record)))

    with configured() as out:
        add_filter()
        _succeed()
    _assert_logging_only(fast_calls)
    assert out.getvalue() == _through_logging("text", add_filter)
    assert "Completed task 123 " in out.getvalue()


@pytest.mark.parametrize("where", ["outcome", "graphile_worker", "root"])
def test_a_second_handler_on_the_way_gets_the_line(fast_calls: list[object], where: str) -> None:
    other = io.StringIO()
    with configured() as out:
        logger = {"outcome": logs.outcome_logger, "graphile_worker": logs._parent_logger}
        logger.get(where, logging.root).addHandler(logging.StreamHandler(other))
        _succeed()
    _assert_logging_only(fast_calls)
    assert other.getvalue() == "Completed task 123 (noop, 0.05ms, attempt 1/25) with success\n"
    assert out.getvalue().endswith(
        " INFO Completed task 123 (noop, 0.05ms, attempt 1/25) with success\n"
    )


def test_a_replaced_formatter_formats_the_line(fast_calls: list[object]) -> None:
    with configured("json") as out:
        logging.root.handlers[0].setFormatter(logging.Formatter("%(name)s|%(message)s"))
        _succeed()
    _assert_logging_only(fast_calls)
    assert out.getvalue() == (
        "graphile_worker.worker|Completed task 123 (noop, 0.05ms, attempt 1/25) with success\n"
    )


def test_a_record_factory_field_reaches_the_json(fast_calls: list[object]) -> None:
    make = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        record.colour = "blue"
        return record

    with configured("json") as out:
        logging.setLogRecordFactory(factory)
        _succeed()
    _assert_logging_only(fast_calls)
    document = json.loads(out.getvalue())
    assert (document["colour"], document["job_id"]) == ("blue", 123)


@pytest.mark.parametrize("level", [logging.WARNING, logging.INFO + 1])
def test_a_handler_level_above_info_drops_the_line(fast_calls: list[object], level: int) -> None:
    with configured() as out:
        logging.root.handlers[0].setLevel(level)
        _succeed()
    assert out.getvalue() == ""
    _assert_logging_only(fast_calls)


def test_no_line_when_logging_is_disabled(fast_calls: list[object]) -> None:
    def disable_logger() -> None:
        logs.outcome_logger.disabled = True

    for disable in (lambda: logging.disable(logging.INFO), disable_logger):
        with configured() as out:
            disable()
            _succeed()
        assert out.getvalue() == ""
    _assert_logging_only(fast_calls)


def test_a_wrapped_logging_method_sees_the_line(
    monkeypatch: pytest.MonkeyPatch, fast_calls: list[object]
) -> None:
    # As error trackers do (Sentry wraps Logger.callHandlers).
    seen: list[str] = []
    call_handlers = logging.Logger.callHandlers

    def wrapper(self: logging.Logger, record: logging.LogRecord) -> None:
        seen.append(record.getMessage())
        call_handlers(self, record)

    with configured() as out:
        monkeypatch.setattr(logging.Logger, "callHandlers", wrapper)
        _succeed()
    _assert_logging_only(fast_calls)
    assert seen == ["Completed task 123 (noop, 0.05ms, attempt 1/25) with success"]
    assert out.getvalue().endswith(f" INFO {seen[0]}\n")


@pytest.mark.parametrize("owner", ["handler", "formatter", "logger"])
def test_a_method_set_on_the_instance_is_used(fast_calls: list[object], owner: str) -> None:
    seen: list[logging.LogRecord] = []
    with configured() as out:
        handler = logging.root.handlers[0]
        formatter = handler.formatter
        assert formatter is not None
        if owner == "handler":
            handler.emit = seen.append  # type: ignore[method-assign]
        elif owner == "formatter":
            formatter.format = lambda record: "mine"  # type: ignore[method-assign]
        else:
            logs.outcome_logger.callHandlers = seen.append  # type: ignore[method-assign]
        _succeed()
    _assert_logging_only(fast_calls)
    if owner == "formatter":
        assert out.getvalue() == "mine\n"
    else:
        assert [r.getMessage() for r in seen] == [
            "Completed task 123 (noop, 0.05ms, attempt 1/25) with success"
        ]


def test_without_configure_lines_go_through_logging(
    fast_calls: list[object], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    _succeed()
    _assert_logging_only(fast_calls)
    [record] = [r for r in caplog.records if r.name == "graphile_worker.worker"]
    assert (record.job_id, record.duration_ms) == (123, 0.05)  # type: ignore[attr-defined]


# --- Errors and the JSON formatter ---------------------------------------------------


class _Broken(io.StringIO):
    def write(self, text: str) -> int:
        raise OSError("disk full")


def test_a_failed_write_goes_to_handle_error(
    monkeypatch: pytest.MonkeyPatch, fast_calls: list[object], capsys: pytest.CaptureFixture[str]
) -> None:
    def broken() -> None:
        logging.root.handlers[0].setStream(_Broken())  # type: ignore[attr-defined]

    for fast in (True, False):
        with pytest.MonkeyPatch.context() as patch, configured():
            if not fast:
                patch.setattr(logs, "_fast_target", lambda: None)
            broken()
            _succeed()  # does not raise
        report = capsys.readouterr().err
        assert report.startswith("--- Logging error ---\n"), report
        assert "OSError: disk full" in report
        assert "Message: 'Completed task %d (%s, %.2fms, attempt %d/%d) with success'\n" in report
        assert "Arguments: (123, 'noop', 0.05, 1, 25)\n" in report
    assert len(fast_calls) == 1


def test_the_json_formatter_prints_every_field_and_the_traceback() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        exc_info = sys.exc_info()
    extra = {
        "job_id": 5,
        "level": "a field named like a key of the line is left out",
        "when": datetime(2024, 1, 2, tzinfo=UTC),
        "exception": "replaced by the traceback, where it stands",
        "none": None,
        "ratio": 0.5,
    }
    record = logging.getLogger("graphile_worker.x").makeRecord(
        "graphile_worker.x", logging.ERROR, __file__, 1, "a %s é", ("b",), exc_info, extra=extra
    )
    line = logs.JsonFormatter().format(record)
    expected = {
        "time": datetime.fromtimestamp(record.created, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z"),
        "level": "error",
        "logger": "graphile_worker.x",
        "message": "a b é",
        "job_id": 5,
        "when": "2024-01-02 00:00:00+00:00",
        "exception": logging.Formatter().formatException(exc_info),
        "none": None,
        "ratio": 0.5,
    }
    assert line == json.dumps(expected, default=str, ensure_ascii=False)
    record.exc_info, record.stack_info = None, "Stack (most recent call last):\n  here"
    document = json.loads(logs.JsonFormatter().format(record))
    assert document["exception"] == extra["exception"]
    assert document["stack"] == record.stack_info


# --- More of the way: loggers, handler, formatter, writing ----------------------------


def test_the_logger_chain_is_followed(fast_calls: list[object]) -> None:
    other = io.StringIO()
    between = logging.Logger("between")
    between.addHandler(logging.StreamHandler(other))
    with configured() as out:
        between.parent = logs._parent_logger
        logs.outcome_logger.parent = between
        _succeed()
    assert other.getvalue().startswith("Completed task 123 ")
    assert " INFO Completed task 123 " in out.getvalue()
    with configured() as out:
        between.parent = logging.root
        logs._parent_logger.parent = between
        _succeed()
    assert other.getvalue().count("Completed task 123 ") == 2
    for logger in (logs.outcome_logger, logs._parent_logger):
        with configured() as out:
            logger.propagate = False  # the line stops before the root's handler
            _succeed()
        assert out.getvalue() == ""
    _assert_logging_only(fast_calls)


def test_a_disabled_parent_logger_sends_the_line_through_logging(fast_calls: list[object]) -> None:
    with configured() as out:
        logs._parent_logger.disabled = True  # logging prints the line all the same
        _succeed()
    _assert_logging_only(fast_calls)
    assert " INFO Completed task 123 " in out.getvalue()


def test_another_root_handler_gets_the_line(fast_calls: list[object]) -> None:
    other = io.StringIO()
    with configured() as out:
        logging.basicConfig(force=True, handlers=[logging.StreamHandler(other)])
        _succeed()
    _assert_logging_only(fast_calls)
    assert out.getvalue() == ""
    assert other.getvalue() == (
        "INFO:graphile_worker.worker:Completed task 123 (noop, 0.05ms, attempt 1/25) with success\n"
    )


def test_a_handler_or_formatter_of_another_class_or_a_lock_is_used(
    fast_calls: list[object],
) -> None:
    class Counting(logging.StreamHandler):  # type: ignore[type-arg]
        def emit(self, record: logging.LogRecord) -> None:
            super().emit(record)
            self.stream.write("counted\n")

    events: list[str] = []

    class Lock:  # what Handler.acquire and release call (3.11, 3.12), or `with` (3.13)
        def acquire(self) -> None:
            events.append("acquire")

        def release(self) -> None:
            events.append("release")

        def __enter__(self) -> None:
            self.acquire()

        def __exit__(self, *exc: object) -> None:
            self.release()

    class Upper(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            return super().format(record).upper()

    with configured() as out:
        logging.root.handlers[0].__class__ = Counting
        _succeed()
    assert out.getvalue().endswith(" with success\ncounted\n")
    for log_format in logs.LOG_FORMATS:
        with configured(log_format) as out:
            logging.root.handlers[0].formatter.__class__ = Upper  # type: ignore[union-attr]
            _succeed()
        # JsonFormatter() has the default format string, "%(message)s".
        start = "COMPLETED" if log_format == "json" else "2024-06-1"
        assert out.getvalue().startswith(start)
        assert out.getvalue().endswith(
            "COMPLETED TASK 123 (NOOP, 0.05MS, ATTEMPT 1/25) WITH SUCCESS\n"
        )
    with configured() as out:
        logging.root.handlers[0].lock = Lock()  # type: ignore[assignment]
        _succeed()
    assert out.getvalue().endswith(" with success\n")
    assert events == ["acquire", "acquire", "release", "release"]  # Handler.handle, flush
    _assert_logging_only(fast_calls)


class _Loud(logging.PercentStyle):
    def format(self, record: logging.LogRecord) -> str:
        return super().format(record) + "!"


def _set_formatter(**attributes: object) -> Callable[[], None]:
    def change() -> None:
        formatter = logging.root.handlers[0].formatter
        for name, value in attributes.items():
            setattr(formatter, name, value)

    return change


@pytest.mark.parametrize(
    "change,start,end",
    [
        (_set_formatter(datefmt="%Y"), "2024 INFO Completed", "success\n"),
        (_set_formatter(_style=logging.PercentStyle("%(levelname)s: %(message)s")), "INFO: ", "\n"),
        (_set_formatter(_style=_Loud(logs.TEXT_FORMAT)), "2024-06-1", " success!\n"),
    ],
    ids=["datefmt", "format", "style"],
)
def test_a_date_format_or_format_string_is_used(
    monkeypatch: pytest.MonkeyPatch,
    fast_calls: list[object],
    change: Callable[[], None],
    start: str,
    end: str,
) -> None:
    _clock(monkeypatch, SECOND)
    with configured() as out:
        change()
        _succeed()
    assert out.getvalue().startswith(start) and out.getvalue().endswith(end)
    assert out.getvalue() == _through_logging("text", change)
    _assert_logging_only(fast_calls)


def test_wrapped_methods_at_import_mean_no_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    assert logs._genuine_methods() == logs._path_methods()
    call_handlers = logging.Logger.callHandlers
    monkeypatch.setattr(logging.Logger, "callHandlers", lambda *a: call_handlers(*a))
    assert logs._genuine_methods() is None


@pytest.mark.parametrize("log_format", logs.LOG_FORMATS)
def test_one_write_and_a_flush_under_the_lock(
    monkeypatch: pytest.MonkeyPatch, fast_calls: list[object], log_format: logs.LogFormat
) -> None:
    _clock(monkeypatch, SECOND + 500_000)
    streams = [_Recording(), _Recording()]
    for stream, fast in zip(streams, (True, False), strict=True):
        with pytest.MonkeyPatch.context() as patch, configured(log_format):
            if not fast:
                patch.setattr(logs, "_fast_target", lambda: None)
            logging.root.handlers[0].setStream(stream)  # type: ignore[attr-defined]
            _succeed()
    assert streams[0].events == streams[1].events
    assert [(kind, locked) for kind, _, locked in streams[0].events] == [
        ("write", True),
        ("flush", True),
    ]
    assert len(fast_calls) == 1
