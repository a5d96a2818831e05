"""tasks_example/ and crontab.example do what their comments say.

The worker runs with ``--once`` on the example folder, as the README shows;
jobs are added from SQL, the way the examples' docstrings add them.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from dbhelpers import rows, run_cli, value

from worker_cli import parse_crontab

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "tasks_example"
COVERED = {"hello", "sha256_file", "flaky", "signup", "notify", "log_job", "ship_order"}


def example_tasks() -> set[str]:
    names = {path.stem for path in EXAMPLES.glob("*.py")}
    names |= {
        path.name
        for path in EXAMPLES.iterdir()
        if path.is_file() and not path.suffix and os.access(path, os.X_OK)
    }
    return names


def run_examples(db: str) -> str:
    result = run_cli(
        "-c", db, "--once", "--tasks", str(EXAMPLES), "--crontab", str(ROOT / "crontab.example")
    )
    assert result.returncode == 0, result.stderr
    return result.stderr


def add_job(db: str, task: str, payload: Any, **options: str) -> int:
    named = "".join(f", {name} := {setting}" for name, setting in options.items())
    [row] = rows(
        db,
        f"select (graphile_worker.add_job(%s, %s::json{named})).id",  # options: SQL literals
        (task, json.dumps(payload)),
    )
    return int(row["id"])


def job(db: str, job_id: int) -> dict[str, Any] | None:
    found = rows(db, "select * from graphile_worker.jobs where id = %s", (job_id,))
    return found[0] if found else None


@pytest.mark.unit
def test_every_example_is_tested_and_the_crontab_uses_only_them() -> None:
    assert example_tasks() == COVERED
    cron_tasks = {item.task for item in parse_crontab((ROOT / "crontab.example").read_text())}
    assert cron_tasks <= COVERED and len(cron_tasks) >= 4


@pytest.mark.db
def test_each_example_task(db: str, tmp_path: Path) -> None:
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(3 * 1024 * 1024 + 17))  # more than one chunk
    hello = add_job(db, "hello", {"name": "Example"})
    checksum = add_job(db, "sha256_file", {"path": str(data)})
    flaky = add_job(db, "flaky", {"failures": 2})
    signup = add_job(db, "signup", {"name": "Ada", "email": "ada@example.com"})
    # Two notify jobs with one key become one batch; max_attempts 1 keeps the
    # failed item from being retried later.
    notify_options = {"job_key": "'notify'", "job_key_mode": "'preserve_run_at'"}
    notify = add_job(
        db,
        "notify",
        [{"to": "ada@example.com", "text": "hi"}],
        **notify_options,
        max_attempts="1",
    )
    assert notify == add_job(db, "notify", [{"to": "nobody", "text": "?"}], **notify_options)
    script = add_job(db, "log_job", {"note": "from SQL"})
    shipped = add_job(db, "ship_order", {"order_id": 7, "lines": [{"sku": "A", "qty": 2}]})
    misfit = add_job(db, "ship_order", {"lines": []})

    log = run_examples(db)

    assert "Hello, Example!" in log and job(db, hello) is None
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    assert f"sha256 {digest}  {data}" in log and job(db, checksum) is None
    # signup queued a welcome (with its job key), which ran in the same --once run.
    assert "ada@example.com signed up; welcome queued as job" in log
    assert "Hello, Ada!" in log and job(db, signup) is None
    # The batch: the good item was sent, the bad one is all the job keeps.
    assert "notify ada@example.com: hi" in log
    left = job(db, notify)
    assert left is not None and left["attempts"] == 1
    assert "not an email address" in left["last_error"]
    assert value(
        db, "select payload from graphile_worker._private_jobs where id = %s", (notify,)
    ) == [{"to": "nobody", "text": "?"}]
    # The executable: stdin and GRAPHILE_WORKER_* reached it; its stdout is logged.
    assert f'job {script} (log_job), attempt 1/25: {{"payload": {{"note": "from SQL"}}}}' in log
    assert job(db, script) is None
    # The typed payload: built from the JSON; one that does not fit fails for good.
    assert "shipping order 7: 2 item(s)" in log and job(db, shipped) is None
    failed = job(db, misfit)
    assert failed is not None and failed["attempts"] == failed["max_attempts"] == 25
    assert failed["last_error"] == "PayloadError: payload.order_id: missing"

    # flaky: failed twice, then succeeded. Rescheduled to now between the runs
    # instead of waiting for the backoff (3 s, then 7 s).
    for attempt in (1, 2):
        failed = job(db, flaky)
        assert failed is not None and failed["attempts"] == attempt
        assert failed["last_error"].startswith(
            f"RuntimeError: simulated failure on attempt {attempt} of 25"
        )
        rows(
            db,
            "select graphile_worker.reschedule_jobs(array[%s::bigint], run_at := now())",
            (flaky,),
        )
        log = run_examples(db)
    assert "succeeded on attempt 3" in log and job(db, flaky) is None
