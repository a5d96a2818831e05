"""What a task raises becomes its TaskResult's error, whatever it is (any
text, any size, any exception type), and a failed task retried with
``graphile-worker retry`` runs again, its TaskResult and its job agreeing."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import log_lines, manage
from dbhelpers import cli_path, rows, value

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


def cli(*args: str) -> str:
    """``graphile-worker ARGS`` on the test database, as a user runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["DATABASE_URL"] = os.environ["DJANGO_DATABASE_URL"]
    done = subprocess.run(
        [cli_path(), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def job_id_of(site: str, result_id: str) -> int:
    return int(value(site, f"select job_id from {RESULTS} where id = %s", [result_id]))


def test_retrying_a_failed_task_runs_it_again(site: str, tmp_path: Path) -> None:
    """``graphile-worker retry`` of a FAILED task: READY, then it runs again
    (RUNNING, then SUCCESSFUL or FAILED), its errors kept; the job's state
    always agrees with the TaskResult."""
    from django.tasks import TaskResultStatus
    from jobsapp.tasks import fails_while

    marker = tmp_path / "failing"
    marker.touch()
    enqueued = fails_while.enqueue(str(marker))
    job_id = job_id_of(site, enqueued.id)
    run_once()
    assert result(enqueued.id).status == TaskResultStatus.FAILED

    assert "Retried 1 job" in cli("retry", str(job_id), "--yes")
    waiting = result(enqueued.id)
    assert waiting.status == TaskResultStatus.READY and waiting.finished_at is None
    assert len(waiting.errors) == 1
    run_once()  # fails again
    failed = result(enqueued.id)
    assert failed.status == TaskResultStatus.FAILED and failed.attempts == 2
    assert [e.traceback.splitlines()[-1] for e in failed.errors] == [
        "RuntimeError: attempt 1 fails",
        "RuntimeError: attempt 2 fails",
    ]
    assert cli("job", str(job_id)).splitlines()[0] == f"Job {job_id}: failed"
    # More attempts for its job: it will run again too.
    cli("reschedule", str(job_id), "--max-attempts", "3", "--yes")
    assert result(enqueued.id).status == TaskResultStatus.READY

    marker.unlink()
    cli("retry", str(job_id), "--yes")
    run_once()  # succeeds
    done = result(enqueued.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 3
    assert done.attempts == 3 and len(done.errors) == 2
    assert [line for line in log_lines() if line.startswith("fails_while")] == [
        "fails_while 1",
        "fails_while 2",
        "fails_while 3",
    ]
    assert finished_signals(enqueued.id) == ["FAILED", "FAILED", "SUCCESSFUL"]
    started = [line for line in log_lines() if line.startswith(f"signal started {enqueued.id}")]
    assert [line.split()[-1] for line in started] == ["RUNNING"] * 3
    assert value(site, f"select count(*) from {JOBS}") == 0
    assert cli("job", str(job_id)).splitlines()[0] == f"Job {job_id}: succeeded"


def test_a_failed_task_whose_job_runs_on_is_not_run_again(site: str) -> None:
    """The worker wrote FAILED (a Discard), then stopped before failing its
    job for good: the job runs again (attempts left, none given back), the
    task does not, and the job fails for good (never "succeeded")."""
    from django.tasks import TaskResultStatus
    from jobsapp.tasks import gives_up

    enqueued = gives_up.enqueue("enough")
    job_id = job_id_of(site, enqueued.id)
    run_once()
    assert result(enqueued.id).status == TaskResultStatus.FAILED
    # As the worker's death left it: its first attempt counted, of 3.
    value(site, f"update {JOBS} set attempts = 1, last_error = null, run_at = now() returning 1")
    out = run_once()
    assert "FAILED already" in out
    done = result(enqueued.id)
    assert done.status == TaskResultStatus.FAILED and done.attempts == 1
    assert len(done.errors) == 1
    [job] = rows(site, f"select attempts, max_attempts, last_error from {JOBS}")
    assert job["attempts"] == job["max_attempts"] and "FAILED already" in job["last_error"]
    assert cli("job", str(job_id)).splitlines()[0] == f"Job {job_id}: failed"


def test_a_task_finished_receiver_that_raises_changes_no_outcome(site: str) -> None:
    """A receiver of task_finished raising (the project's raises for these
    arguments) is logged; the failed task's job keeps the task's own error,
    and the task that succeeded is done, not retried."""
    from django.tasks import TaskResultStatus
    from jobsapp.tasks import fail, record

    failed, succeeded = fail.enqueue("receiver raises"), record.enqueue("receiver raises")
    failed_job, succeeded_job = job_id_of(site, failed.id), job_id_of(site, succeeded.id)
    output = run_once()
    assert result(failed.id).status == TaskResultStatus.FAILED
    assert result(succeeded.id).status == TaskResultStatus.SUCCESSFUL
    last_error = value(site, f"select last_error from {JOBS} where id = %s", [failed_job])
    assert last_error is not None and "ValueError: receiver raises" in last_error, last_error
    assert "the receiver failed" not in last_error
    assert value(site, f"select count(*) from {JOBS} where id = %s", [succeeded_job]) == 0
    assert finished_signals(failed.id) == ["FAILED"]
    assert finished_signals(succeeded.id) == ["SUCCESSFUL"]
    for one in (failed, succeeded):
        assert (
            f"Django task {one.id}: a task_finished receiver (" in output
            and "raised: RuntimeError: the receiver failed" in output
        ), output
