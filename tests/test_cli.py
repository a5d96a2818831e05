"""The installed ``graphile-worker`` command, run as a user runs it."""

from __future__ import annotations

from pathlib import Path

from dbhelpers import run_cli, value


def test_schema_only_installs_then_reports_up_to_date(empty_db: str) -> None:
    first = run_cli("-c", empty_db, "--schema-only")
    assert first.returncode == 0, first.stderr
    assert "migrated to revision 20" in first.stdout
    assert value(empty_db, "select max(id) from graphile_worker.migrations") == 20
    second = run_cli("-c", empty_db, "--schema-only")
    assert second.returncode == 0
    assert "up to date (revision 20)" in second.stdout


def test_schema_option_and_env(empty_db: str) -> None:
    assert run_cli("-c", empty_db, "--schema-only", "-s", "custom one").returncode == 0
    assert value(empty_db, 'select count(*) from "custom one".migrations') == 20
    result = run_cli("-c", empty_db, "--schema-only", env={"GRAPHILE_WORKER_SCHEMA": "from_env"})
    assert result.returncode == 0
    assert value(empty_db, "select count(*) from from_env.migrations") == 20


def test_database_url_and_dotenv(empty_db: str, tmp_path: Path) -> None:
    assert run_cli("--schema-only", env={"DATABASE_URL": empty_db}).returncode == 0
    (tmp_path / ".env").write_text(
        f"DATABASE_URL={empty_db}\nGRAPHILE_WORKER_SCHEMA=dotenv_schema\n"
    )
    result = run_cli("--schema-only", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert value(empty_db, "select count(*) from dotenv_schema.migrations") == 20


def test_no_connection_is_one_line_and_exit_1(tmp_path: Path) -> None:
    result = run_cli("--schema-only", cwd=tmp_path)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "-c/--connection" in lines[0] and "DATABASE_URL" in lines[0] and "PG*" in lines[0]


def test_unreachable_database_is_one_line_and_exit_1(pg) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("-c", pg.url("no_such_db_for_cli"), "--schema-only")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "could not connect to the database" in result.stderr
    assert "no_such_db_for_cli" in result.stderr


def test_version_and_help() -> None:
    version = run_cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("graphile-worker, version ")
    help_text = run_cli("--help").stdout
    for flag in ("--connection", "--schema", "--schema-only", "--version"):
        assert flag in help_text


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
