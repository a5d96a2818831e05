"""The Django 6 test project (``project/``) on a real PostgreSQL: Django is
set up in this process (its backend: enqueue, get_result, checks) and the
worker runs as ``python manage.py graphile_worker`` subprocesses.

Run by ``tests/system/test_django_tasks.py`` in a pytest process of its own (Django
is configured once per process, and the README recipes' tests configure it
too), or directly: ``pytest tests/django_tasks`` (Python 3.12+, Django 6).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pg_server import PgServer

PROJECT = Path(__file__).resolve().parent / "project"
SCHEMA = "graphile_worker"


@pytest.fixture(scope="session")
def django_site(pg: PgServer, migrated_template: str) -> Iterator[str]:
    """Django set up on a fresh database with the schema; yields its URL."""
    url = pg.url(pg.create_database(template=migrated_template))
    bare = pg.url(pg.create_database())
    os.environ["DJANGO_DATABASE_URL"] = url
    os.environ["DJANGO_BARE_DATABASE_URL"] = bare
    os.environ["DJANGO_SETTINGS_MODULE"] = "site_settings"
    sys.path.insert(0, str(PROJECT))
    import django

    django.setup()
    yield url
    from django.db import connections

    connections.close_all()


@pytest.fixture
def site(django_site: str, tmp_path: Path) -> Iterator[str]:
    """The database URL, emptied of jobs and results; JOBS_LOG is a new file."""
    with psycopg.connect(django_site, autocommit=True) as conn:
        conn.execute(
            "delete from graphile_worker._private_jobs;"
            "delete from graphile_worker._private_py_django_results;"
            "delete from graphile_worker._private_py_heartbeats;"
        )
    os.environ["JOBS_LOG"] = str(tmp_path / "jobs.log")
    yield django_site


def log_lines() -> list[str]:
    """What the tasks and the signal receivers logged, without the times."""
    path = Path(os.environ["JOBS_LOG"])
    if not path.exists():
        return []
    return [line.rsplit(" @", 1)[0] for line in path.read_text().splitlines()]


def manage(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python manage.py ARGS`` in the project, as a user runs it."""
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=PROJECT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_worker(*args: str) -> subprocess.Popen[str]:
    """``python manage.py graphile_worker ARGS`` running in the background."""
    return subprocess.Popen(
        [sys.executable, "manage.py", "graphile_worker", *args],
        cwd=PROJECT,
        env=dict(os.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for(condition: Callable[[], object], timeout: float = 30, what: str = "") -> None:
    """Until ``condition()`` is true (checked every 20 ms), or fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(0.02)


def stop(worker: subprocess.Popen[str]) -> str:
    """SIGTERM the worker, wait for it; its output. It must exit 0."""
    worker.terminate()
    out, _ = worker.communicate(timeout=30)
    assert worker.returncode == 0, out
    return out


@pytest.fixture(scope="session")
def admin_tables(django_site: str) -> str:
    """The site with Django's own tables (auth, sessions, admin: ``migrate``)."""
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    return django_site


@pytest.fixture
def queue(site: str, admin_tables: str) -> Iterator[str]:
    """The site's database URL with an empty queue (jobs, their history and
    errors, schedules, pauses) and Django's tables; the users a test made
    are deleted after it."""
    with psycopg.connect(site, autocommit=True) as conn:
        conn.execute(
            "delete from graphile_worker._private_py_job_history;"
            "delete from graphile_worker._private_py_job_errors;"
            "delete from graphile_worker._private_py_schedules;"
            "delete from graphile_worker._private_py_pauses;"
        )
    yield site
    from django.contrib.auth.models import User

    User.objects.all().delete()


def staff_client(*codenames: str, superuser: bool = False) -> Any:
    """Django's test client, logged in as a new staff user with these
    permissions of the app (``retry_job``, ``view_job``...)."""
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    name = f"staff-{uuid.uuid4().hex[:8]}"
    if superuser:
        user = User.objects.create_superuser(name, f"{name}@example.com", "pw")
    else:
        user = User.objects.create_user(name, f"{name}@example.com", "pw", is_staff=True)
        found = Permission.objects.filter(
            content_type__app_label="graphile_worker", codename__in=codenames
        )
        assert sorted(found.values_list("codename", flat=True)) == sorted(codenames)
        user.user_permissions.set(found)
    client = Client()
    client.force_login(user)
    return client
