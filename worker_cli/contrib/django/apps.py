"""The Django app ``worker_cli.contrib.django`` (in ``INSTALLED_APPS``): it
brings the ``graphile_worker`` management command. It has no models: the
queue's tables are graphile-worker's (``manage.py graphile_worker
--schema-only`` installs them)."""

from __future__ import annotations

from django.apps import AppConfig
from django.core import checks


class GraphileWorkerConfig(AppConfig):  # type: ignore[misc]
    name = "worker_cli.contrib.django"
    label = "graphile_worker"
    verbose_name = "graphile-worker"

    def ready(self) -> None:
        from .checks import check_schemas

        # Django's own check of the task backends does not pass the databases.
        checks.register(check_schemas)
