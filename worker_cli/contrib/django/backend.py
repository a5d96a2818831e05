"""``GraphileWorkerBackend``: Django's Tasks framework (``django.tasks``) on
graphile-worker's queue.

``enqueue`` adds a job of the task identifier ``django:<queue name>`` and its
result row in one statement, on the configured database alias and so in the
caller's transaction (rolled back: nothing runs; not seen by workers before
commit). ``get_result`` reads the row back with its job's state. The worker
is ``python manage.py graphile_worker`` (:mod:`.command`).
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections
from django.tasks import Task
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskResult, TaskResultStatus
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils import timezone

from ...config.database import schema_name_problem
from ...sql import django as django_sql
from ...sql import render
from .names import MAX_QUEUE_NAME, identifier_of
from .storable import json_text
from .task_results import StoredResult, django_time, in_an_installed_app

__all__ = ["GraphileWorkerBackend", "GraphileWorkerTask"]

#: max_attempts is a smallint.
MAX_ATTEMPTS = 32_767
#: The OPTIONS keys and their defaults.
DEFAULT_OPTIONS: dict[str, Any] = {
    "database": "default",
    "schema": "graphile_worker",
    "max_attempts": 1,
    "keep_results_days": 14,
}
#: SQLSTATEs of a missing schema, table or function: not installed.
_NOT_INSTALLED = frozenset({"3F000", "42P01", "42883"})


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphileWorkerTask(Task):  # type: ignore[misc]
    """The backend's Task: Django's, plus ``max_attempts`` (Django 6.1:
    ``@task(max_attempts=5)``), the attempts a job of it gets before it is
    FAILED (None: the backend's ``OPTIONS["max_attempts"]``, default 1)."""

    max_attempts: int | None = None


class GraphileWorkerBackend(BaseTaskBackend):  # type: ignore[misc]
    """Django Tasks on graphile-worker. ``OPTIONS``: ``database`` (the Django
    database alias, default ``"default"``), ``schema`` (default
    ``graphile_worker``), ``max_attempts`` (default 1: a failure is FAILED),
    ``keep_results_days`` (finished results are deleted after this many days,
    default 14; None keeps them)."""

    task_class = GraphileWorkerTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        where = f"TASKS[{alias!r}]['OPTIONS']"
        unknown = sorted(set(self.options) - set(DEFAULT_OPTIONS))
        if unknown:
            raise ImproperlyConfigured(
                f"{where}: unknown key {', '.join(map(repr, unknown))} "
                f"(known: {', '.join(DEFAULT_OPTIONS)})"
            )
        options = {**DEFAULT_OPTIONS, **self.options}
        self.database: str = options["database"]
        self.schema: str = options["schema"]
        self.max_attempts: int = options["max_attempts"]
        self.keep_results_days: float | None = options["keep_results_days"]
        if not isinstance(self.database, str) or not self.database:
            raise ImproperlyConfigured(f"{where}['database'] must be a database alias")
        problem = (
            schema_name_problem(self.schema)
            if isinstance(self.schema, str)
            else "must be a schema name"
        )
        if problem:
            raise ImproperlyConfigured(f"{where}['schema']: {problem}")
        if not _is_attempts(self.max_attempts):
            raise ImproperlyConfigured(
                f"{where}['max_attempts'] must be a whole number from 1 to {MAX_ATTEMPTS}"
            )
        days = self.keep_results_days
        if days is not None and (
            isinstance(days, bool)
            or not isinstance(days, int | float)
            or not math.isfinite(days)
            or days < 0
        ):
            raise ImproperlyConfigured(
                f"{where}['keep_results_days'] must be a number of days (0 or more) or None"
            )

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        if len(task.queue_name) > MAX_QUEUE_NAME:
            raise InvalidTask(
                f"Queue name '{task.queue_name[:40]}...' is {len(task.queue_name)} characters "
                f"long; the limit is {MAX_QUEUE_NAME}."
            )
        attempts = getattr(task, "max_attempts", None)
        if attempts is not None and not _is_attempts(attempts):
            raise InvalidTask(f"max_attempts must be a whole number from 1 to {MAX_ATTEMPTS}.")

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        _check_runnable(task)
        args, args_json = json_text(args, "argument")
        kwargs, kwargs_json = json_text(kwargs, "argument")
        result_id = str(uuid.uuid4())
        run_after = task.run_after
        if run_after is not None and timezone.is_naive(run_after):  # USE_TZ = False
            run_after = timezone.make_aware(run_after)
        priority = int(task.priority)
        max_attempts = getattr(task, "max_attempts", None) or self.max_attempts
        payload = json.dumps({"result_id": result_id, "task": task.module_path})
        with self._cursor() as cursor:
            cursor.execute(
                render(django_sql.ENQUEUE, self.schema),
                [
                    result_id,
                    self.alias,
                    task.queue_name,
                    task.module_path,
                    priority,
                    run_after,
                    args_json,
                    kwargs_json,
                    identifier_of(task.queue_name),
                    payload,
                    run_after,
                    max_attempts,
                    -priority,
                ],
            )
            (enqueued_at,) = cursor.fetchone()
        result = StoredResult(
            id=result_id,
            job_id=0,
            backend=self.alias,
            queue_name=task.queue_name,
            task_path=task.module_path,
            priority=priority,
            run_after=task.run_after,
            args=args,
            kwargs=kwargs,
            status=TaskResultStatus.READY.value,
            enqueued_at=django_time(enqueued_at),
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            return_value=None,
            errors=[],
            worker_ids=[],
        ).task_result(task)
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        try:
            key = str(uuid.UUID(result_id))
        except (TypeError, ValueError, AttributeError):  # checked here: a bad cast
            raise TaskResultDoesNotExist(result_id) from None  # would break a transaction
        with self._cursor() as cursor:
            cursor.execute(render(django_sql.READ_RESULT, self.schema), [key])
            row = cursor.fetchone()
        if row is None:
            raise TaskResultDoesNotExist(result_id)
        stored = StoredResult.from_row(row).reconciled(*row[17:22])
        return stored.task_result(stored.task())

    def check(self, **kwargs: Any) -> list[Any]:
        from .checks import check_backend

        return check_backend(self, kwargs.get("databases"))

    def _cursor(self) -> Any:
        """A cursor on the configured alias (its current transaction, if any);
        a missing schema is said in one line."""
        return _Cursor(self)


class _Cursor:
    """Django's cursor on the backend's alias, turning "no such table or
    function" into a line that says what to run."""

    def __init__(self, backend: GraphileWorkerBackend) -> None:
        self._backend = backend
        self._cursor: Any = None

    def __enter__(self) -> Any:
        self._cursor = connections[self._backend.database].cursor()
        return self._cursor

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> None:
        self._cursor.close()
        if error is not None and schema_missing(error):
            backend = self._backend
            raise ImproperlyConfigured(not_installed(backend.schema, backend.database)) from error


def schema_missing(error: BaseException) -> bool:
    """Whether ``error`` (a Django DatabaseError) says graphile-worker's
    schema, one of its tables or one of its functions is missing."""
    return isinstance(error, DatabaseError) and _sqlstate(error) in _NOT_INSTALLED


def not_installed(schema: str, database: str) -> str:
    """The line saying the schema is missing, and what to run."""
    return (
        f"graphile-worker's schema {schema!r} is not installed (or not migrated) in "
        f"database {database!r}: run `python manage.py graphile_worker --schema-only`"
    )


def _check_runnable(task: Task) -> None:
    """Refuse a task the worker would not run: one whose module is not in an
    installed app (checked here, not in ``validate_task``: Django validates a
    task as it is defined, maybe before the apps are loaded)."""
    module = task.func.__module__
    if not in_an_installed_app(module):
        raise InvalidTask(
            f"Task {task.module_path!r} is in the module {module!r}, which is not in an "
            "installed app, and the worker runs only the tasks of INSTALLED_APPS: move it to "
            "a module of an installed app (such as myapp/tasks.py) or add its app to "
            "INSTALLED_APPS."
        )


def _sqlstate(error: BaseException) -> str | None:
    cause = error.__cause__
    return getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)


def _is_attempts(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_ATTEMPTS
