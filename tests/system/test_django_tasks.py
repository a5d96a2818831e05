"""The Django Tasks backend (worker_cli.contrib.django), tested with its
Django 6 test project in a pytest process of its own (tests/django_tasks):
Django is configured once per process, and tests/system/test_python_apps.py
configures it for the README's recipe.

Django 6 needs Python 3.12 or newer: on an older Python, or without Django
6, this is skipped (CI fails instead: GRAPHILE_WORKER_REQUIRE_DJANGO=1, and
.ci/run runs the suite on Python 3.12).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pg_server import PgServer

pytestmark = [pytest.mark.db, pytest.mark.slow]

SUITE = Path(__file__).resolve().parents[1] / "django_tasks"


def _django_6() -> str | None:
    """Why the suite cannot run here (None: it can)."""
    if sys.version_info < (3, 12):
        return f"Django 6 needs Python 3.12 or newer (this is {sys.version.split()[0]})"
    try:
        import django
    except ImportError:
        return "Django is not installed"
    if django.VERSION < (6, 0):
        return f"Django 6 is not installed (found {django.get_version()})"
    return None


def test_django_tasks_suite(pg: PgServer) -> None:
    missing = _django_6()
    if missing:
        if os.environ.get("GRAPHILE_WORKER_REQUIRE_DJANGO"):
            pytest.fail(f"the Django Tasks tests must run here: {missing}")
        pytest.skip(f"Django Tasks tests: {missing}")
    env = {**os.environ, "TEST_DATABASE_URL": pg.admin_url}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(SUITE)],
        cwd=SUITE.parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    print(done.stdout[-20000:])
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-4000:]
