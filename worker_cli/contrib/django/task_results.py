"""Django's ``TaskResult`` from a stored result row and the state of its job.

The row says what the worker wrote (READY, RUNNING, SUCCESSFUL, FAILED); the
job's state (``py_job_status``) says what became of an attempt the worker
could not write: a killed worker's job that runs again is READY, one that
will not (its attempts are spent, it was cancelled or removed) is FAILED,
never RUNNING for ever.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.exceptions import SuspiciousOperation
from django.tasks import Task
from django.tasks.base import TaskError, TaskResult, TaskResultStatus
from django.utils import timezone

from .storable import error_record

__all__ = ["StoredResult", "django_time", "in_an_installed_app", "load_task", "lost_attempt"]

#: The exception class of an attempt that ended without an outcome.
LOST = "worker_cli.errors.JobLost"
CANCELLED = "worker_cli.errors.JobCancelled"

#: The job states (py_job_status) in which it will run (again): a paused job
#: is READY too (it runs once its pause ends).
_WAITING = frozenset({"waiting", "scheduled", "retrying", "paused"})


def lost_attempt(detail: str | None = None) -> dict[str, str]:
    """The error of an attempt whose worker stopped before writing its outcome."""
    text = "the worker running this attempt stopped (killed or lost) before it finished"
    return error_record(LOST, f"JobLost: {text}" + (f": {detail}" if detail else "") + "\n")


@dataclass(frozen=True, slots=True)
class StoredResult:
    """A row of ``_private_py_django_results`` (columns ``RESULT_COLUMNS``)."""

    id: str
    job_id: int
    backend: str
    queue_name: str
    task_path: str
    priority: int
    run_after: dt.datetime | None
    args: list[Any]
    kwargs: dict[str, Any]
    status: str
    enqueued_at: dt.datetime
    started_at: dt.datetime | None
    last_attempted_at: dt.datetime | None
    finished_at: dt.datetime | None
    return_value: Any
    errors: list[dict[str, str]]
    worker_ids: list[str]

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> StoredResult:
        (id_, job_id, backend, queue, path, priority, run_after, args, kwargs, status) = row[:10]
        enqueued_at, started_at, last_attempted_at, finished_at, value, errors, workers = row[10:17]
        return cls(
            id=id_,
            job_id=job_id,
            backend=backend,
            queue_name=queue,
            task_path=path,
            priority=priority,
            run_after=django_time(run_after),
            args=json.loads(args),
            kwargs=json.loads(kwargs),
            status=status,
            enqueued_at=django_time(enqueued_at),
            started_at=django_time(started_at),
            last_attempted_at=django_time(last_attempted_at),
            finished_at=django_time(finished_at),
            return_value=None if value is None else json.loads(value),
            errors=json.loads(errors),
            worker_ids=list(workers),
        )

    def reconciled(
        self,
        job_state: str | None,
        last_error: str | None,
        cancel_reason: str | None,
        job_finished_at: dt.datetime | None,
        runs_again: bool | None = False,
    ) -> StoredResult:
        """This result as the job's state (``py_job_status``) makes it: an
        unfinished result whose job will not run again is FAILED; a FAILED
        one whose task will run again (its job was retried) is READY."""
        if runs_again:
            return dataclasses.replace(self, status="READY", finished_at=None)
        if self.status in ("SUCCESSFUL", "FAILED") or job_state == "running":
            return self
        if job_state in _WAITING:
            if self.status == "RUNNING":  # its worker was lost; it runs again
                return dataclasses.replace(
                    self, status="READY", errors=[*self.errors, lost_attempt(last_error)]
                )
            return self
        if job_state == "cancelled":
            reason = f": {cancel_reason}" if cancel_reason else ""
            error = error_record(CANCELLED, f"JobCancelled: cancelled{reason}\n")
        elif job_state == "failed" and self.status == "RUNNING":
            error = lost_attempt(last_error)
        elif job_state == "failed":
            error = error_record(
                LOST, f"JobLost: the job was failed for good before it ran again: {last_error}\n"
            )
        else:  # no job any more (removed), or a history Django did not write
            error = error_record(
                LOST, "JobLost: the job was removed from the queue before it finished\n"
            )
        finished = django_time(job_finished_at) or self.last_attempted_at or self.enqueued_at
        return dataclasses.replace(
            self, status="FAILED", errors=[*self.errors, error], finished_at=finished
        )

    def task_result(self, task: Task) -> TaskResult:
        """Django's TaskResult of this row, for ``task`` (rebuilt by :func:`load_task`)."""
        result = TaskResult(
            task=task,
            id=self.id,
            status=TaskResultStatus[self.status],
            enqueued_at=self.enqueued_at,
            started_at=self.started_at,
            last_attempted_at=self.last_attempted_at,
            finished_at=self.finished_at,
            args=self.args,
            kwargs=self.kwargs,
            backend=self.backend,
            errors=[TaskError(**error) for error in self.errors],
            worker_ids=self.worker_ids,
        )
        if self.status == "SUCCESSFUL":
            object.__setattr__(result, "_return_value", self.return_value)
        return result

    def task(self) -> Task:
        """The Task of this row: its module path's Task with the options it was enqueued with."""
        return load_task(self.task_path).using(
            priority=self.priority,
            queue_name=self.queue_name,
            run_after=self.run_after,
            backend=self.backend,
        )


def load_task(path: str) -> Task:
    """The Django Task at ``path`` (a Task's ``module_path``). Its module is
    imported only if it belongs to an installed app (or is imported already),
    and only a Task object is returned: anything else (``os.system``,
    ``subprocess.check_output``, a plain function) raises SuspiciousOperation
    and is never called."""
    module_name, _, name = path.rpartition(".")
    module = sys.modules.get(module_name)
    if module is None:
        if not in_an_installed_app(module_name):
            raise SuspiciousOperation(
                f"{path!r} is not a Django Task: {module_name!r} is not in an installed app"
            )
        module = importlib.import_module(module_name)
    found = getattr(module, name, None)
    if not isinstance(found, Task):
        raise SuspiciousOperation(f"{path!r} is not a Django Task")
    return found


def in_an_installed_app(module_name: str) -> bool:
    """Whether the module is an installed app's package or one of its modules."""
    return any(
        module_name == app.name or module_name.startswith(app.name + ".")
        for app in apps.get_app_configs()
    )


def django_time(value: dt.datetime | None) -> Any:
    """A time as Django gives it: aware in UTC with USE_TZ, else naive local."""
    if value is None:
        return None
    if settings.USE_TZ:
        return value.astimezone(dt.UTC) if timezone.is_aware(value) else value
    return timezone.make_naive(value) if timezone.is_aware(value) else value
