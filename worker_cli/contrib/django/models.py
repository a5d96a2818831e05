"""The queue's tables as Django models, read by the admin (:mod:`.admin`).

Every model is unmanaged (``managed = False``): Django never creates, alters
or deletes these tables, and the app has no migrations (graphile-worker's
migrator owns the schema: ``manage.py graphile_worker --schema-only``). The
models read, in the queue's schema:

* :class:`Job`: graphile-worker's jobs (``_private_jobs``, Node's table),
  with :class:`JobTask` and :class:`JobQueue`, the task identifiers and named
  queues its ids name. :meth:`JobQuerySet.with_state` adds each job's state,
  in the words every command prints (``py_job_state``: running, failed,
  paused, retrying, scheduled, waiting) and the pause holding a paused one.
* :class:`FinishedJob`: the finished jobs' history (``_private_py_job_history``:
  succeeded, failed, cancelled, removed), kept for a while after they finish.
* :class:`Schedule`: the schedules in the database (``_private_py_schedules``).

They are never written through the ORM: the admin's actions go through
graphile-worker's functions, as the command line's do. The queue is the one
of ``TASKS["default"]`` when it is a GraphileWorkerBackend, else of the first
GraphileWorkerBackend in ``TASKS`` (:func:`queue_place`), read when the models
are loaded: its ``database`` alias is where every query goes, its ``schema``
is in each ``db_table``.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import models
from django.db.models.functions import Cast
from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, InvalidTaskBackend, task_backends
from django.utils.module_loading import import_string

from ...jobs.job_spec import RUN_AT_MAX, RUN_AT_MIN
from ...sql import django_admin as admin_sql
from ...sql import render
from .backend import DEFAULT_OPTIONS, GraphileWorkerBackend

__all__ = [
    "DATABASE",
    "SCHEMA",
    "FinishedJob",
    "Job",
    "JobQuerySet",
    "JobQueue",
    "JobTask",
    "Schedule",
    "StoredTimestamp",
    "queue_place",
    "stored_text",
]


def queue_place() -> tuple[str, str]:
    """The database alias and schema of the queue the models read: those of
    ``TASKS["default"]`` when it is a GraphileWorkerBackend, else of the first
    GraphileWorkerBackend in ``TASKS`` (a backend that cannot be built is left
    to Django's checks, which say why); with none, the backend's defaults
    (the ``default`` database, the schema ``graphile_worker``)."""
    configured = task_backends.settings
    for alias in sorted(configured, key=lambda alias: alias != DEFAULT_TASK_BACKEND_ALIAS):
        try:  # only ours is built here: another backend may need the apps loaded
            kind = import_string(configured[alias].get("BACKEND", ""))
            if not (isinstance(kind, type) and issubclass(kind, GraphileWorkerBackend)):
                continue
            backend = task_backends[alias]
        except (ImproperlyConfigured, InvalidTaskBackend, ImportError, AttributeError):
            continue
        return backend.database, backend.schema
    return DEFAULT_OPTIONS["database"], DEFAULT_OPTIONS["schema"]


DATABASE, SCHEMA = queue_place()


class JsonValue(models.Field):  # type: ignore[misc]
    """A ``json`` column, as the database driver reads it: the parsed value
    (Django's own JSONField expects ``jsonb``'s text). Read only. Not every
    JSON PostgreSQL stores can be parsed by Python (nested 5,000 deep, a
    5,000-digit number): the admin reads these columns as text instead
    (``Cast(column, TextField())``) and parses them where it shows them."""

    description = "A json value"

    def get_internal_type(self) -> str:
        return "JsonValue"


#: The stored timestamps shown as datetimes: those a job's run_at may be set
#: to from Python, a day inside a datetime's years 1 to 9999 (the site's time
#: zone moves them by hours).
PYTHON_DATES = (RUN_AT_MIN, RUN_AT_MAX)


class StoredTimestamp(models.DateTimeField):  # type: ignore[misc]
    """A ``timestamptz`` column that may hold what a Python datetime cannot:
    ``infinity`` or ``-infinity`` (SQL's ``add_job(run_at := 'infinity')``
    parks a job), a date before year 1 or after 9999. Read as None then (see
    :func:`stored_text` for what to show), so one such row breaks no page;
    filters, ordering and the state read the stored value."""

    def select_format(self, compiler: Any, sql: str, params: Any) -> tuple[str, Any]:
        sql, params = super().select_format(compiler, sql, params)
        return (
            admin_sql.READABLE_TIMESTAMP.format(value=sql),
            (*params, *PYTHON_DATES, *params),
        )


def stored_text(field: str) -> Any:
    """The stored value of a :class:`StoredTimestamp` field as PostgreSQL
    writes it (``infinity``, ``12000-01-01 00:00:00+00``) where the field reads
    None for it; null for every other row."""
    return models.Case(
        models.When(**{f"{field}__range": PYTHON_DATES}, then=models.Value(None)),
        default=Cast(field, models.TextField()),
        output_field=models.TextField(),
    )


class QueueManager(models.Manager):  # type: ignore[misc]
    """Reads from the queue's database (:data:`DATABASE`), whatever the routers say."""

    def get_queryset(self) -> Any:
        return super().get_queryset().using(DATABASE)


class JobQuerySet(models.QuerySet):  # type: ignore[misc]
    """Jobs, and their state as every command names it."""

    def with_state(self) -> Any:
        """Each job with ``paused_by`` (the pause holding it, as shown:
        ``queue mail``; null when none) and ``state`` (``py_job_state``)."""
        paused_by = models.Func(
            models.F("task_id"),
            models.F("job_queue_id"),
            function=render(admin_sql.PAUSED_BY, SCHEMA),
            output_field=models.TextField(),
        )
        state = models.Func(
            models.F("locked_at"),
            models.F("attempts"),
            models.F("max_attempts"),
            models.F("run_at"),
            paused_by,
            function=render(admin_sql.JOB_STATE, SCHEMA),
            output_field=models.TextField(),
        )
        return self.annotate(paused_by=paused_by, state=state)


class JobManager(QueueManager.from_queryset(JobQuerySet)):  # type: ignore[misc]
    """:class:`QueueManager` with :class:`JobQuerySet`'s methods."""


class JobTask(models.Model):  # type: ignore[misc]
    """A task identifier of graphile-worker's (``_private_tasks``)."""

    id = models.IntegerField(primary_key=True)
    identifier = models.TextField(unique=True)

    objects = QueueManager()

    class Meta:
        managed = False
        db_table = render(admin_sql.TASKS_TABLE, SCHEMA)
        default_permissions = ()
        verbose_name = "task"

    def __str__(self) -> str:
        return str(self.identifier)


class JobQueue(models.Model):  # type: ignore[misc]
    """A named queue of graphile-worker's (``_private_job_queues``)."""

    id = models.IntegerField(primary_key=True)
    queue_name = models.TextField(unique=True)
    locked_at = models.DateTimeField(null=True)
    locked_by = models.TextField(null=True)

    objects = QueueManager()

    class Meta:
        managed = False
        db_table = render(admin_sql.QUEUES_TABLE, SCHEMA)
        default_permissions = ()
        verbose_name = "named queue"

    def __str__(self) -> str:
        return str(self.queue_name)


class Job(models.Model):  # type: ignore[misc]
    """A job in the queue (``_private_jobs``): waiting, scheduled, retrying,
    paused, running or failed. A finished job leaves it (:class:`FinishedJob`)."""

    id = models.BigIntegerField(primary_key=True)
    task = models.ForeignKey(
        JobTask,
        models.DO_NOTHING,
        db_column="task_id",
        db_constraint=False,
        related_name="+",
    )
    job_queue = models.ForeignKey(
        JobQueue,
        models.DO_NOTHING,
        db_column="job_queue_id",
        db_constraint=False,
        null=True,
        related_name="+",
        verbose_name="queue",
    )
    payload = JsonValue()
    priority = models.SmallIntegerField()
    run_at = StoredTimestamp(null=True)
    attempts = models.SmallIntegerField()
    max_attempts = models.SmallIntegerField()
    last_error = models.TextField(null=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    key = models.TextField(null=True)
    locked_at = models.DateTimeField(null=True)
    locked_by = models.TextField(null=True)
    revision = models.IntegerField()
    flags = models.JSONField(null=True)

    objects = JobManager()

    class Meta:
        managed = False
        db_table = render(admin_sql.JOBS_TABLE, SCHEMA)
        ordering = ("-id",)
        default_permissions = ("view",)
        permissions = (
            ("retry_job", "Can retry a job (run it now, its attempts again)"),
            ("cancel_job", "Can cancel a job"),
            ("reschedule_job", "Can reschedule a job"),
            ("fail_job", "Can permanently fail a job"),
            ("delete_job", "Can delete a job"),
        )
        verbose_name = "job"

    def __str__(self) -> str:
        return f"job {self.id}"


class FinishedJob(models.Model):  # type: ignore[misc]
    """A finished job (``_private_py_job_history``): succeeded, failed (for
    good, archived by the cleanup), cancelled or removed, kept until its
    ``expires_at``. Written by Python workers only: a job a Node worker
    finished has no row."""

    job_id = models.BigIntegerField(primary_key=True, verbose_name="id")
    state = models.TextField()
    task_identifier = models.TextField(verbose_name="task")
    queue_name = models.TextField(null=True, verbose_name="queue")
    key = models.TextField(null=True)
    priority = models.SmallIntegerField()
    attempts = models.SmallIntegerField()
    max_attempts = models.SmallIntegerField()
    revision = models.IntegerField()
    flags = models.JSONField(null=True)
    result = JsonValue(null=True)
    result_error = models.TextField(null=True)
    last_error = models.TextField(null=True)
    created_at = models.DateTimeField()
    run_at = StoredTimestamp(null=True)
    started_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField()
    pool_id = models.TextField(null=True)
    cancel_requested_at = models.DateTimeField(null=True)
    cancel_reason = models.TextField(null=True)
    timed_out = models.BooleanField()
    expires_at = models.DateTimeField()
    removed_by = models.TextField(null=True)

    objects = QueueManager()

    class Meta:
        managed = False
        db_table = render(admin_sql.HISTORY_TABLE, SCHEMA)
        ordering = ("-job_id",)
        default_permissions = ("view",)
        verbose_name = "finished job"

    def __str__(self) -> str:
        return f"job {self.job_id} ({self.state})"


class Schedule(models.Model):  # type: ignore[misc]
    """A schedule in the database (``_private_py_schedules``): a cron line
    every Python worker fires, added, paused and removed at run time."""

    identifier = models.TextField(primary_key=True)
    pattern = models.TextField()
    task_identifier = models.TextField(verbose_name="task")
    payload = JsonValue(null=True)
    tz = models.TextField(null=True, verbose_name="time zone")
    fill = models.DurationField()
    queue_name = models.TextField(null=True, verbose_name="queue")
    priority = models.SmallIntegerField(null=True)
    max_attempts = models.SmallIntegerField(null=True)
    job_key = models.TextField(null=True)
    paused = models.BooleanField()
    version = models.BigIntegerField()
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    known_since = models.DateTimeField()
    last_execution = models.DateTimeField(null=True)
    last_run_at = models.DateTimeField(null=True)

    objects = QueueManager()

    class Meta:
        managed = False
        db_table = render(admin_sql.SCHEDULES_TABLE, SCHEMA)
        ordering = ("identifier",)
        default_permissions = ("view",)
        permissions = (
            ("pause_schedule", "Can pause a schedule"),
            ("resume_schedule", "Can resume a schedule"),
            ("remove_schedule", "Can remove a schedule"),
        )
        verbose_name = "schedule"

    def __str__(self) -> str:
        return str(self.identifier)
