"""What the worker logs: job outcome lines, JSON lines, debug output, --once progress."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import pytest
from dbhelpers import cli_path, rows, run_cli

from worker_cli import Helpers, WorkerUtils, run_once

pytestmark = pytest.mark.db


TASKS = {
    "ok.py": (
        "async def task(payload, helpers):\n"
        "    helpers.logger.info('working on %s', payload.get('n'), extra={'colour': 'blue'})\n"
        "    helpers.logger.debug('a detail')\n"
    ),
    "bad.py": "async def task(payload, helpers):\n    raise ValueError('boom')\n",
    "slow.py": (
        "import os, time\n"
        "def task(payload, helpers):\n"
        "    time.sleep(0.05)\n"
        "    while payload.get('gate') and not os.path.exists(payload['gate']):\n"
        "        time.sleep(0.01)\n"
    ),
}

TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "tasks").mkdir()
    for name, text in TASKS.items():
        (tmp_path / "tasks" / name).write_text(text)
    return tmp_path


async def _add_outcomes(utils: WorkerUtils) -> tuple[int, int, int]:
    ok = (await utils.add_job("ok", {"n": 1})).id
    retry = (await utils.add_job("bad", {})).id
    last = (await utils.add_job("bad", {}, max_attempts=1)).id
    return ok, retry, last


async def test_one_text_line_per_outcome(utils: WorkerUtils, db: str, folder: Path) -> None:
    ok, retry, last = await _add_outcomes(utils)
    result = run_cli("-c", db, "--once", cwd=folder)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    ms = r"\d+\.\d\dms"
    assert any(
        re.fullmatch(rf"{TIME} INFO Completed task {ok} \(ok, {ms}, attempt 1/25\) with success", x)
        for x in lines
    ), result.stderr
    [retried] = [i for i, x in enumerate(lines) if f"Failed task {retry} " in x]
    assert re.fullmatch(
        rf"{TIME} ERROR Failed task {retry} \(bad, {ms}, attempt 1/25\) with error "
        r"'ValueError: boom'; retrying in 3s",
        lines[retried],
    ), lines[retried]
    # The traceback follows, ending with the error.
    assert lines[retried + 1] == "Traceback (most recent call last):"
    assert "ValueError: boom" in lines[retried + 2 : retried + 12]
    [permanent] = [x for x in lines if f"Failed task {last} " in x]
    assert permanent.endswith(
        f"(bad, {permanent.split(', ')[1]}, attempt 1/1) with error 'ValueError: boom'; "
        "no attempts left: failed permanently"
    )
    assert not any("a detail" in x for x in lines)  # debug is off


async def test_no_log_success_keeps_failures(utils: WorkerUtils, db: str, folder: Path) -> None:
    _, retry, _ = await _add_outcomes(utils)
    result = run_cli("-c", db, "--once", cwd=folder, env={"NO_LOG_SUCCESS": "1"})
    assert result.returncode == 0, result.stderr
    assert "Completed task" not in result.stderr
    assert f"Failed task {retry} (bad" in result.stderr
    assert "working on 1" in result.stderr  # the task's own lines stay


async def test_json_lines(utils: WorkerUtils, db: str, folder: Path) -> None:
    ok, retry, last = await _add_outcomes(utils)
    result = run_cli("-c", db, "--once", "--log-format", "json", cwd=folder)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stderr.splitlines()]  # every line is JSON
    for record in records:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["time"])
        assert record["level"] in ("info", "warning", "error")
        assert record["logger"].startswith("graphile_worker")
    by_job = {
        r["job_id"]: r for r in records if r["logger"] == "graphile_worker.worker" and "job_id" in r
    }

    success = by_job[ok]
    pool_id, worker_id = success.pop("pool_id"), success.pop("worker_id")
    assert pool_id.startswith("pool-") and worker_id.startswith("worker-")
    duration = success.pop("duration_ms")
    assert isinstance(duration, float) and 0 <= duration < 10_000
    del success["time"]
    assert success == {
        "level": "info",
        "logger": "graphile_worker.worker",
        "message": f"Completed task {ok} (ok, {duration:.2f}ms, attempt 1/25) with success",
        "job_id": ok,
        "task_identifier": "ok",
        "queue_name": None,
        "attempt": 1,
        "max_attempts": 25,
    }

    failure = by_job[retry]
    assert (failure["level"], failure["task_identifier"], failure["attempt"]) == ("error", "bad", 1)
    assert (failure["error"], failure["permanent"], failure["retry_in_s"]) == (
        "ValueError: boom",
        False,
        2.718,
    )
    assert failure["exception"].startswith("Traceback (most recent call last):")
    assert failure["exception"].endswith("ValueError: boom")
    assert failure["message"].endswith("with error 'ValueError: boom'; retrying in 3s")
    final = by_job[last]
    assert (final["permanent"], final["retry_in_s"], final["max_attempts"]) == (True, None, 1)

    [task_line] = [r for r in records if r["logger"] == "graphile_worker.job"]
    assert task_line["message"].endswith("working on 1")
    assert (task_line["job_id"], task_line["task_identifier"], task_line["worker_id"]) == (
        ok,
        "ok",
        worker_id,
    )
    assert (task_line["attempt"], task_line["max_attempts"], task_line["colour"]) == (1, 25, "blue")


def test_json_from_the_environment_and_bad_format(db: str, folder: Path) -> None:
    result = run_cli("-c", db, "--once", cwd=folder, env={"GRAPHILE_WORKER_LOG_FORMAT": "json"})
    assert result.returncode == 0, result.stderr
    assert all(json.loads(line)["message"] for line in result.stderr.splitlines())
    bad = run_cli("-c", db, "--once", "--log-format", "xml", cwd=folder)
    assert bad.returncode == 2
    assert "Invalid value for '--log-format'" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize(
    "setting,shown", [("1", True), ("true", True), ("0", False), ("", False), (None, False)]
)
def test_graphile_logger_debug(db: str, folder: Path, setting: str | None, shown: bool) -> None:
    rows(db, "select graphile_worker.add_job('ok', '{\"n\": 7}')")
    env = {} if setting is None else {"GRAPHILE_LOGGER_DEBUG": setting}
    result = run_cli("-c", db, "--once", cwd=folder, env=env)
    assert result.returncode == 0, result.stderr
    debug = [line for line in result.stderr.splitlines() if " DEBUG " in line]
    if not shown:
        assert debug == []
        return
    assert any(
        re.search(r"DEBUG Worker worker-\w+: running job 1 \(ok, attempt 1/25\)", x) for x in debug
    )
    assert any(re.search(r"DEBUG \[job\(worker-\w+: ok\{1\}\)\] a detail$", x) for x in debug)
    assert any("DEBUG Job 1 (ok): result recorded" in x for x in debug)
    assert any(re.search(r"DEBUG Worker pool pool-\w+: connected", x) for x in debug)
    # Only graphile-worker's loggers: no psycopg or asyncio debug lines.
    assert all(re.search(r"DEBUG (Worker|Job|\[job)", x) for x in debug), debug


async def test_library_logging_follows_logger_levels(
    utils: WorkerUtils, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    ok = (await utils.add_job("ok", {})).id
    bad = (await utils.add_job("bad", {})).id

    async def succeed(payload: Any, helpers: Helpers) -> None:
        pass

    async def fail(payload: Any, helpers: Helpers) -> None:
        raise ValueError("boom")

    caplog.set_level(logging.INFO)
    logging.getLogger("graphile_worker.worker").setLevel(logging.WARNING)
    try:
        await run_once(db, task_list={"ok": succeed, "bad": fail}, no_handle_signals=True)
    finally:
        logging.getLogger("graphile_worker.worker").setLevel(logging.NOTSET)
    messages = [r.getMessage() for r in caplog.records if r.name == "graphile_worker.worker"]
    assert not any(f"Completed task {ok} " in m for m in messages)
    [failure] = [r for r in caplog.records if f"Failed task {bad} " in r.getMessage()]
    fields = failure.__dict__
    assert (fields["job_id"], fields["task_identifier"], fields["attempt"]) == (bad, "bad", 1)


# --- --once progress ------------------------------------------------------------

PROGRESS = re.compile(r"Progress: ([\d,]+) jobs done \(([\d,.]+)/s\), ([\d,]+) remaining$")


async def test_once_logs_progress_then_a_total(utils: WorkerUtils, db: str, folder: Path) -> None:
    # 40 jobs of at least 50 ms, one at a time. The first to run (priority -1)
    # waits until a progress line has been logged, the last (priority 1) until
    # one shows it running with nothing left: lines before, during and after the work.
    first, last = folder / "first.gate", folder / "last.gate"
    await utils.add_jobs(
        [{"identifier": "slow", "payload": {"gate": str(first)}, "priority": -1}]
        + [{"identifier": "slow", "payload": {"n": n}, "priority": 0} for n in range(38)]
        + [{"identifier": "slow", "payload": {"gate": str(last)}, "priority": 1}]
    )
    log = folder / "worker.log"
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL" and not k.startswith("PG")}
    with log.open("w") as out:
        proc = await asyncio.create_subprocess_exec(
            cli_path(), "-c", db, "--once", "--progress-interval", "0.25",
            cwd=folder, env={**env, "NO_LOG_SUCCESS": "1"}, stderr=out,
        )  # fmt: skip

    def progress() -> list[tuple[int, float, int]]:
        return [
            (int(d.replace(",", "")), float(r.replace(",", "")), int(left.replace(",", "")))
            for line in log.read_text().splitlines()
            if (match := PROGRESS.search(line))
            for d, r, left in [match.groups()]
        ]

    def a_line_logged() -> bool:
        return bool(progress())

    def last_job_running() -> bool:  # 39 done, nothing left to fetch
        return any((d, left) == (39, 0) for d, _, left in progress())

    try:
        for gate, logged in ((first, a_line_logged), (last, last_job_running)):
            async with asyncio.timeout(60):
                while not logged():
                    assert proc.returncode is None, log.read_text()
                    await asyncio.sleep(0.02)
            gate.touch()
        async with asyncio.timeout(60):
            assert await proc.wait() == 0, log.read_text()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    stderr = log.read_text()
    lines = progress()
    done = [d for d, _, _ in lines]
    remaining = [left for _, _, left in lines]
    assert done[0] == 0 and done[-1] >= 39, stderr
    assert done == sorted(done) and remaining == sorted(remaining, reverse=True), stderr
    assert remaining[0] > remaining[-1] == 0, stderr
    # Jobs done + due jobs left never exceed the 40 (the rest are in hand).
    assert all(d + left <= 40 for d, _, left in lines), stderr
    # The rate of an interval: 0 when no job was done in it, else positive, and at
    # most what jobs of >= 50 ms one at a time allow: n jobs end at least 50 ms
    # apart, so n <= 1 + t / 0.05 in an interval of t >= 0.25 s: n / t <= 24
    # (shown rounded to 0.1).
    for before, (d, rate, _) in zip([0, *done], lines, strict=False):
        assert (rate == 0) if d == before else (0 < rate <= 24.05), stderr
    assert re.search(r"INFO Done: 40 jobs in \d+\.\d\ds \([\d.]+/s\)$", stderr.rstrip())


async def test_progress_in_json_and_off(utils: WorkerUtils, db: str, folder: Path) -> None:
    await utils.add_jobs([{"identifier": "slow", "payload": {}} for _ in range(12)])
    result = run_cli(
        "-c", db, "--once", "--log-format", "json", cwd=folder,
        env={"NO_LOG_SUCCESS": "1", "GRAPHILE_WORKER_PROGRESS_INTERVAL": "0.2"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stderr.splitlines()]
    progress = [r for r in records if r["message"].startswith("Progress:")]
    assert progress, result.stderr
    for record in progress:
        assert record["logger"] == "graphile_worker.progress"
        assert record["pool_id"].startswith("pool-")
        assert isinstance(record["jobs_done"], int) and isinstance(record["jobs_remaining"], int)
        assert record["jobs_done"] + record["jobs_remaining"] <= 12
    [total] = [r for r in records if r["message"].startswith("Done:")]
    assert total["jobs_done"] == 12

    await utils.add_jobs([{"identifier": "slow", "payload": {}} for _ in range(12)])
    quiet = run_cli("-c", db, "--once", "--progress-interval", "0", cwd=folder)
    assert quiet.returncode == 0
    assert "Progress:" not in quiet.stderr and "Done:" not in quiet.stderr
    bad = run_cli("-c", db, "--once", "--progress-interval", "-1", cwd=folder)
    assert bad.returncode == 2 and "Invalid value for '--progress-interval'" in bad.stderr
