"""What the worker runs for a job of ``django:<queue>``: the Django Task its
result row names, with Django's signals and connection handling around it.

It is a plain ``def`` task, so each job runs in its slot's thread: a sync
Django task is called there (``close_old_connections()`` before and after,
as Django does around a request, unless a connection is inside an atomic
block: a test's, when :func:`worker_cli.testing.run_jobs` runs the job in a
``TestCase``'s transaction), an async one is awaited on the worker's event
loop. The row is written through the worker's own pool: RUNNING when
the attempt starts, then SUCCESSFUL, READY (it will run again) or FAILED.
Only a Django ``Task`` object is ever called: a job naming anything else
(``subprocess.check_output``) fails for good and runs nothing.
"""

from __future__ import annotations

import dataclasses
import inspect
import uuid
from collections.abc import Callable, Sequence
from typing import Any, LiteralString

from django.db import close_old_connections, connections
from django.tasks.base import TaskContext, TaskResult
from django.tasks.signals import task_finished, task_started

from ...sql import compose
from ...sql import django as django_sql
from ...tasks.helpers import Helpers
from ...tasks.retry_policy import Cancel, Discard
from .storable import MAX_ERRORS, error_of, errors_json, json_text, kept_errors, storable_text
from .task_results import StoredResult, django_time, lost_attempt

__all__ = ["make_task_runner"]


def make_task_runner(schema: str, sender: type) -> Callable[[Any, Helpers], None]:
    """The task function of the ``django:<queue>`` identifiers: results in
    ``schema``, signals sent by ``sender`` (the backend's class)."""

    def run_django_task(payload: Any, helpers: Helpers) -> None:
        def one_row(statement: LiteralString, *params: Any) -> tuple[Any, ...] | None:
            return helpers.run(_one_row(helpers, statement, schema, params))

        def mark_failed(status: str, error: dict[str, str]) -> Any:
            row = one_row(
                django_sql.MARK_FAILED, status, errors_json([error]), MAX_ERRORS, result_id
            )
            return None if row is None else row[0]

        result_id = _result_id(payload)
        job = helpers.job
        row = one_row(
            django_sql.MARK_RUNNING,
            errors_json([lost_attempt()]),
            MAX_ERRORS,
            storable_text(helpers.worker_id),
            job.max_attempts - job.attempts,
            result_id,
        )
        if row is None:
            _not_run_again(helpers, one_row(django_sql.READ_STATUS, result_id), result_id)
            return
        try:
            stored = StoredResult.from_row(row)
            task = stored.task()
        except BaseException as exc:  # cannot start (unreadable row, not a Task): for good
            error = error_of(exc)
            mark_failed("FAILED", error)
            raise Discard(
                f"cannot run Django task result {result_id}: {_last_line(error)}"
            ) from exc
        running = stored.task_result(task)
        _close_old_connections()
        try:
            task_started.send(sender=sender, task_result=running)
            value, value_json = json_text(_call(task, stored, running, helpers), "return")
            # A return value the server refuses is this attempt's failure.
            done_row = one_row(django_sql.MARK_SUCCESSFUL, value_json, result_id)
        except BaseException as exc:  # whatever the task raised (SystemExit too)
            # No attempt follows the last one, a cancel, or a task's Discard or Cancel.
            final = (
                job.attempts >= job.max_attempts
                or helpers.cancelled
                or isinstance(exc, Discard | Cancel)
            )
            status = "FAILED" if final else "READY"
            error = error_of(exc)
            try:
                finished_at = mark_failed(status, error)
            except Exception as unwritten:  # the job's own failure still says what happened
                helpers.logger.error(
                    "Django task %s: its error could not be written: %s",
                    result_id,
                    _last_line(error_of(unwritten)),
                )
                finished_at = None
            if final:
                failed = _after(stored, running, status, finished_at, error=error)
                _send_finished(sender, failed.task_result(task), helpers)
            raise
        else:
            finished_at = None if done_row is None else done_row[0]
            done = _after(stored, running, "SUCCESSFUL", finished_at, value=value)
            _send_finished(sender, done.task_result(task), helpers)
        finally:
            _close_old_connections()

    return run_django_task


def _close_old_connections() -> None:
    """Django's ``close_old_connections()``, unless a connection of this thread
    is inside an atomic block: a test's transaction (``TestCase``, with the job
    run by :func:`worker_cli.testing.run_jobs`), which closing would break."""
    if not any(conn.in_atomic_block for conn in connections.all(initialized_only=True)):
        close_old_connections()


def _send_finished(sender: Any, task_result: TaskResult, helpers: Helpers) -> None:
    """Send ``task_finished`` for an outcome already written: a receiver that
    raises is logged, and changes neither that outcome nor the job's (the
    task's own error stays the job's; a task that succeeded is not retried)."""
    for receiver, response in task_finished.send_robust(sender=sender, task_result=task_result):
        if isinstance(response, Exception):
            helpers.logger.error(
                "Django task %s: a task_finished receiver (%s) raised: %s",
                task_result.id,
                getattr(receiver, "__qualname__", receiver),
                _last_line(error_of(response)),
            )


def _call(task: Any, stored: StoredResult, running: TaskResult, helpers: Helpers) -> Any:
    """Call the Django task with its arguments (its context first, if it takes
    one); an ``async def`` one on the worker's event loop."""
    args = (TaskContext(task_result=running), *stored.args) if task.takes_context else stored.args
    if inspect.iscoroutinefunction(task.func):
        return helpers.run(task.acall(*args, **stored.kwargs))
    return task.call(*args, **stored.kwargs)


def _not_run_again(helpers: Helpers, found: tuple[Any, ...] | None, result_id: str) -> None:
    """A job whose result is finished runs again: the task does not. Its
    outcome was written, but not the job's (the worker stopped in between).
    SUCCESSFUL: the job completes. FAILED (and it was not retried: it has
    fewer attempts left than when the task last ran, see ``mark_running``):
    the job fails for good, as its result says."""
    if found is None:
        raise Discard(f"no Django task result {result_id} for this job")
    if found[0] == "SUCCESSFUL":
        helpers.logger.info("Django task %s is SUCCESSFUL already: not run again", result_id)
        return
    raise Discard(
        f"Django task {result_id} is {found[0]} already (an earlier attempt of this job "
        "wrote it): not run again"
    )


def _last_line(error: dict[str, str]) -> str:
    """The last line of an error record's traceback (its exception's, bounded)."""
    lines = error["traceback"].splitlines()
    return lines[-1] if lines else error["exception_class_path"]


def _result_id(payload: Any) -> str:
    raw = payload.get("result_id") if isinstance(payload, dict) else None
    try:
        return str(uuid.UUID(raw))
    except (TypeError, ValueError, AttributeError):
        raise Discard("not a Django task job: its payload has no valid result_id") from None


def _after(
    stored: StoredResult,
    running: TaskResult,
    status: str,
    finished_at: Any,
    *,
    value: Any = None,
    error: dict[str, str] | None = None,
) -> StoredResult:
    """The row as the attempt left it (what was just written)."""
    return dataclasses.replace(
        stored,
        status=status,
        started_at=running.started_at,
        last_attempted_at=running.last_attempted_at,
        finished_at=django_time(finished_at),
        return_value=value,
        errors=kept_errors([*stored.errors, error]) if error else stored.errors,
    )


async def _one_row(
    helpers: Helpers, statement: LiteralString, schema: str, params: Sequence[Any]
) -> tuple[Any, ...] | None:
    """``statement`` run on the worker's pool; its first row (None: no row)."""
    async with helpers.with_pg_client() as conn:
        cursor = await conn.execute(compose(statement, schema), params)
        return await cursor.fetchone()
