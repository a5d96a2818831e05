"""Small things of the admin commands (issue 41): ``job ID --wait`` says the
same of an unknown id whatever the wait; ``pause --until`` a time already
past is refused (and leaves a pause in force alone); ``limit --per`` names
its own bounds; ``cancel --reason`` that the database cannot store is one
line."""

from __future__ import annotations

from datetime import timedelta

import pytest
from dbhelpers import admin_cli, rows, run_cli, value

from worker_cli.client.job_waiting import VISIBILITY_GRACE, Waiting
from worker_cli.jobs.job_state import JobResult

PAUSES = "graphile_worker._private_py_pauses"


def one_line_error(result: object, code: int, *says: str) -> str:
    """The command failed with ``code`` and one line on stderr saying ``says``."""
    returncode, stderr = result.returncode, result.stderr  # type: ignore[attr-defined]
    assert returncode == code, (returncode, stderr)
    lines = stderr.strip().splitlines()
    assert "Traceback" not in stderr and lines, stderr
    last = lines[-1]
    assert last.startswith("Error: "), stderr
    for part in says:
        assert part in last, (part, stderr)
    return str(last)


# --- job ID --wait: an unknown id -------------------------------------------------


@pytest.mark.unit
def test_a_wait_shorter_than_the_grace_ends_with_unknown_as_a_longer_one() -> None:
    now = [0.0]
    unknown = JobResult(id=7, state="unknown")
    short = Waiting(7, 1.0, "final", clock=lambda: now[0])
    assert isinstance(short.next(unknown), float)  # within the timeout: read again
    now[0] = 1.0
    assert short.next(unknown) is unknown  # not WaitTimeout: the id is unknown
    long = Waiting(7, 5.0, "final", clock=lambda: now[0])
    now[0] += VISIBILITY_GRACE
    assert long.next(unknown) is unknown


@pytest.mark.db
def test_the_job_command_says_the_same_of_an_unknown_id_whatever_the_wait(db: str) -> None:
    shown = []
    for wait in ("0", "1", "5"):
        result = run_cli("job", "-c", db, "999999", "--wait", wait)
        assert result.returncode == 0, (wait, result.stdout, result.stderr)
        assert result.stderr == "", wait
        shown.append(result.stdout)
    assert shown[0] == shown[1] == shown[2]
    assert shown[0].splitlines()[0] == "Job 999999: unknown"
    assert "no row anywhere" in shown[0]


# --- pause --until a time already past ---------------------------------------------


@pytest.mark.db
def test_pause_until_a_time_already_past_is_refused_and_changes_nothing(db: str) -> None:
    done = admin_cli("pause", "-c", db, "--queue", "mail", "--for", "10m")
    assert done.returncode == 0, done.stderr
    [before] = rows(db, f"select * from {PAUSES}")
    for until in ("2020-01-01T00:00:00+00:00", "0001-01-02T00:00:00Z"):
        for target in (("--queue", "mail"), ("--queue", "sms"), ("--task", "*")):
            refused = admin_cli("pause", "-c", db, *target, "--until", until)
            one_line_error(refused, 2, "--until", "has passed already")
            assert refused.stdout == ""
    assert rows(db, f"select * from {PAUSES}") == [before]  # mail's pause still in force
    a_minute_ago = value(
        db, "select to_char(now() - interval '1 minute', 'YYYY-MM-DD\"T\"HH24:MI:SSOF')"
    )
    refused = admin_cli("pause", "-c", db, "--queue", "mail", "--until", str(a_minute_ago))
    one_line_error(refused, 2, "--until", "has passed already")
    ahead = admin_cli("pause", "-c", db, "--queue", "sms", "--until", "2999-01-01T00:00:00Z")
    assert ahead.returncode == 0, ahead.stderr
    assert ahead.stdout.startswith("Paused queue sms: ")


@pytest.mark.db
def test_resume_refuses_a_name_no_pause_can_have_in_one_line(db: str) -> None:
    for target in (("--queue", "q" * 129), ("--task", "bad \udcff byte")):
        refused = admin_cli("resume", "-c", db, *target)
        one_line_error(refused, 2, target[0].lstrip("-") + ": ")


# --- limit --per ---------------------------------------------------------------------


@pytest.mark.db
def test_limit_per_names_itself_and_its_own_bounds(db: str) -> None:
    for per in ("0s", "0", "2d", "86401s", "soon"):
        args = ("limit", "-c", db, "--task", "a", "--max-starts", "5", "--per", per)
        line = one_line_error(admin_cli(*args), 2, "--per")
        assert "pause" not in line and "366" not in line, line
        if per != "soon":
            assert "a window lasts above 0 and at most a day" in line, line
    assert value(db, "select count(*) from graphile_worker._private_py_limits") == 0
    done = admin_cli("limit", "-c", db, "--task", "a", "--max-starts", "5", "--per", "1d")
    assert done.returncode == 0, done.stderr
    period = value(db, "select period from graphile_worker._private_py_limits")
    assert period == timedelta(days=1)


# --- cancel --reason --------------------------------------------------------------------


@pytest.mark.db
def test_a_cancel_reason_the_database_cannot_store_is_one_line(db: str) -> None:
    job_id = value(db, "select id from graphile_worker.add_job('t')")
    # Bytes that are not UTF-8 on the command line arrive as lone surrogates.
    refused = admin_cli("cancel", "-c", db, str(job_id), "--reason", "bad \udcff byte")
    one_line_error(refused, 2, "reason", "surrogate")
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 1
    assert value(db, "select count(*) from graphile_worker._private_py_job_history") == 0
