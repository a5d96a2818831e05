"""The configuration file against a real database: a worker configured only by
pyproject.toml, subcommands reading connection and schema from it, and
run(**load_config(...)) in library mode."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from dbhelpers import rows, run_cli, value

from worker_cli import Helpers, load_config, run

pytestmark = pytest.mark.db

RECORD_TASK = """\
async def task(payload, helpers):
    await helpers.query("insert into public.ran (n) values (%s)", (payload["n"],))
"""

#: A connection string no server answers.
NOWHERE = "postgresql://nobody@127.0.0.1:9/nowhere?connect_timeout=2"


def test_a_worker_configured_only_by_pyproject_runs_the_jobs(db: str, tmp_path: Path) -> None:
    rows(db, "create table public.ran (n int)")
    rows(
        db,
        "select graphile_worker.add_job('record', json_build_object('n', n)) "
        "from generate_series(1, 3) as n",
    )
    (tmp_path / "my_tasks").mkdir()
    (tmp_path / "my_tasks" / "record.py").write_text(RECORD_TASK)
    (tmp_path / "pyproject.toml").write_text(
        f'[project]\nname = "app"\n\n[tool.graphile-worker]\nconnection = "{db}"\n'
        'tasks = "my_tasks"\nonce = true\njobs = 2\nlocal-queue-size = 0\n'
        "progress-interval = 0\n"
    )
    result = run_cli(cwd=tmp_path)  # no flag, no DATABASE_URL
    assert result.returncode == 0, result.stderr
    assert sorted(r["n"] for r in rows(db, "select n from public.ran")) == [1, 2, 3]
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0


def test_subcommands_read_connection_and_schema_from_the_file(db: str, tmp_path: Path) -> None:
    assert run_cli("-c", db, "-s", "gw_file", "--schema-only").returncode == 0
    (tmp_path / "worker.toml").write_text(f'connection = "{db}"\nschema = "gw_file"\n')

    def schema_of_status(*args: str, env: dict[str, str] | None = None) -> str:
        result = run_cli("-C", "worker.toml", *args, env=env, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        return result.stdout.splitlines()[0].split("'")[1]

    assert schema_of_status("status") == "gw_file"
    env = {"GRAPHILE_WORKER_SCHEMA": "graphile_worker"}
    assert schema_of_status("status", env=env) == "graphile_worker"  # environment beats file
    assert schema_of_status("status", "-s", "gw_file", env=env) == "gw_file"  # flag beats env
    assert schema_of_status("-s", "gw_file", "status", env=env) == "gw_file"

    added = run_cli("-C", "worker.toml", "add-job", "hello", '{"a": 1}', cwd=tmp_path)
    assert added.returncode == 0, added.stderr
    assert value(db, "select count(*) from gw_file._private_jobs") == 1
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0


def test_database_url_beats_the_files_connection_and_dash_c_beats_both(
    db: str, tmp_path: Path
) -> None:
    (tmp_path / "pyproject.toml").write_text(f'[tool.graphile-worker]\nconnection = "{NOWHERE}"\n')
    failed = run_cli("status", cwd=tmp_path)
    assert failed.returncode == 1 and "could not connect" in failed.stderr  # the file's
    assert run_cli("status", env={"DATABASE_URL": db}, cwd=tmp_path).returncode == 0
    beaten = run_cli("-c", db, "status", env={"DATABASE_URL": NOWHERE}, cwd=tmp_path)
    assert beaten.returncode == 0, beaten.stderr


async def test_run_takes_load_configs_keywords(db: str, tmp_path: Path) -> None:
    (tmp_path / "worker.toml").write_text(
        f'connection = "{db}"\nschema = "gw_library"\npoll-interval = 100\njobs = 2\n'
        'log-format = "json"\n'
    )
    config = load_config(tmp_path / "worker.toml")
    ran: list[Any] = []
    done = asyncio.Event()

    async def hello(payload: Any, helpers: Helpers) -> None:
        ran.append((payload, helpers.job.id))
        done.set()

    runner = await run(**config, task_list={"hello": hello}, no_handle_signals=True)
    try:
        assert runner.pool.options.concurrency == 2
        assert runner.pool.options.poll_interval == 0.1
        job = await runner.add_job("hello", {"n": 1})
        await asyncio.wait_for(done.wait(), 30)
    finally:
        await runner.stop()
    assert ran == [({"n": 1}, job.id)]
    assert value(db, "select count(*) from gw_library._private_jobs") == 0
