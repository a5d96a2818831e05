"""Success lines of one event-loop iteration go out in one write
(worker_cli.observe.line_handler), in the order logging would have written them."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from log_recording import JOBS, SECOND, _clock, _Recording, _through_logging, configured

from worker_cli.jobs.job import Job
from worker_cli.observe import log_output as logs

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    _clock(monkeypatch, SECOND + 123_456_789)


@contextmanager
def recorded() -> Iterator[_Recording]:
    """``logs.configure`` to a recording stream (inside the test: pytest adds
    its own handler to the root logger for the test's call)."""
    with configured():
        stream = _Recording()
        logging.root.handlers[0].setStream(stream)  # type: ignore[attr-defined]
        yield stream


def _succeed(job: Job) -> None:
    logs.job_succeeded(job, "worker-1", "pool-1", 0.05)


def _expected(jobs: list[Job]) -> str:
    """What logging prints for the success lines of ``jobs``, one by one."""
    return "".join(_through_logging("text", job=job, duration_ms=0.05) for job in jobs)


def _writes(stream: _Recording) -> list[str]:
    return [text for kind, text, _ in stream.events if kind == "write"]


JOB_LIST = [job for job, _ in JOBS]


def test_the_lines_of_one_iteration_are_written_together() -> None:
    with recorded() as recording:

        async def drain() -> tuple[list[str], list[str]]:
            for job in JOB_LIST:
                _succeed(job)
            before = _writes(recording)
            await asyncio.sleep(0)  # the loop's next iteration
            return before, _writes(recording)

        before, after = asyncio.run(drain())
        assert before == []
        assert after == [_expected(JOB_LIST)]
        # The write, then a flush, both under the handler's lock.
        assert [(kind, locked) for kind, _, locked in recording.events] == [
            ("write", True),
            ("flush", True),
        ]


def test_a_record_logged_after_a_queued_line_is_written_after_it() -> None:
    with recorded() as recording:

        async def log_between() -> None:
            _succeed(JOB_LIST[0])
            logging.getLogger("app").warning("from the event loop")
            _succeed(JOB_LIST[1])
            # From another thread, while the loop waits for it (no iteration ends).
            thread = threading.Thread(target=logging.getLogger("app").warning, args=("a thread",))
            thread.start()
            thread.join()
            _succeed(JOB_LIST[2])
            await asyncio.sleep(0)

        asyncio.run(log_between())
        lines = recording.getvalue().splitlines(keepends=True)
        assert [line.split(" ", 3)[3] for line in lines] == [
            f"Completed task {JOB_LIST[0].id} (noop, 0.05ms, attempt 1/25) with success\n",
            "from the event loop\n",
            lines[2].split(" ", 3)[3],
            "a thread\n",
            lines[4].split(" ", 3)[3],
        ]
        assert "".join(lines[i] for i in (0, 2, 4)) == _expected(JOB_LIST)


def test_a_flush_of_the_handler_writes_the_queued_lines() -> None:
    with recorded() as recording:

        async def flush_early() -> str:
            _succeed(JOB_LIST[0])
            logging.root.handlers[0].flush()
            return recording.getvalue()

        assert asyncio.run(flush_early()) == _expected(JOB_LIST[:1])


def test_off_an_event_loop_a_line_is_written_at_once() -> None:
    with recorded() as recording:
        _succeed(JOB_LIST[0])
        assert _writes(recording) == [_expected(JOB_LIST[:1])]


def test_a_line_from_another_loop_writes_the_queue_first() -> None:
    """A second event loop (another thread) finds a write scheduled on the first:
    it writes the queue and its own line at once, in order."""
    with recorded() as recording:

        def other_loop() -> None:
            async def succeed() -> None:
                _succeed(JOB_LIST[1])

            asyncio.run(succeed())

        async def two_loops() -> list[str]:
            _succeed(JOB_LIST[0])
            thread = threading.Thread(target=other_loop)
            thread.start()
            thread.join()
            written = _writes(recording)
            await asyncio.sleep(0)
            return written

        assert asyncio.run(two_loops()) == [_expected(JOB_LIST[:2])]
        assert _writes(recording) == [_expected(JOB_LIST[:2])]


class _Broken(io.StringIO):
    def write(self, text: str) -> int:
        raise OSError("disk full")


def test_a_failed_write_reports_each_line(capsys: pytest.CaptureFixture[str]) -> None:
    async def fail() -> None:
        for job in JOB_LIST:
            _succeed(job)
        await asyncio.sleep(0)

    with configured():
        logging.root.handlers[0].setStream(_Broken())  # type: ignore[attr-defined]
        asyncio.run(fail())
    report = capsys.readouterr().err
    assert report.count("--- Logging error ---\n") == len(JOB_LIST)
    assert report.count("OSError: disk full") == len(JOB_LIST)
    for job in JOB_LIST:
        assert f"Arguments: ({job.id}, {job.task_identifier!r}, 0.05, " in report


def test_logging_shutdown_at_exit_writes_the_queued_lines() -> None:
    """The command line's last resort (a task thread that never returns) calls
    ``logging.shutdown()`` and ``os._exit()`` from the event loop: the lines
    queued in that iteration are written."""
    script = (
        "import asyncio, logging, os\n"
        "from worker_cli.observe import log_output as logs\n"
        "from worker_cli.jobs.job import Job\n"
        "logs.configure('text', debug=False)\n"
        "values = dict.fromkeys(Job._fields)\n"
        "values.update(id=7, task_identifier='noop', attempts=1, max_attempts=25)\n"
        "async def main():\n"
        "    logs.job_succeeded(Job(**values), 'worker-1', 'pool-1', 0.05)\n"
        "    logging.shutdown()\n"
        "    os._exit(3)\n"
        "asyncio.run(main())\n"
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NO_LOG_SUCCESS": ""},
    )
    assert done.returncode == 3, done.stderr
    assert done.stderr.endswith(
        "INFO Completed task 7 (noop, 0.05ms, attempt 1/25) with success\n"
    ), (done.stderr, time.monotonic() - started)
