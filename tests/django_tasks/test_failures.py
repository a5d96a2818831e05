"""What a task raises becomes its TaskResult's error, whatever it is (any
text, any size, any exception type)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from conftest import log_lines, manage
from dbhelpers import value

from worker_cli.contrib.django.storable import MAX_ERRORS, MAX_TRACEBACK

pytestmark = pytest.mark.db

JOBS = "graphile_worker._private_jobs"
RESULTS = "graphile_worker._private_py_django_results"


def run_once() -> str:
    done = manage("graphile_worker", "--once")
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def result(result_id: str):  # type: ignore[no-untyped-def]
    from django.tasks import task_backends

    return task_backends["default"].get_result(result_id)


def finished_signals(result_id: str) -> list[str]:
    return [
        line.split()[-1] for line in log_lines() if line.startswith(f"signal finished {result_id} ")
    ]


def test_whatever_a_task_raises_is_its_error(site: str) -> None:
    """NUL and lone surrogates (escaped), BaseExceptions, str() raising, a
    class name jsonb cannot hold, a 3 MB message (bounded): each task is
    FAILED with its own error, and task_finished is sent for it."""
    from django.tasks import TaskResultStatus
    from jobsapp.tasks import async_fail, fail, raises

    cases: list[tuple[Any, tuple[Any, ...], str, str]] = [
        (fail, ("a\x00b",), "builtins.ValueError", "ValueError: a\\x00b\n"),
        (fail, ("a\udc80b",), "builtins.ValueError", "ValueError: a\\udc80b\n"),
        (async_fail, ("c\x00d\ud800",), "builtins.ValueError", "ValueError: c\\x00d\\ud800\n"),
        (raises, ("system_exit",), "builtins.SystemExit", "SystemExit: 3\n"),
        (raises, ("keyboard_interrupt",), "builtins.KeyboardInterrupt", "KeyboardInterrupt\n"),
        (
            raises,
            ("base",),
            "jobsapp.tasks.NotAnException",
            "jobsapp.tasks.NotAnException: not an Exception\n",
        ),
        (
            raises,
            ("unprintable",),
            "jobsapp.tasks.Unprintable",
            "jobsapp.tasks.Unprintable: <exception str() failed>\n",
        ),
        (
            raises,
            ("badly_named",),
            "jobsapp.tasks\\udc80.Bad\\x00Name",
            "jobsapp.tasks\\udc80.Bad\\x00Name: badly named\n",
        ),
        (raises, ("huge", 3_000_000), "builtins.ValueError", "x end\n"),
    ]
    enqueued = [(task.enqueue(*args), path, end) for task, args, path, end in cases]
    run_once()
    for one, path, end in enqueued:
        done = result(one.id)
        assert done.status == TaskResultStatus.FAILED, (path, done.errors)
        [error] = done.errors
        assert error.exception_class_path == path
        assert error.traceback.endswith(end), (path, error.traceback[-300:])
        assert len(error.traceback) <= MAX_TRACEBACK
        assert "\x00" not in error.traceback
        assert finished_signals(one.id) == ["FAILED"], path
    huge = result(enqueued[-1][0].id).errors[0].traceback
    assert huge.startswith("Traceback (most recent call last):\n")
    assert "characters left out" in huge and "ValueError: start xxx" in huge
    # Each task ran once; the worker went on to the next.
    assert len([line for line in log_lines() if line.startswith("raises")]) == 6


def test_any_text_survives_as_arguments_and_return_value(site: str) -> None:
    """Arguments and return values keep NUL and lone surrogates as given (the
    json columns keep their escapes); this held before, and must go on."""
    from django.tasks import TaskResultStatus
    from jobsapp.tasks import echo

    text = "a\x00b\udc80c\U0001f600"
    enqueued = echo.enqueue(text)
    assert echo.get_result(enqueued.id).args == [text]
    run_once()
    done = result(enqueued.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == text


def test_the_errors_kept_are_bounded(site: str) -> None:
    """A result with MAX_ERRORS errors already: one more failure keeps the
    first and the latest, MAX_ERRORS in all."""
    from django.tasks import TaskResultStatus

    forged = str(uuid.uuid4())
    old = [
        {"exception_class_path": "builtins.ValueError", "traceback": f"ValueError: {n}\n"}
        for n in range(MAX_ERRORS)
    ]
    value(
        site,
        f"insert into {RESULTS} (id, job_id, backend, queue_name, task_path, priority, "
        "args, kwargs, errors, worker_ids) select %s, j.id, 'default', 'default', "
        "'jobsapp.tasks.fail', 0, %s, '{}', %s, %s "
        "from graphile_worker.add_job('django:default', %s::json, max_attempts => %s) j "
        "returning 1",
        [
            forged,
            json.dumps(["the last one"]),
            json.dumps(old),
            ["w"] * MAX_ERRORS,
            json.dumps({"result_id": forged}),
            MAX_ERRORS + 1,
        ],
    )
    value(site, f"update {JOBS} set attempts = %s returning 1", [MAX_ERRORS])
    run_once()
    done = result(forged)
    assert done.status == TaskResultStatus.FAILED and done.attempts == MAX_ERRORS + 1
    tracebacks = [error.traceback.splitlines()[-1] for error in done.errors]
    assert len(tracebacks) == MAX_ERRORS
    assert tracebacks[0] == "ValueError: 0" and tracebacks[1] == "ValueError: 2"
    assert tracebacks[-2:] == [f"ValueError: {MAX_ERRORS - 1}", "ValueError: the last one"]
