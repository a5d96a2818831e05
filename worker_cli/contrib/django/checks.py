"""The backend's system checks. Django's own check of the task backends
(``backend.check()``, which Django 6.1 calls without the databases) says what
is wrong with the settings; :func:`check_schemas`, registered by the app,
looks in the database for graphile-worker's schema, so that ``manage.py
check``, ``runserver`` and ``migrate`` warn while it is missing."""

from __future__ import annotations

from collections.abc import Iterable, Set
from typing import Any, Protocol

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.db import DatabaseError, connections

from ...sql import django as django_sql
from .names import MAX_QUEUE_NAME

__all__ = ["check_backend", "check_schemas"]

APP = "worker_cli.contrib.django"


class BackendSettings(Protocol):
    """What the checks read of a GraphileWorkerBackend."""

    alias: str
    database: str
    schema: str
    queues: Set[str]


def check_backend(
    backend: BackendSettings, databases: Iterable[str] | None
) -> list[checks.CheckMessage]:
    """What is wrong with the backend's configuration; the database itself
    only when ``databases`` names the backend's alias."""
    where = f"TASKS[{backend.alias!r}]"
    found: list[checks.CheckMessage] = []
    if not apps.is_installed(APP):
        found.append(
            checks.Error(
                f"{APP!r} is not in INSTALLED_APPS",
                hint=f"Add {APP!r} to INSTALLED_APPS (it brings `manage.py graphile_worker`).",
                id="graphile_worker.E001",
            )
        )
    engine = settings.DATABASES.get(backend.database, {}).get("ENGINE", "")
    if backend.database not in settings.DATABASES:
        found.append(
            checks.Error(
                f"{where}['OPTIONS']['database'] is {backend.database!r}, which is not in "
                "DATABASES",
                id="graphile_worker.E002",
            )
        )
    elif engine != "django.db.backends.postgresql":
        found.append(
            checks.Error(
                f"{where} uses database {backend.database!r}, whose ENGINE is {engine!r}: "
                "graphile-worker needs PostgreSQL (django.db.backends.postgresql)",
                hint=f"Set DATABASES[{backend.database!r}] to a PostgreSQL database (ENGINE "
                "'django.db.backends.postgresql'), or OPTIONS['database'] to the alias of one.",
                id="graphile_worker.E002",
            )
        )
    for queue in sorted(backend.queues):
        if len(queue) > MAX_QUEUE_NAME:
            found.append(
                checks.Error(
                    f"{where}['QUEUES']: queue name {queue[:40]!r}... is {len(queue)} "
                    f"characters long; the limit is {MAX_QUEUE_NAME}",
                    id="graphile_worker.E003",
                )
            )
    if not found and databases is not None and backend.database in databases:
        found.extend(_check_schema(backend))
    return found


def check_schemas(
    backends: Iterable[BackendSettings], databases: Iterable[str] | None
) -> list[checks.CheckMessage]:
    """A warning for each of ``backends`` (GraphileWorkerBackends) whose
    database (one of ``databases``: every alias for ``manage.py check`` and
    ``runserver``, the one migrated for ``migrate``) has no graphile-worker
    schema. A backend with a settings error is left to Django's check of the
    backends."""
    aliases = set(databases or ())
    found: list[checks.CheckMessage] = []
    seen: set[tuple[str, str]] = set()
    for backend in backends:
        place = (backend.database, backend.schema)
        if place in seen or backend.database not in aliases or check_backend(backend, None):
            continue
        seen.add(place)
        found.extend(_check_schema(backend))
    return found


def _check_schema(backend: BackendSettings) -> list[Any]:
    try:
        with connections[backend.database].cursor() as cursor:
            cursor.execute(django_sql.RESULTS_TABLE_EXISTS, [backend.schema])
            (installed,) = cursor.fetchone()
    except DatabaseError as exc:
        return [
            checks.Warning(
                f"could not check graphile-worker's schema in database {backend.database!r}: "
                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}",
                id="graphile_worker.W001",
            )
        ]
    if installed:
        return []
    # A warning, not an error: `manage.py migrate` runs these checks and must
    # not be stopped by what the worker (or --schema-only) installs afterwards.
    return [
        checks.Warning(
            f"graphile-worker's schema {backend.schema!r} is not installed (or not migrated) "
            f"in database {backend.database!r}: tasks cannot be enqueued",
            hint="Run `python manage.py graphile_worker --schema-only` (a worker starting "
            "does it too).",
            id="graphile_worker.W002",
        )
    ]
