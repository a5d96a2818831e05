"""Loading tasks from a folder, and executable tasks."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest
from dbhelpers import rows

from worker_cli import TaskLoadError, WorkerUtils, run_once
from worker_cli.tasks.loader import load_task_directory


def write(path: Path, text: str, executable: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if executable:
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


ASYNC_TASK = "async def task(payload, helpers):\n    return None\n"


@pytest.mark.unit
def test_identifiers_come_from_paths(tmp_path: Path) -> None:
    write(tmp_path / "hello.py", ASYNC_TASK)
    write(tmp_path / "users" / "send_email.py", "def task(payload, helpers):\n    pass\n")
    write(tmp_path / "users" / "__init__.py", "")
    write(tmp_path / "users" / "deep" / "clean-up_2.py", ASYNC_TASK)
    write(tmp_path / "run_report", "#!/bin/sh\nexit 0\n", executable=True)
    write(tmp_path / "README.md", "not a task")
    write(tmp_path / ".hidden.py", "raise SystemExit('must not be imported')")
    tasks = load_task_directory(tmp_path)
    assert sorted(tasks) == ["hello", "run_report", "users/deep/clean-up_2", "users/send_email"]
    assert tasks["hello"].is_async and not tasks["users/send_email"].is_async


@pytest.mark.parametrize(
    "name,content,message",
    [
        (
            "broken.py",
            "def task(payload, helpers)\n    pass\n",
            r"'broken.py' failed to import: line 1: expected ':'",
        ),
        (
            "raises.py",
            "raise RuntimeError('no config')\n",
            r"'raises.py' failed to import: RuntimeError\('no config'\)",
        ),
        ("exits.py", "import sys\nsys.exit(2)\n", r"'exits.py' failed to import: SystemExit\(2\)"),
        (
            "no_task.py",
            "def handler(payload, helpers):\n    pass\n",
            r"'no_task.py' has no callable `task`",
        ),
        ("not_callable.py", "task = 42\n", r"'not_callable.py' has no callable `task`"),
        ("bad name.py", ASYNC_TASK, r"'bad name.py': 'bad name' may only contain"),
    ],
)
@pytest.mark.unit
def test_bad_task_files_name_the_file_and_reason(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    write(tmp_path / "fine.py", ASYNC_TASK)
    write(tmp_path / name, content)
    with pytest.raises(TaskLoadError, match=message):
        load_task_directory(tmp_path)


@pytest.mark.unit
def test_empty_or_missing_folder_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TaskLoadError, match="has no tasks"):
        load_task_directory(tmp_path)
    with pytest.raises(TaskLoadError, match="does not exist"):
        load_task_directory(tmp_path / "nope")


@pytest.mark.unit
def test_duplicate_identifier_is_an_error(tmp_path: Path) -> None:
    write(tmp_path / "dup.py", ASYNC_TASK)
    write(tmp_path / "dup", "#!/bin/sh\n", executable=True)
    with pytest.raises(TaskLoadError, match="'dup' is already defined"):
        load_task_directory(tmp_path)


EXECUTABLE = """#!/usr/bin/env python3
import json, os, sys
data = json.load(sys.stdin)
out = {k: v for k, v in os.environ.items() if k.startswith("GRAPHILE_WORKER_")}
out["stdin"] = data
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "seen.json"), "a") as f:
    f.write(json.dumps(out) + "\\n")
print("line for stdout")
print("line for stderr", file=sys.stderr)
sys.exit(data["payload"].get("exit", 0))
"""


@pytest.mark.db
async def test_executable_tasks(
    utils: WorkerUtils, db: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(tmp_path / "tasks" / "scripts" / "report", EXECUTABLE, executable=True)
    good = await utils.add_job("scripts/report", {"n": 1}, job_key="rk", priority=3)
    bad = await utils.add_job("scripts/report", {"exit": 3})
    caplog.set_level("INFO")
    await run_once(db, task_directory=tmp_path / "tasks", no_handle_signals=True)

    seen = [
        json.loads(line)
        for line in (tmp_path / "tasks" / "scripts" / "seen.json").read_text().splitlines()
    ]
    by_id = {int(s["GRAPHILE_WORKER_JOB_ID"]): s for s in seen}
    env: dict[str, Any] = by_id[good.id]
    assert env["stdin"] == {"payload": {"n": 1}}
    assert env["GRAPHILE_WORKER_PAYLOAD_FORMAT"] == "json"
    assert env["GRAPHILE_WORKER_TASK_IDENTIFIER"] == "scripts/report"
    assert env["GRAPHILE_WORKER_JOB_KEY"] == "rk"
    assert (
        env["GRAPHILE_WORKER_JOB_ATTEMPTS"] == "1"
        and env["GRAPHILE_WORKER_JOB_MAX_ATTEMPTS"] == "25"
    )
    assert env["GRAPHILE_WORKER_JOB_PRIORITY"] == "3"
    assert "GRAPHILE_WORKER_JOB_KEY" not in by_id[bad.id]

    left = rows(db, "select id, last_error from graphile_worker._private_jobs")
    assert left == [
        {
            "id": bad.id,
            "last_error": "RuntimeError: executable task 'scripts/report' exited with code 3",
        }
    ]
    records = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert any(
        level == "INFO" and msg.endswith("line for stdout") and f"{{{good.id}}}" in msg
        for level, msg in records
    )
    assert any(level == "ERROR" and msg.endswith("line for stderr") for level, msg in records)
