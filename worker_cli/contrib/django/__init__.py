"""Django's Tasks framework (``django.tasks``, Django 6) on graphile-worker.

::

    INSTALLED_APPS = [..., "worker_cli.contrib.django"]
    TASKS = {"default": {"BACKEND": "worker_cli.contrib.django.GraphileWorkerBackend"}}

and run ``python manage.py graphile_worker``. Needs ``graphile-worker[django]``.
"""

from __future__ import annotations

from .backend import GraphileWorkerBackend, GraphileWorkerTask

__all__ = ["GraphileWorkerBackend", "GraphileWorkerTask"]
