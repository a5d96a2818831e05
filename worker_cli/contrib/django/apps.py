"""The Django app ``worker_cli.contrib.django`` (in ``INSTALLED_APPS``): it
brings the ``graphile_worker`` management command, the schema's check, and
the queue's pages in Django's admin (:mod:`.admin`, when
``django.contrib.admin`` is installed). Its models (:mod:`.models`) are
unmanaged and it has no migrations: the queue's tables are graphile-worker's
(``manage.py graphile_worker --schema-only`` installs them)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.apps import AppConfig
from django.core import checks


class GraphileWorkerConfig(AppConfig):  # type: ignore[misc]
    name = "worker_cli.contrib.django"
    label = "graphile_worker"
    verbose_name = "graphile-worker"

    def ready(self) -> None:
        # Django's own check of the task backends does not pass the databases.
        checks.register(check_schemas)


def check_schemas(
    app_configs: Any = None, databases: Iterable[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """The schema's check (:func:`.checks.check_schemas`) of every
    GraphileWorkerBackend in TASKS, on ``databases``."""
    from django.tasks import task_backends

    from .backend import GraphileWorkerBackend
    from .checks import check_schemas as check

    ours = [b for b in task_backends.all() if isinstance(b, GraphileWorkerBackend)]
    return check(ours, databases)
