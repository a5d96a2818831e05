"""What the worker runs for a job of ``django:<queue>``: the Django Task its
result row names, with Django's signals and connection handling around it.

It is a plain ``def`` task, so each job runs in its slot's thread: a sync
Django task is called there (``close_old_connections()`` before and after,
as Django does around a request), an async one is awaited on the worker's
event loop. The row is written through the worker's own pool: RUNNING when
the attempt starts, then SUCCESSFUL, READY (it will run again) or FAILED.
Only a Django ``Task`` object is ever called: a job naming anything else
(``subprocess.check_output``) fails for good and runs nothing.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import traceback
import uuid
from collections.abc import Callable, Sequence
from typing import Any, LiteralString

from django.db import close_old_connections
from django.tasks.base import TaskContext, TaskResult
from django.tasks.signals import task_finished, task_started
from django.utils.json import normalize_json

from ...tasks.helpers import Helpers
from ...tasks.retry import Cancel, Discard
from . import statements
from .results import StoredResult, django_time, error_record, lost_attempt

__all__ = ["make_task_runner"]


def make_task_runner(schema: str, sender: type) -> Callable[[Any, Helpers], None]:
    """The task function of the ``django:<queue>`` identifiers: results in
    ``schema``, signals sent by ``sender`` (the backend's class)."""

    def run_django_task(payload: Any, helpers: Helpers) -> None:
        def one_row(statement: LiteralString, *params: Any) -> tuple[Any, ...] | None:
            return helpers.run(_one_row(helpers, statement, schema, params))

        def mark_failed(status: str, error: dict[str, str]) -> Any:
            row = one_row(statements.mark_failed, status, json.dumps([error]), result_id)
            return None if row is None else row[0]

        result_id = _result_id(payload)
        lost = json.dumps([lost_attempt()])
        row = one_row(statements.mark_running, lost, helpers.worker_id, result_id)
        if row is None:
            found = one_row(statements.read_status, result_id)
            if found is None:
                raise Discard(f"no Django task result {result_id} for this job")
            # Its outcome was written, but not the job's completion (the worker
            # stopped in between): the task is not run again.
            helpers.logger.info("Django task %s is %s already: not run again", result_id, found[0])
            return
        try:
            stored = StoredResult.from_row(row)
            task = stored.task()
        except Exception as exc:  # cannot start (unreadable row, not a Task): for good
            mark_failed("FAILED", _error(exc))
            raise Discard(f"cannot run Django task result {result_id}: {exc}") from exc
        running = stored.task_result(task)
        close_old_connections()
        try:
            task_started.send(sender=sender, task_result=running)
            args = (
                (TaskContext(task_result=running), *stored.args)
                if task.takes_context
                else (*stored.args,)
            )
            if inspect.iscoroutinefunction(task.func):
                value = helpers.run(task.acall(*args, **stored.kwargs))
            else:
                value = task.call(*args, **stored.kwargs)
            value = normalize_json(value)
            value_json = json.dumps(value, allow_nan=False)
        except BaseException as exc:
            job = helpers.job
            # No attempt follows the last one, a cancel, or a task's Discard or Cancel.
            final = (
                job.attempts >= job.max_attempts
                or helpers.cancelled
                or isinstance(exc, Discard | Cancel)
            )
            status = "FAILED" if final else "READY"
            error = _error(exc)
            finished_at = mark_failed(status, error)
            if final:
                failed = _after(stored, running, status, finished_at, error=error)
                task_finished.send(sender=sender, task_result=failed.task_result(task))
            raise
        else:
            done_row = one_row(statements.mark_successful, value_json, result_id)
            finished_at = None if done_row is None else done_row[0]
            done = _after(stored, running, "SUCCESSFUL", finished_at, value=value)
            task_finished.send(sender=sender, task_result=done.task_result(task))
        finally:
            close_old_connections()

    return run_django_task


def _result_id(payload: Any) -> str:
    raw = payload.get("result_id") if isinstance(payload, dict) else None
    try:
        return str(uuid.UUID(raw))
    except (TypeError, ValueError, AttributeError):
        raise Discard("not a Django task job: its payload has no valid result_id") from None


def _error(exc: BaseException) -> dict[str, str]:
    kind = type(exc)
    return error_record(
        f"{kind.__module__}.{kind.__qualname__}", "".join(traceback.format_exception(exc))
    )


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
        errors=[*stored.errors, error] if error else stored.errors,
    )


async def _one_row(
    helpers: Helpers, statement: LiteralString, schema: str, params: Sequence[Any]
) -> tuple[Any, ...] | None:
    """``statement`` run on the worker's pool; its first row (None: no row)."""
    async with helpers.with_pg_client() as conn:
        cursor = await conn.execute(statements.compose(statement, schema), params)
        return await cursor.fetchone()
