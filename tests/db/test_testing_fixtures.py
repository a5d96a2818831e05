"""The pytest plugin's fixtures, in a pytest run of a user's tests: a
database of the session's own, emptied between tests, DATABASE_URL set, the
utilities on it; dropped at the end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from pg_server import PgServer

pytestmark = pytest.mark.db

USER_TESTS = """
import os

from worker_cli.testing import added_jobs, assert_job_added, run_jobs


def test_a_committed_job(graphile_worker_db, graphile_worker_sync_utils):
    assert os.environ["DATABASE_URL"] == graphile_worker_db
    graphile_worker_sync_utils.add_job("hello", {"n": 1})
    graphile_worker_sync_utils.pause(queue="mail")
    assert_job_added("hello", {"n": 1})  # DATABASE_URL: no argument needed


def test_the_next_test_starts_empty(graphile_worker_db, graphile_worker_sync_utils):
    assert added_jobs() == []
    assert graphile_worker_sync_utils.list_pauses() == []


async def test_the_async_utilities(graphile_worker_utils):
    job = await graphile_worker_utils.add_job("hello", {"n": 2})
    [ran] = run_jobs(task_list={"hello": lambda payload, helpers: payload["n"]})
    assert (ran.id, ran.result) == (job.id, 2)
    assert (await graphile_worker_utils.get_job_result(job.id)).result == 2
"""


def test_the_fixtures_in_a_users_test_run(pg: PgServer, tmp_path: Path) -> None:
    (tmp_path / "test_user.py").write_text(USER_TESTS)
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("PG") and name not in {"DATABASE_URL", "PYTEST_ADDOPTS"}
    }
    env["TEST_DATABASE_URL"] = pg.admin_url
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-o", "asyncio_mode=auto", "test_user.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout
    with psycopg.connect(pg.admin_url, autocommit=True) as conn:
        left = conn.execute(
            "select datname from pg_database where datname like 'graphile_worker_test_%'"
        ).fetchall()
    assert left == []
