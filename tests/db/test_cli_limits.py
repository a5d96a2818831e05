"""Absurd values of the command's options: one line naming the option and
what it allows, exit code 2, and nothing started (issue 23). Every number
has a finite upper bound; NaN and infinity are refused; schema names that
PostgreSQL refuses or that would silently mean the default are refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from dbhelpers import rows, run_cli, value

from worker_cli.cli import commands as cli_module
from worker_cli.cli.commands import command
from worker_cli.config.options import WorkerOptions

#: Never connected to: every case is refused before the command connects.
NOWHERE = "postgres://nobody@127.0.0.1:1/nowhere"

REFUSED = [
    (("-j", "2147483648"), "Invalid value for '-j' / '--jobs': 2147483648 is not in the range "
     "1<=x<=10000."),
    (("-m", "262144"), "Invalid value for '-m' / '--max-pool-size': 262144 is not in the range "
     "2<=x<=262143."),
    (("--local-queue-size", "100001"), "Invalid value for '--local-queue-size' (env var: "
     "'GRAPHILE_WORKER_LOCAL_QUEUE_SIZE'): 100001 is not in the range 0<=x<=100000."),
    (("--poll-interval", "3600001"), "Invalid value for '--poll-interval': 3600001 is not in the "
     "range 1<=x<=3600000."),
    (("--heartbeat-interval", "inf"), "Invalid value for '--heartbeat-interval' (env var: "
     "'GRAPHILE_WORKER_HEARTBEAT_INTERVAL'): inf is not in the range 0<=x<=3600."),
    (("--heartbeat-interval", "1e300"), "Invalid value for '--heartbeat-interval' (env var: "
     "'GRAPHILE_WORKER_HEARTBEAT_INTERVAL'): 1e+300 is not in the range 0<=x<=3600."),
    (("--heartbeat-interval", "nan"), "Invalid value for '--heartbeat-interval' (env var: "
     "'GRAPHILE_WORKER_HEARTBEAT_INTERVAL'): 'nan' is not a number in the range 0<=x<=3600."),
    (("--heartbeat-timeout", "inf"), "Invalid value for '--heartbeat-timeout' (env var: "
     "'GRAPHILE_WORKER_HEARTBEAT_TIMEOUT'): inf is not in the range 0<x<=86400."),
    (("--heartbeat-timeout", "nan"), "Invalid value for '--heartbeat-timeout' (env var: "
     "'GRAPHILE_WORKER_HEARTBEAT_TIMEOUT'): 'nan' is not a number in the range 0<x<=86400."),
    (("--progress-interval", "inf"), "Invalid value for '--progress-interval' (env var: "
     "'GRAPHILE_WORKER_PROGRESS_INTERVAL'): inf is not in the range 0<=x<=3600."),
    (("--progress-interval", "nan"), "Invalid value for '--progress-interval' (env var: "
     "'GRAPHILE_WORKER_PROGRESS_INTERVAL'): 'nan' is not a number in the range 0<=x<=3600."),
    (("-s", ""), "Invalid value for '-s' / '--schema' (env var: 'GRAPHILE_WORKER_SCHEMA'): "
     "a schema name must not be empty"),
    (("-s", "pg_foo"), "Invalid value for '-s' / '--schema' (env var: 'GRAPHILE_WORKER_SCHEMA'): "
     "schema name 'pg_foo' starts with pg_, which PostgreSQL reserves for system schemas"),
    (("-s", "s" * 64), "Invalid value for '-s' / '--schema' (env var: 'GRAPHILE_WORKER_SCHEMA'): "
     f"schema name '{'s' * 64}' is longer than PostgreSQL's 63-byte limit"),
    (("status", "-s", "pg_catalog"), "Invalid value for '-s' / '--schema' (env var: "
     "'GRAPHILE_WORKER_SCHEMA'): schema name 'pg_catalog' starts with pg_, which PostgreSQL "
     "reserves for system schemas"),
    (("add-job", "x", "-s", ""), "Invalid value for '-s' / '--schema' (env var: "
     "'GRAPHILE_WORKER_SCHEMA'): a schema name must not be empty"),
    (("dashboard", "--auth", ""), "Invalid value for '--auth' (env var: "
     "'GRAPHILE_WORKER_DASHBOARD_AUTH'): must not be empty: give USER:PASSWORD, or leave --auth "
     "out for no authentication"),
    (("dashboard", "--refresh", "inf"), "Invalid value for '--refresh': inf is not in the range "
     "0<=x<=3600."),
    (("dashboard", "--refresh", "nan"), "Invalid value for '--refresh': 'nan' is not a number in "
     "the range 0<=x<=3600."),
    (("add-job", "x", "--priority", "32768"), "Invalid value for '--priority': 32768 is not in "
     "the range -32768<=x<=32767."),
    (("add-job", "x", "--priority", "-99999999999999999999"), "Invalid value for '--priority': "
     "-99999999999999999999 is not in the range -32768<=x<=32767."),
    (("add-job", "x", "--max-attempts", "32768"), "Invalid value for '--max-attempts': 32768 is "
     "not in the range 1<=x<=32767."),
    (("add-job", "x", "[" * 10_000 + "]" * 10_000), "Invalid value for '[PAYLOAD]': JSON "
     "nested too deeply to be read"),
    (("add-job", "x", "--run-at", "10000-01-01T00:00:00Z"), "Invalid value for '--run-at': not an "
     "ISO 8601 date and time (years 1 to 9999): '10000-01-01T00:00:00Z'"),
    (("add-job", "x", "--run-at", "9999-12-31T23:59:59-01:00"), "Invalid value for '--run-at': "
     "9999-12-31T23:59:59-01:00 is not from 0001-01-02 to 9999-12-30 (UTC); a job's run_at must "
     "be a datetime in every time zone it may be read back in"),
    (("add-job", "x", "--run-at", "0001-01-01T00:00:00+01:00"), "Invalid value for '--run-at': "
     "0001-01-01T00:00:00+01:00 is not from 0001-01-02 to 9999-12-30 (UTC); a job's run_at must "
     "be a datetime in every time zone it may be read back in"),
]  # fmt: skip


def _refused(result: Any, message: str) -> None:
    """Exit code 2, and the error is one line: click's usage lines, then it."""
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"Error: {message}"


@pytest.mark.unit
@pytest.mark.parametrize(("args", "message"), REFUSED)
def test_absurd_values_are_one_line_naming_the_option_and_its_limit(
    args: tuple[str, ...], message: str, tmp_path: Path
) -> None:
    _refused(run_cli("-c", NOWHERE, *args, cwd=tmp_path), message)


@pytest.mark.unit
def test_absurd_values_from_the_environment_too(tmp_path: Path) -> None:
    env = {"GRAPHILE_WORKER_HEARTBEAT_INTERVAL": "inf"}
    result = run_cli("-c", NOWHERE, env=env, cwd=tmp_path)
    _refused(
        result,
        "Invalid value for '--heartbeat-interval' (env var: "
        "'GRAPHILE_WORKER_HEARTBEAT_INTERVAL'): inf is not in the range 0<=x<=3600.",
    )


@pytest.mark.db
def test_a_huge_jobs_flag_never_reaches_the_database(db: str, tmp_path: Path) -> None:
    """The findings as reported: -j beyond int4 and an infinite heartbeat
    interval ran the worker into a traceback; -s pg_foo reached PostgreSQL."""
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "t.py").write_text("async def task(payload, helpers):\n    pass\n")
    rows(db, "select graphile_worker.add_job('t')")
    for args in (["-j", "2147483648"], ["--heartbeat-interval", "inf"], ["-s", "pg_foo"]):
        result = run_cli("-c", db, "--once", *args, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith(f"Error: Invalid value for '{args[0]}'"), last
    assert value(db, "select count(*) from graphile_worker.jobs") == 1  # nothing ran


# --- the bounds themselves are accepted ------------------------------------


class Captured:
    """What the worker would have been started with (no database is involved)."""

    def __init__(self) -> None:
        self.settings: dict[str, Any] = {}

    def __call__(self, connection: str | None, settings: dict[str, Any], **options: Any) -> None:
        self.settings = {**settings, **options}


@pytest.mark.unit
def test_the_bounds_themselves_are_accepted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # no pyproject.toml
    captured = Captured()
    monkeypatch.setattr(cli_module, "run_worker", captured)
    monkeypatch.setattr(cli_module.logs, "configure", lambda *args, **kwargs: None)
    args = [
        "-j", "10000", "-m", "262143", "--local-queue-size", "100000", "--poll-interval",
        "3600000", "--heartbeat-interval", "3600", "--heartbeat-timeout", "86400",
        "--progress-interval", "3600", "-s", "s" * 63,
    ]  # fmt: skip
    result = CliRunner().invoke(command, args, env={"GRAPHILE_WORKER_CONFIG": None})
    assert result.exit_code == 0, result.output
    got = captured.settings
    assert (got["concurrency"], got["max_pool_size"], got["local_queue_size"]) == (
        10000,
        262143,
        100000,
    )
    assert (got["poll_interval"], got["heartbeat_interval"], got["heartbeat_timeout"]) == (
        3600,
        3600,
        86400,
    )
    assert got["progress_interval"] == 3600 and got["schema"] == "s" * 63


# --- library mode: run() checks its options as the flags do -----------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"concurrency": 2**31}, "concurrency must be from 1 to 10000, not 2147483648"),
        ({"max_pool_size": 10**6}, "max_pool_size must be from 2 to 262143, not 1000000"),
        ({"local_queue_size": 10**6}, "local_queue_size must be from 0 to 100000, not 1000000"),
        (
            {"poll_interval": float("inf")},
            "poll_interval must be more than 0s and at most 3600s, not inf",
        ),
        (
            {"heartbeat_interval": float("nan")},
            "heartbeat_interval must be more than 0s and at most 3600s, not nan",
        ),
        (
            {"heartbeat_timeout": 1e300},
            "heartbeat_timeout must be more than 0s and at most 86400s, not 1e+300",
        ),
    ],
)
def test_worker_options_refuse_what_the_flags_refuse(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as raised:
        WorkerOptions(**options)
    assert str(raised.value) == message
