"""``graphile-worker job ID``: its progress line (``helpers.progress``) and,
with ``--logs``, the lines its kept attempts logged (``helpers.logger``),
as text and in ``--json`` (issue 46). The rows are written here directly, as
the worker's progress writer and failure statement write them."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from dbhelpers import rows, run_cli, value

pytestmark = pytest.mark.db

PROGRESS = "graphile_worker._private_py_job_progress"
LOGS = "graphile_worker._private_py_job_logs"


def job(db: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("job", "-c", db, *args)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


def add(db: str, task: str = "report") -> int:
    return int(value(db, "select (graphile_worker.add_job(%s)).id", (task,)))


def progress(db: str, job_id: int, done: float, total: float | None, message: str | None) -> None:
    rows(
        db,
        f"insert into {PROGRESS} (job_id, done, total, message, updated_at) "
        "values (%s, %s, %s, %s, '2026-12-06 08:00:00+00')",
        (job_id, done, total, message),
    )


def log(db: str, job_id: int, attempt: int | None, outcome: str, lines: str, at: str) -> None:
    rows(
        db,
        f"insert into {LOGS} (job_id, attempt, outcome, lines, logged_at) "
        "values (%s, %s, %s, %s, %s)",
        (job_id, attempt, outcome, lines, at),
    )


def progress_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("  progress:")]


# --- progress -------------------------------------------------------------------


def test_job_shows_its_progress(db: str) -> None:
    job_id = add(db)
    progress(db, job_id, 30, 100, "parsing")
    text = ok(job(db, str(job_id)))
    assert progress_lines(text) == [
        "  progress: 30/100 (30%) parsing, updated 2026-12-06T08:00:00+00:00"
    ]
    # Among the record's fields, after the attempts.
    lines = text.splitlines()
    assert lines[lines.index(progress_lines(text)[0]) - 1] == "  attempts: 0 of 25"


def test_a_fraction_without_a_total_or_a_message(db: str) -> None:
    job_id = add(db)
    progress(db, job_id, 0.25, None, None)
    assert progress_lines(ok(job(db, str(job_id)))) == [
        "  progress: 25%, updated 2026-12-06T08:00:00+00:00"
    ]


def test_no_progress_no_line(db: str) -> None:
    job_id = add(db)
    assert progress_lines(ok(job(db, str(job_id)))) == []
    assert json.loads(ok(job(db, str(job_id), "--json")))["progress"] is None


def test_json_has_the_progress(db: str) -> None:
    job_id = add(db)
    progress(db, job_id, 30, 100, "parsing")
    document = json.loads(ok(job(db, str(job_id), "--json")))
    assert document["progress"] == {
        "done": 30.0,
        "total": 100.0,
        "message": "parsing",
        "fraction": 0.3,
        "updated_at": "2026-12-06T08:00:00+00:00",
    }
    assert "logs" not in document  # only with --logs


# --- logs -------------------------------------------------------------------------


def logs_part(text: str) -> list[str]:
    """What ``--logs`` added: the lines from its own on."""
    lines = text.splitlines()
    start = next(
        index
        for index, line in enumerate(lines)
        if line.startswith(("  logs (", "  no logs kept for job"))
    )
    return lines[start:]


def test_logs_of_each_attempt_oldest_first(db: str) -> None:
    job_id = add(db)
    other = add(db)
    log(db, job_id, 1, "failed", "fetching page 1\nConnectionError: refused", "2026-12-06 08:00+00")
    log(db, other, 1, "failed", "not this job's", "2026-12-06 08:00:30+00")
    log(db, job_id, 2, "succeeded", "fetching page 1\ndone", "2026-12-06 10:01:02+01")
    assert logs_part(ok(job(db, str(job_id), "--logs"))) == [
        "  logs (oldest attempt first):",
        "    attempt 1 (failed, 2026-12-06 08:00:00 UTC)",
        "      fetching page 1",
        "      ConnectionError: refused",
        "    attempt 2 (succeeded, 2026-12-06 09:01:02 UTC)",
        "      fetching page 1",
        "      done",
    ]
    # Without --logs, none of it.
    assert "fetching page 1" not in ok(job(db, str(job_id)))


def test_no_logs_kept_says_why(db: str) -> None:
    job_id = add(db)
    assert logs_part(ok(job(db, str(job_id), "--logs"))) == [
        f"  no logs kept for job {job_id} (a worker keeps the lines a task logs through "
        "helpers.logger for failed and cancelled attempts only, unless it runs with --job-logs "
        "all; they are kept 7 days)"
    ]


def test_json_with_logs(db: str) -> None:
    job_id = add(db)
    log(db, job_id, 1, "failed", "a\nb", "2026-12-06 08:00+00")
    rows(db, f"update {LOGS} set dropped = 3")
    document = json.loads(ok(job(db, str(job_id), "--json", "--logs")))
    expected: list[dict[str, Any]] = [
        {
            "attempt": 1,
            "outcome": "failed",
            "logged_at": "2026-12-06T08:00:00+00:00",
            "lines": ["a", "b"],
            "dropped": 3,
        }
    ]
    assert document["logs"] == expected
    assert document["id"] == job_id and "progress" in document
    empty = add(db)
    assert json.loads(ok(job(db, str(empty), "--json", "--logs")))["logs"] == []


def test_logs_of_an_unknown_job(db: str) -> None:
    text = ok(job(db, "999999", "--logs"))
    assert text.startswith("Job 999999: unknown")
    assert logs_part(text)[0].startswith("  no logs kept for job 999999 (")
