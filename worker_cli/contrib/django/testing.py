"""Django's side of :mod:`worker_cli.testing`: what ``run_jobs`` runs when
given Django's connection (the Django Tasks of the GraphileWorkerBackend(s)
on that database, as ``manage.py graphile_worker`` runs them), and the test
runner that installs the queue's schema in Django's test databases."""

from __future__ import annotations

from typing import Any

from django.tasks import task_backends
from django.test.runner import DiscoverRunner

from ...errors import ConfigurationError
from .backend import GraphileWorkerBackend
from .names import identifier_of
from .task_runner import make_task_runner

__all__ = ["TestRunner", "django_task_list", "install_schema"]


def django_task_list(alias: str) -> tuple[dict[str, Any], str]:
    """The task list of the Django queues of every GraphileWorkerBackend on
    the database ``alias`` (each backend's QUEUES, or ``default`` when it
    names none), and their schema."""
    backends = [
        backend
        for backend in task_backends.all()
        if isinstance(backend, GraphileWorkerBackend) and backend.database == alias
    ]
    if not backends:
        raise ConfigurationError(
            f"run_jobs: no GraphileWorkerBackend in TASKS uses the database {alias!r}; "
            "give task_list= or tasks_dir="
        )
    schemas = sorted({backend.schema for backend in backends})
    if len(schemas) > 1:
        raise ConfigurationError(
            f"run_jobs: the GraphileWorkerBackends on the database {alias!r} use several "
            f"schemas ({', '.join(schemas)}); give task_list= and schema="
        )
    tasks: dict[str, Any] = {}
    for backend in backends:
        runner = make_task_runner(backend.schema, type(backend))
        for queue in sorted(backend.queues) or ["default"]:
            tasks.setdefault(identifier_of(queue), runner)
    return tasks, schemas[0]


def install_schema(database: str = "default") -> None:
    """Install (or upgrade) the schema of every GraphileWorkerBackend on the
    database ``database`` (with pytest-django: call it in your
    ``django_db_setup`` fixture, after the test databases are made)."""
    from ...client.sync_worker_utils import make_sync_worker_utils
    from .connection import conninfo_of

    for schema in sorted(
        {
            backend.schema
            for backend in task_backends.all()
            if isinstance(backend, GraphileWorkerBackend) and backend.database == database
        }
    ):
        with make_sync_worker_utils(conninfo_of(database), schema=schema, max_pool_size=1) as utils:
            utils.migrate()


class TestRunner(DiscoverRunner):  # type: ignore[misc]
    """Django's test runner, with the queue's schema installed in each test
    database a GraphileWorkerBackend uses (``TEST_RUNNER =
    "worker_cli.contrib.django.testing.TestRunner"``): Django makes those
    databases with its own migrations only."""

    def setup_databases(self, **kwargs: Any) -> Any:
        databases = super().setup_databases(**kwargs)
        wanted = kwargs.get("aliases")
        for alias in sorted(
            {b.database for b in task_backends.all() if isinstance(b, GraphileWorkerBackend)}
        ):
            if wanted is None or alias in wanted:
                install_schema(alias)
        return databases
