"""Plain ``def`` tasks declared ``@task_options(process=True)`` run in the
worker's child processes: results, errors and crashes come back to their job
alone; a timeout, a cancel request and a forced stop kill the child (another
replaces it); a graceful stop lets the running job finish; limits apply at the
fetch; helpers.logger and helpers.progress reach the worker. Every test runs
the CLI worker as a user does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dbhelpers import cli_path, rows, run_cli, value
from fault_helpers import Worker, kill_leftover_workers, started_worker, wait_until

from worker_cli import TaskLoadError, task_options
from worker_cli.tasks.loader import make_task_list
from worker_cli.testing import run_jobs

pytestmark = pytest.mark.db

HISTORY = "graphile_worker._private_py_job_history"
JOBS = "graphile_worker._private_jobs"
ERRORS = "graphile_worker._private_py_job_errors"

#: One process task; payload["do"] says what it does.
CPU_TASK = """\
import multiprocessing, os, signal, threading, time
from pathlib import Path
from worker_cli import Cancel, ProcessDied, RetryPolicy, Snooze, task_options


@task_options(process=True{options})
def task(payload, helpers):
    do = payload["do"]
    # Written whole, then renamed: a test that sees the file can read the pid
    # (the process may be killed right after).
    Path(f"pid-{{helpers.job.id}}.part").write_text(str(os.getpid()))
    os.replace(f"pid-{{helpers.job.id}}.part", f"pid-{{helpers.job.id}}")
    if do == "where":
        helpers.logger.info("counted %s in %s", 3, "a process")
        helpers.progress(3, 4, message="three of four")
        return {{"in_child": multiprocessing.parent_process() is not None, "sum": sum(range(10))}}
    if do == "raise":
        raise ValueError("boom in child")
    if do == "exit":
        os._exit(7)
    if do == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if do == "segfault":
        import ctypes
        ctypes.string_at(0)
    if do == "lock":
        return threading.Lock()
    if do == "set":
        return {{1, 2}}
    if do == "query":
        return helpers.query("select 1")
    if do == "snooze":  # what it raises comes back as it was raised
        raise Snooze(600)
    if do == "cancel":
        raise Cancel("not wanted")
    if do == "spin":  # a pure-Python loop that never looks at its helpers
        while True:
            pass
    if do == "wait":  # until the test creates the file "go"
        while not Path("go").exists():
            time.sleep(0.01)
        return "finished"
    if do == "busy":  # a while of CPU, noting how many run at once
        Path(f"running-{{helpers.job.id}}").touch()
        most = len(list(Path(".").glob("running-*")))
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            most = max(most, len(list(Path(".").glob("running-*"))))
        Path(f"running-{{helpers.job.id}}").unlink()
        return most
    return do
"""


#: A process task with a typed payload: typed in its process, as in a thread.
TYPED_TASK = """\
from dataclasses import dataclass
from worker_cli import task_options


@dataclass
class Order:
    n: int


@task_options(process=True)
def task(payload: Order, helpers):
    return {"twice": payload.n * 2, "typed": isinstance(payload, Order)}
"""


def write_task(folder: Path, options: str = "") -> Path:
    (folder / "tasks").mkdir(exist_ok=True)
    (folder / "tasks" / "cpu.py").write_text(CPU_TASK.format(options=options))
    return folder


def add(db: str, do: str, *, priority: int = 0, max_attempts: int = 1) -> int:
    return int(
        value(
            db,
            "select (graphile_worker.add_job('cpu', %s::json, priority := %s,"
            " max_attempts := %s)).id",
            (json.dumps({"do": do}), priority, max_attempts),
        )
    )


def once(db: str, folder: Path, *args: str) -> str:
    result = run_cli("-c", db, "--once", "--job-logs", "all", *args, cwd=folder, timeout=90)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stderr + result.stdout


def outcome(db: str, job_id: int) -> dict[str, Any]:
    """The job's history row, or its row in the queue (failed), read in one
    statement (one snapshot: the job is in one or the other)."""
    [row] = rows(
        db,
        f"select (select row_to_json(h) from (select state, result, result_error from {HISTORY}"
        f" where job_id = %(id)s) h) as done, (select row_to_json(j) from (select last_error,"
        f" attempts, locked_by from {JOBS} where id = %(id)s) j) as live",
        {"id": job_id},
    )
    if row["done"] is not None:
        return dict(row["done"])
    return {"state": "failed", **row["live"]}


def pid_of(folder: Path, job_id: int) -> int:
    return int((folder / f"pid-{job_id}").read_text())


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and "zombie" not in _status(pid)


def _status(pid: int) -> str:
    try:
        return (Path(f"/proc/{pid}") / "status").read_text().lower()
    except OSError:
        return "zombie"


@pytest.fixture(autouse=True)
def _no_leftover_workers(tmp_path: Path) -> Any:
    yield
    kill_leftover_workers()
    # A task's process a failed test left behind (a "pid-N.part" is one that
    # was killed before it had written its pid whole).
    for pid_file in tmp_path.glob("pid-*"):
        if pid_file.suffix == ".part":
            continue
        pid = int(pid_file.read_text())
        if pid != os.getpid() and alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_results_errors_and_crashes_come_back_to_their_job_alone(db: str, tmp_path: Path) -> None:
    folder = write_task(tmp_path)
    (folder / "tasks" / "typed.py").write_text(TYPED_TASK)
    typed = int(value(db, "select (graphile_worker.add_job('typed', '{\"n\": 21}')).id"))
    # The crashes first: both processes die, and their replacements run the rest.
    exit_id = add(db, "exit", priority=-2)
    kill_id = add(db, "sigkill", priority=-2)
    segfault_id = add(db, "segfault", priority=-2)
    where = [add(db, "where", priority=-1) for _ in range(4)]
    raise_id, lock_id, set_id, query_id, snooze_id, cancel_id = (
        add(db, do) for do in ("raise", "lock", "set", "query", "snooze", "cancel")
    )
    log = once(db, folder, "-j", "2", "--processes", "2")

    for job_id in where:
        done = outcome(db, job_id)
        assert done["state"] == "succeeded", done
        assert done["result"] == {"in_child": True, "sum": 45}
    pids = {pid_of(folder, job_id) for job_id in where}
    assert not pids & {pid_of(folder, i) for i in (exit_id, kill_id, segfault_id)}

    failed = outcome(db, exit_id)
    assert failed["state"] == "failed" and failed["locked_by"] is None
    assert failed["last_error"].startswith("ProcessDied: the worker process (pid ")
    assert failed["last_error"].endswith("running the job exited with code 7")
    assert "was killed by SIGKILL (signal 9)" in outcome(db, kill_id)["last_error"]
    assert "was killed by SIGSEGV (signal 11)" in outcome(db, segfault_id)["last_error"]

    assert outcome(db, raise_id)["last_error"] == "ValueError: boom in child"
    [error] = rows(db, f"select traceback from {ERRORS} where job_id = %s", (raise_id,))
    assert 'tasks/cpu.py", line' in error["traceback"]  # the child's frames
    assert 'raise ValueError("boom in child")' in error["traceback"]

    unpicklable = outcome(db, lock_id)["last_error"]
    assert "return value cannot be sent back from its worker process" in unpicklable
    assert "cannot pickle '_thread.lock' object" in unpicklable
    # A return value JSON cannot hold: as in a thread (succeeded, without it).
    encoded = outcome(db, set_id)
    assert encoded["state"] == "succeeded" and "not JSON" in encoded["result_error"]
    assert outcome(db, query_id)["last_error"].startswith(
        "HelperUnavailable: helpers.query is not available to a task run in a worker process"
    )

    assert outcome(db, typed)["result"] == {"twice": 42, "typed": True}
    [snoozed] = rows(
        db,
        f"select attempts, last_error, run_at > now() + interval '500 seconds' as later "
        f"from {JOBS} where id = %s",
        (snooze_id,),
    )
    assert snoozed == {"attempts": 0, "last_error": None, "later": True}
    assert (
        value(
            db,
            f"select cancel_reason from {HISTORY} where job_id = %s and state = 'cancelled'",
            (cancel_id,),
        )
        == "not wanted"
    )
    # helpers.logger's lines: in the worker's log and the attempt's kept lines.
    first = where[0]
    assert f": cpu{{{first}}})] counted 3 in a process" in log
    [kept] = rows(
        db, "select lines from graphile_worker._private_py_job_logs where job_id = %s", (first,)
    )
    assert "counted 3 in a process" in kept["lines"]
    [progress] = rows(
        db,
        "select done, total, message from graphile_worker._private_py_job_progress "
        "where job_id = %s",
        (first,),
    )
    assert (progress["done"], progress["total"], progress["message"]) == (3, 4, "three of four")


def test_a_retry_policy_tells_a_crashed_process_from_an_error(db: str, tmp_path: Path) -> None:
    """A job whose process died is failed with ``worker_cli.ProcessDied``: a
    policy that does not retry it fails that job for good at once, and only
    that one (a task error is retried as usual)."""
    folder = write_task(tmp_path, ", retry=RetryPolicy(dont_retry_on=(ProcessDied,))")
    exit_id = add(db, "exit", max_attempts=3)
    raise_id = add(db, "raise", max_attempts=3)
    once(db, folder, "-j", "2", "--processes", "1")

    crashed = outcome(db, exit_id)
    assert crashed["last_error"].startswith("ProcessDied: the worker process (pid ")
    assert crashed["attempts"] == 3  # failed for good after its one attempt
    retried = outcome(db, raise_id)
    assert retried["last_error"] == "ValueError: boom in child"
    assert retried["attempts"] == 1  # to be tried again


def test_a_timeout_kills_its_process_and_another_takes_its_place(db: str, tmp_path: Path) -> None:
    folder = write_task(tmp_path, ", timeout=0.5")
    spin = add(db, "spin", priority=-1)
    after = add(db, "where")
    # One process: the job after the spinning one needs its replacement.
    once(db, folder, "-j", "2", "--processes", "1")
    failed = outcome(db, spin)
    assert failed["state"] == "failed"
    assert failed["last_error"].startswith("JobTimeout: exceeded 0.5s"), failed
    assert not alive(pid_of(folder, spin))
    assert outcome(db, after)["state"] == "succeeded"
    assert pid_of(folder, after) != pid_of(folder, spin)


def test_a_cancel_request_kills_its_process(db: str, tmp_path: Path) -> None:
    folder = write_task(tmp_path)
    spin = add(db, "spin")
    worker = started_worker(db, Worker(db, folder, "-j", "2", "--processes", "1"))
    wait_until(lambda: (folder / f"pid-{spin}").exists(), 30, "the job to start")
    pid = pid_of(folder, spin)
    assert run_cli("cancel", "-c", db, str(spin), "--reason", "no more").returncode == 0
    wait_until(
        lambda: value(db, f"select state from {HISTORY} where job_id = %s", (spin,)) == "cancelled",
        30,
        "the job to be cancelled",
    )
    wait_until(lambda: not alive(pid), 10, "its process to end")
    after = add(db, "where")  # the replacement runs it
    wait_until(lambda: outcome(db, after)["state"] == "succeeded", 30, "the next job")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.log()[-3000:]


def test_a_process_that_dies_idle_is_replaced_for_the_next_job(db: str, tmp_path: Path) -> None:
    folder = write_task(tmp_path)
    worker = started_worker(db, Worker(db, folder, "-j", "1"))
    ready = "1 worker process(es) ready for process=True tasks (pids "
    wait_until(lambda: ready in worker.log(), 30, "its process to start")
    pid = int(worker.log().split(ready)[1].split(")")[0])
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: "exited with code -9 while idle" in worker.log(), 10, "the worker to see it")
    job_id = add(db, "where")
    wait_until(lambda: outcome(db, job_id)["state"] == "succeeded", 30, "the job")
    assert pid_of(folder, job_id) != pid
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.log()[-3000:]


def test_a_graceful_stop_lets_the_running_job_finish(db: str, tmp_path: Path) -> None:
    folder = write_task(tmp_path)
    job_id = add(db, "wait")
    worker = started_worker(db, Worker(db, folder, "-j", "1"))
    wait_until(lambda: (folder / f"pid-{job_id}").exists(), 30, "the job to start")
    worker.signal(signal.SIGTERM)
    wait_until(lambda: "stopping" in worker.log(), 10, "the stop to begin")
    (folder / "go").touch()
    assert worker.wait(30) == 0, worker.log()[-3000:]
    assert outcome(db, job_id) == {"state": "succeeded", "result": "finished", "result_error": None}
    assert not alive(pid_of(folder, job_id))
    # One per CPU by default, but never more than -j (what may be busy).
    assert "1 worker process(es) ready for process=True tasks" in worker.log()


def test_a_ctrl_c_reaches_the_processes_yet_the_running_job_finishes(
    db: str, tmp_path: Path
) -> None:
    folder = write_task(tmp_path)
    job_id = add(db, "wait")
    # Its own process group (setsid execs it: same pid), as a terminal's job.
    command = ["setsid", cli_path(), "-c", db]
    worker = started_worker(db, Worker(db, folder, "-j", "1", command=command))
    wait_until(lambda: (folder / f"pid-{job_id}").exists(), 30, "the job to start")
    os.killpg(worker.pid, signal.SIGINT)  # the worker and its processes
    wait_until(lambda: "stopping" in worker.log(), 10, "the stop to begin")
    (folder / "go").touch()
    assert worker.wait(30) == 0, worker.log()[-3000:]
    assert outcome(db, job_id) == {"state": "succeeded", "result": "finished", "result_error": None}


def test_a_job_still_running_after_the_graceful_timeout_is_given_back(
    db: str, tmp_path: Path
) -> None:
    folder = write_task(tmp_path)
    job_id = add(db, "spin", max_attempts=3)
    worker = started_worker(db, Worker(db, folder, "-j", "1"))
    wait_until(lambda: (folder / f"pid-{job_id}").exists(), 30, "the job to start")
    worker.signal(signal.SIGTERM)  # 5 s of graceful timeout, then 1 s after abort_signal
    assert worker.wait(30) == 0, worker.log()[-3000:]
    assert "cancelled 1 async job(s) still running" in worker.log()
    assert "did not exit within" not in worker.log()  # killed as its job was given back
    [row] = rows(db, f"select attempts, last_error, locked_by from {JOBS} where id = %s", (job_id,))
    assert row == {"attempts": 0, "last_error": None, "locked_by": None}  # to run again
    assert not alive(pid_of(folder, job_id))


def test_a_forced_stop_kills_the_processes_and_fails_their_jobs(db: str, tmp_path: Path) -> None:
    folder = write_task(tmp_path)
    job_id = add(db, "spin", max_attempts=3)
    worker = started_worker(db, Worker(db, folder, "-j", "1"))
    wait_until(lambda: (folder / f"pid-{job_id}").exists(), 30, "the job to start")
    worker.signal(signal.SIGTERM)
    wait_until(lambda: "stopping" in worker.log(), 10, "the stop to begin")
    worker.signal(signal.SIGINT)
    worker.wait(30)
    failed = outcome(db, job_id)
    assert failed["state"] == "failed" and failed["locked_by"] is None
    assert failed["last_error"] == "RuntimeError: the worker was stopped while the job was running"
    assert "did not exit within" not in worker.log()  # killed as its job was failed
    assert not alive(pid_of(folder, job_id))


def test_limits_apply_to_process_jobs(db: str, tmp_path: Path) -> None:
    folder = write_task(tmp_path)
    rows(db, "select graphile_worker.py_set_limit('task', 'cpu', max_running => 1)")
    jobs = [add(db, "busy") for _ in range(4)]
    once(db, folder, "-j", "4", "--processes", "4")
    assert [outcome(db, job_id)["result"] for job_id in jobs] == [1, 1, 1, 1]


def test_process_true_on_an_async_task_is_one_line_at_load(db: str, tmp_path: Path) -> None:
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "slow.py").write_text(
        "from worker_cli import task_options\n\n"
        "@task_options(process=True)\n"
        "async def task(payload, helpers):\n"
        "    return None\n"
    )
    result = run_cli("-c", db, "--once", cwd=tmp_path)
    assert result.returncode != 0
    assert (
        "task file 'slow.py': process=True is for plain def tasks; this one is async def"
        in result.stderr
    )
    assert "Traceback" not in result.stderr


@pytest.mark.unit
def test_a_process_task_must_be_importable_by_name() -> None:
    @task_options(process=True)
    def local(payload: Any, helpers: Any) -> None:
        return None

    with pytest.raises(TaskLoadError, match=r"task_list\['local'\]: process=True needs a function"):
        make_task_list({"local": local})
    [task] = make_task_list({"top": top_level}).values()
    assert task.is_async and task.location == ("module", __name__, "top_level")


@task_options(process=True)
def top_level(payload: Any, helpers: Any) -> None:
    return None


UNGUARDED = """\
import asyncio, sys
sys.path.insert(0, ".")
import jobs_mod
from worker_cli import run_once

# No `if __name__ == "__main__":`: each process runs this again, and fails.
asyncio.run(run_once(sys.argv[1], task_list={"cpu": jobs_mod.cpu}, no_handle_signals=True))
"""


def test_processes_that_end_as_they_start_fail_the_job_not_hang(db: str, tmp_path: Path) -> None:
    (tmp_path / "jobs_mod.py").write_text(
        "from worker_cli import task_options\n\n"
        "@task_options(process=True)\n"
        "def cpu(payload, helpers):\n"
        "    return 1\n"
    )
    (tmp_path / "worker.py").write_text(UNGUARDED)
    job_id = add(db, "x")
    result = subprocess.run(
        [sys.executable, "worker.py", db], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    error = outcome(db, job_id)["last_error"]
    assert error.startswith("ProcessDied: the worker's processes end as they start (exit code 1")
    assert "if __name__ == '__main__':" in error


def test_run_jobs_runs_a_process_task_in_a_thread(
    db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = write_task(tmp_path)
    monkeypatch.chdir(folder)  # where the task writes
    job_id = add(db, "where")
    [ran] = run_jobs(tasks_dir=folder / "tasks", connection_string=db)
    assert ran.job.id == job_id and ran.state == "succeeded"
    assert ran.result == {"in_child": False, "sum": 45}


CLOSE_FAILS = """\
import asyncio, sys
sys.path.insert(0, ".")
import jobs_mod
from worker_cli import run_once
from worker_cli.worker.pipeline import process_pool


async def close_fails(self, within):
    raise RuntimeError("close never came")


process_pool.ProcessPool.close = close_fails
if __name__ == "__main__":
    asyncio.run(run_once(sys.argv[1], task_list={"cpu": jobs_mod.cpu}, no_handle_signals=True))
"""


def test_processes_never_closed_are_killed_as_the_worker_exits(db: str, tmp_path: Path) -> None:
    (tmp_path / "jobs_mod.py").write_text(
        "from worker_cli import task_options\n\n"
        "@task_options(process=True)\n"
        "def cpu(payload, helpers):\n"
        "    return 1\n"
    )
    (tmp_path / "worker.py").write_text(CLOSE_FAILS)
    add(db, "x")
    # Without the kill, the interpreter's exit would wait for them, and they for it.
    result = subprocess.run(
        [sys.executable, "worker.py", db], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert "RuntimeError: close never came" in result.stderr


def test_a_killed_worker_takes_its_processes_with_it(db: str, tmp_path: Path) -> None:
    folder = write_task(tmp_path)
    spin = add(db, "spin")  # never reads its pipe again
    worker = started_worker(db, Worker(db, folder, "-j", "1"))
    wait_until(lambda: (folder / f"pid-{spin}").exists(), 30, "the job to start")
    worker.proc.kill()
    worker.wait()
    pid = pid_of(folder, spin)
    wait_until(lambda: not alive(pid), 10, "its process to end")
