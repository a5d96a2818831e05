"""The testing guide's examples (docs/guides/testing.md), run as a user runs
them: in a fresh virtual environment holding only this package (and pytest,
or Django), their own test suites run by ``python -m pytest`` and ``python
manage.py test``.

Django 6 needs Python 3.12 or newer: its example is skipped on an older
Python (CI runs this suite on 3.12, where it must run: GRAPHILE_WORKER_REQUIRE_DJANGO).
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from pg_server import PgServer
from readme_blocks import ROOT, blocks, write_files

pytestmark = [pytest.mark.db, pytest.mark.slow]

DJANGO = sys.version_info >= (3, 12)


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A new virtual environment with this package, pytest and (on 3.12+)
    Django installed from the package index, as a user installs them."""
    where = tmp_path_factory.mktemp("venv")
    venv.create(where, with_pip=True)
    python = where / "bin" / "python"
    wanted = [str(ROOT), "pytest"] + (["django>=6"] if DJANGO else [])
    done = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *wanted],
        capture_output=True,
        text=True,
        timeout=600,
        env=_user_env(),
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    yield python


def _user_env(**extra: str) -> dict[str, str]:
    """A user's environment: nothing of this suite's (no PG*, DATABASE_URL,
    PYTHONPATH or GRAPHILE_WORKER_* variables)."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PG", "GRAPHILE_WORKER", "PYTEST", "DJANGO"))
        and name not in {"DATABASE_URL", "TEST_DATABASE_URL", "PYTHONPATH", "VIRTUAL_ENV"}
    }
    return {**env, **extra}


def _expected(heading: str) -> list[str]:
    """The output lines of the section's transcript (its commands left out)."""
    [transcript] = blocks(heading, "text")
    return [line for line in transcript.splitlines() if line and not line.startswith("$ ")]


def _test_databases(pg: PgServer) -> set[str]:
    with psycopg.connect(pg.admin_url, autocommit=True) as conn:
        rows = conn.execute(
            "select datname from pg_database where datname like 'graphile_worker_test_%'"
        ).fetchall()
    return {row[0] for row in rows}


def test_the_pytest_example_passes_in_a_fresh_venv(
    fresh_venv: Path, pg: PgServer, tmp_path: Path
) -> None:
    written = write_files("With pytest", tmp_path)
    assert set(written) == {"app.py", "tasks.py", "tests/test_signup.py", "conftest.py"}
    before = _test_databases(pg)
    done = subprocess.run(
        [fresh_venv, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=_user_env(TEST_DATABASE_URL=pg.admin_url),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith(_expected("With pytest")[-1]), done.stdout  # "3 passed"
    # The plugin dropped the database it made for the session.
    assert _test_databases(pg) == before


@pytest.mark.skipif(not DJANGO, reason="Django 6 needs Python 3.12 or newer")
def test_the_django_example_passes_with_djangos_test_runner(
    fresh_venv: Path, pg: PgServer, tmp_path: Path
) -> None:
    written = write_files("With Django", tmp_path)
    assert set(written) == {"mysite/settings.py", "shop/tasks.py", "shop/tests.py", "manage.py"}
    for package in ("mysite", "shop"):  # "with empty __init__.py files"
        (tmp_path / package / "__init__.py").write_text("")
    name = pg.create_database()
    try:
        done = subprocess.run(
            [fresh_venv, "manage.py", "test"],
            cwd=tmp_path,
            env=_user_env(DATABASE_URL=pg.url(name)),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        pg.drop_database(name)
        pg.drop_database(f"test_{name}")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    lines = output.splitlines()
    for expected in _expected("With Django"):
        assert any(line.startswith(expected) for line in lines), (expected, output)
