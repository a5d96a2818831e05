"""The examples of the guides "Progress and job logs" and "Schedules in the
database" run as written: the task files with a worker, the schedule's
script against a database."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from readme_blocks import app_env

from worker_cli import make_sync_worker_utils

pytestmark = pytest.mark.db

GUIDES = Path(__file__).resolve().parents[2] / "docs" / "guides"


def python_blocks(page: str) -> list[str]:
    text = (GUIDES / page).read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_progress_guides_tasks_run_as_written(db: str, tmp_path: Path) -> None:
    for block in python_blocks("progress-and-logs.md"):
        path = tmp_path / block.splitlines()[0].removeprefix("# ")
        path.parent.mkdir(exist_ok=True)
        path.write_text(block, encoding="utf-8")
    with make_sync_worker_utils(connection_string=db) as utils:
        rows = utils.add_job("import_rows", {"rows": [{"id": 7}, {"id": 8}]})
        page = utils.add_job("fetch_page", {"url": "https://example.com"}, max_attempts=1)
        done = subprocess.run(
            ["graphile-worker", "--once"],
            cwd=tmp_path,
            env=app_env(db),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        progress = utils.get_job_result(rows.id).progress
        assert progress is not None and str(progress) == "2/2 (100%) row 8"
        (log,) = utils.get_job_logs(page.id)
        assert log.lines[0].endswith("INFO fetching https://example.com")


def test_the_schedules_guides_script_runs_as_written(db: str, tmp_path: Path) -> None:
    [script] = python_blocks("schedules.md")
    (tmp_path / "schedule.py").write_text(script, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "schedule.py"],
        cwd=tmp_path,
        env=app_env(db),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    with make_sync_worker_utils(connection_string=db) as utils:
        (schedule,) = utils.list_schedules()
    assert (schedule.identifier, schedule.tz, schedule.fill.total_seconds()) == (
        "nightly-report",
        "Europe/Paris",
        6 * 3600,
    )
