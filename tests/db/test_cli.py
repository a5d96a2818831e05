"""The installed ``graphile-worker`` command, run as a user runs it."""

from __future__ import annotations

from pathlib import Path

import pytest
from dbhelpers import run_cli, value
from psycopg.conninfo import conninfo_to_dict


@pytest.mark.db
def test_schema_only_installs_then_reports_up_to_date(empty_db: str) -> None:
    first = run_cli("-c", empty_db, "--schema-only")
    assert first.returncode == 0, first.stderr
    assert "migrated to revision 20" in first.stdout
    assert value(empty_db, "select max(id) from graphile_worker.migrations") == 20
    second = run_cli("-c", empty_db, "--schema-only")
    assert second.returncode == 0
    assert "up to date (revision 20)" in second.stdout


@pytest.mark.db
def test_schema_option_and_env(empty_db: str) -> None:
    assert run_cli("-c", empty_db, "--schema-only", "-s", "custom one").returncode == 0
    assert value(empty_db, 'select count(*) from "custom one".migrations') == 20
    result = run_cli("-c", empty_db, "--schema-only", env={"GRAPHILE_WORKER_SCHEMA": "from_env"})
    assert result.returncode == 0
    assert value(empty_db, "select count(*) from from_env.migrations") == 20


@pytest.mark.db
def test_database_url_and_dotenv(empty_db: str, tmp_path: Path) -> None:
    assert run_cli("--schema-only", env={"DATABASE_URL": empty_db}).returncode == 0
    (tmp_path / ".env").write_text(
        f"DATABASE_URL={empty_db}\nGRAPHILE_WORKER_SCHEMA=dotenv_schema\n"
    )
    result = run_cli("--schema-only", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert value(empty_db, "select count(*) from dotenv_schema.migrations") == 20


@pytest.mark.unit
def test_no_connection_is_one_line_and_exit_1(tmp_path: Path) -> None:
    result = run_cli("--schema-only", cwd=tmp_path)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "-c/--connection" in lines[0] and "DATABASE_URL" in lines[0] and "PG*" in lines[0]


@pytest.mark.db
def test_unreachable_database_is_one_line_and_exit_1(pg) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("-c", pg.url("no_such_db_for_cli"), "--schema-only")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "could not connect to the database" in result.stderr
    assert "no_such_db_for_cli" in result.stderr


@pytest.mark.db
def test_a_read_only_server_is_one_line_and_exit_1(db: str, tmp_path: Path) -> None:
    """As a standby is (a connection string naming a replica, or a failover
    not finished yet): the worker says why it cannot start, in one line."""
    name = conninfo_to_dict(db)["dbname"]
    value(db, f"alter database {name} set default_transaction_read_only = on; select 1")
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "t.py").write_text("def task(payload, helpers):\n    pass\n")
    result = run_cli("-c", db, "--once", cwd=tmp_path)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "could not start" in last and "read-only transaction" in last, result.stderr


@pytest.mark.unit
def test_version_and_help() -> None:
    version = run_cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("graphile-worker, version ")
    help_text = run_cli("--help").stdout
    for flag in ("--connection", "--schema", "--schema-only", "--version"):
        assert flag in help_text


@pytest.mark.db
def test_python_dash_m_works_the_same(empty_db: str) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "worker_cli", "-c", empty_db, "--schema-only"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "migrated to revision 20" in result.stdout


@pytest.mark.db
def test_the_first_run_logs_one_migration_line(empty_db: str, tmp_path: Path) -> None:
    """The first run on an empty database says in one line what it
    installed (it printed a line per revision: 26 of them); the revisions are
    DEBUG lines (GRAPHILE_LOGGER_DEBUG)."""
    from worker_cli.schema.migrate import LATEST_REVISION, MigrationFiles

    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "t.py").write_text("def task(payload, helpers):\n    pass\n")
    first = run_cli("-c", empty_db, "--once", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    py = MigrationFiles().py_revisions()
    count = LATEST_REVISION + len(py)
    said = [line for line in first.stderr.splitlines() if "migrat" in line or "revision" in line]
    assert len(said) == 1, first.stderr
    assert said[0].endswith(
        f" INFO Schema 'graphile_worker' migrated to revision {LATEST_REVISION} ({count} "
        f"migrations: graphile-worker 1-{LATEST_REVISION}, Python-only 1-{max(py)})"
    )
    again = run_cli("-c", empty_db, "--once", cwd=tmp_path)
    assert again.returncode == 0 and "migrat" not in again.stderr, again.stderr
    schema = "graphile_worker_debug"
    debug = run_cli("-c", empty_db, "--schema-only", "-s", schema,
                    env={"GRAPHILE_LOGGER_DEBUG": "1"})  # fmt: skip
    assert debug.returncode == 0, debug.stderr
    assert f"applied Python-only migration {max(py)} to {schema}" in debug.stderr


@pytest.mark.db
def test_add_job_command_adds_one_job_with_its_options(db: str) -> None:
    result = run_cli(
        "add-job", "-c", db, "hello", '{"name": "CLI"}', "--queue", "q1", "--priority", "-3",
        "--run-at", "2030-01-02T03:04:05Z", "--max-attempts", "4", "--job-key", "k1",
        "--flag", "slow", "--flag", "big",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Added job" in result.stdout and "(hello) in queue 'q1'" in result.stdout
    row = value(
        db,
        "select json_build_array(task_identifier, queue_name, priority, run_at = '2030-01-02"
        " 03:04:05+00', max_attempts, key, flags) from graphile_worker.jobs",
    )
    assert row == ["hello", "q1", -3, True, 4, "k1", {"slow": True, "big": True}]
    assert value(db, "select payload from graphile_worker._private_jobs") == {"name": "CLI"}


@pytest.mark.db
def test_add_job_says_when_the_key_replaced_updated_or_kept_a_job(db: str) -> None:
    def add(*args: str) -> str:
        result = run_cli("add-job", "-c", db, "hello", "--job-key", "k", *args)
        assert result.returncode == 0, result.stderr
        return result.stdout

    job_id = value(db, "select id from graphile_worker.add_job('hello', job_key => 'k')")
    assert add("--queue", "q").startswith(f"Replaced job {job_id} (hello, key k) in queue 'q', ")
    assert add("--job-key-mode", "preserve_run_at").startswith(
        f"Updated job {job_id} (hello, key k), its run_at kept, run at "
    )
    assert add("--job-key-mode", "unsafe_dedupe").startswith(
        f"Kept job {job_id} (key k): a job has this key already (unsafe_dedupe); nothing was added"
    )
    assert value(db, "select count(*) from graphile_worker.jobs") == 1
    assert run_cli("add-job", "-c", db, "hello", "--job-key", "new").stdout.startswith("Added job")


@pytest.mark.db
def test_add_job_command_refuses_bad_input_and_adds_nothing(db: str) -> None:
    bad_json = run_cli("add-job", "-c", db, "hello", "{name: 1}")
    assert bad_json.returncode == 2
    assert "Invalid value for '[PAYLOAD]': not JSON" in bad_json.stderr
    naive = run_cli("add-job", "-c", db, "hello", "--run-at", "2030-01-02T03:04:05")
    assert naive.returncode == 2 and "has no time zone" in naive.stderr
    too_long = run_cli("add-job", "-c", db, "hello", "--job-key", "k" * 513)
    assert too_long.returncode == 2 and "job_key" in too_long.stderr
    assert "Traceback" not in bad_json.stderr + naive.stderr + too_long.stderr
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0
