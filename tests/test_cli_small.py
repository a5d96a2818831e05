"""Small things of the admin commands (issue 41): ``job ID --wait`` says the
same of an unknown id whatever the wait; ``pause --until`` a time already
past is refused (and leaves a pause in force alone); ``limit --per`` names
its own bounds; ``cancel --reason`` that the database cannot store is one
line."""

from __future__ import annotations

import pytest
from dbhelpers import run_cli

from worker_cli.jobs.results import JobResult
from worker_cli.jobs.waiting import VISIBILITY_GRACE, Waiting

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
